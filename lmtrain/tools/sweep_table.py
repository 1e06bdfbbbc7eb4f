"""A sweep's table: one row per job (what it ran, how it did) and the markdown table of ``python -m
lmtrain.summarize``; from what runs leave on disk (metrics.csv, run.json, .hydra/).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lmtrain.tools.run_records import RunRecord, run_labels


@dataclass
class SummaryRow:
    """One job of a sweep: what it ran (strategy, sampler, distinguishing options, m) and how it did."""

    run: RunRecord
    strategy: str
    sampler: str
    options: str  # config values that tell this job apart from the others of the sweep (besides m)
    num_samples: int | None
    best_val_ppl: float | None
    test_ppl: float | None
    tokens_per_sec: float | None
    wall_time_s: float | None
    finished: bool
    label: str = ""  # the curve label, as lmtrain.plot labels the run (``run_labels``), without m and the seed


def _job_config(run: RunRecord) -> dict[str, Any]:
    """What the job ran: from run.json (written when a run starts), else from its composed Hydra config."""
    if run.info:
        return {
            "output": run.info.get("output"),
            "output_options": run.info.get("output_options") or {},
            "sampler": run.info.get("sampler") or {},
        }
    config_file, hydra_file = run.path / ".hydra" / "config.yaml", run.path / ".hydra" / "hydra.yaml"
    config = OmegaConf.load(config_file) if config_file.is_file() else OmegaConf.create()
    hydra = yaml.safe_load(hydra_file.read_text()) if hydra_file.is_file() else {}
    choices = ((hydra or {}).get("hydra", {}).get("runtime", {}) or {}).get("choices", {})
    parts = {}
    for key in ("output", "sampler"):  # their interpolations (${seed}, ${model.init_range}) resolve in the config
        node = config.get(key)
        try:
            parts[key] = OmegaConf.to_container(node, resolve=True) if node is not None else {}
        except OmegaConfBaseException:
            parts[key] = OmegaConf.to_container(node, resolve=False)
    output = parts["output"]
    return {
        "output": choices.get("output") or str(output.get("_target_", "?")).rsplit(".", 1)[-1],
        "output_options": {k: v for k, v in output.items() if not k.startswith("_")},
        "sampler": parts["sampler"],
    }


def _options(job: dict[str, Any]) -> dict[str, Any]:
    """Flat output and sampler options of one job, m left out (it is a column and the x axis of its own)."""
    flat = {f"output.{k}": v for k, v in job["output_options"].items() if k != "num_samples"}
    flat.update({f"sampler.{k}": v for k, v in job["sampler"].items() if not k.startswith("_")})
    if job["sampler"].get("_target_"):  # shown where one strategy ran with several proposals
        flat["sampler.proposal"] = str(job["sampler"]["_target_"]).rsplit(".", 1)[-1].removesuffix("Sampler").lower()
    return flat


def _fmt_option(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summarize(runs: Iterable[RunRecord], hide: Iterable[str] = ()) -> list[SummaryRow]:
    """One row per job; ``options`` lists the output/sampler values that differ between the jobs given (except
    the option names in ``hide``, e.g. ``shared_negatives`` when every job drew its negatives the same way)."""
    runs, hide = list(runs), tuple(hide)
    jobs = [_job_config(run) for run in runs]
    options = [_options(job) for job in jobs]
    keys = sorted({k for opts in options for k in opts})
    # an option is shown where it differs between the jobs that have it (strategy names tell the rest apart)
    hidden = {"seed", *hide}
    varying = [k for k in keys if len({repr(o[k]) for o in options if k in o}) > 1 and k.split(".", 1)[1] not in hidden]
    labels = run_labels(runs, ignore=("num_samples", "seed", *hide), distinct=False)  # m: the plots' x axis, panels
    rows = []
    for run, job, opts, label in zip(runs, jobs, options, labels, strict=True):
        metrics = run.info.get("metrics") or {}
        speeds = run.values("tokens_per_sec")
        sampler_target = str(job["sampler"].get("_target_", "")).rsplit(".", 1)[-1]
        num_samples = job["output_options"].get("num_samples")
        wall = run.info.get("wall_time_s")
        rows.append(
            SummaryRow(
                run=run,
                strategy=str(job["output"]),
                sampler=sampler_target or "-",
                options=" ".join(f"{k.split('.', 1)[1]}={_fmt_option(opts[k])}" for k in varying if k in opts),
                num_samples=int(num_samples) if num_samples is not None else None,
                best_val_ppl=metrics.get("val/ppl_best", run.best("val/ppl")),
                test_ppl=metrics.get("test/ppl", run.last("test/ppl")),
                tokens_per_sec=statistics.median(speeds) if speeds else None,
                wall_time_s=float(wall) if wall is not None else None,
                finished=bool(metrics),  # run.json gets its metrics when the run ends
                label=label,
            )
        )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def markdown_table(rows: list[SummaryRow], root: Path | None = None) -> str:
    """A GitHub-markdown table of the jobs; unfinished jobs are marked and keep whatever metrics they logged."""
    header = ["job", "strategy", "sampler", "options", "m", "best val ppl", "test ppl", "tokens/s", "wall time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        job = str(row.run.path.relative_to(root)) if root else row.run.path.name
        cells = [
            job if row.finished else f"{job} (failed or unfinished)",
            row.strategy,
            row.sampler,
            row.options or "-",
            "-" if row.num_samples is None else str(row.num_samples),
            _fmt(row.best_val_ppl, ".2f"),
            _fmt(row.test_ppl, ".2f"),
            _fmt(row.tokens_per_sec, ",.0f"),
            _fmt_time(row.wall_time_s),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
