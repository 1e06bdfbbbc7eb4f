"""Sweep reports: find the jobs of a multirun folder, tabulate them in markdown, plot perplexity curves.

Used by ``scripts/summarize.py``; reads only what runs leave on disk (metrics.csv, run.json, .hydra/).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lmtrain.results import RunRecord, load_run


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

    @property
    def label(self) -> str:
        """The curve label: the strategy and its distinguishing options."""
        return f"{self.strategy} {self.options}".strip()


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(root: str | Path) -> list[RunRecord]:
    """Every job folder under ``root`` (holding metrics.csv or .hydra/), in job order; unfinished jobs included."""
    root = Path(root)
    folders = set()
    for here, dirs, files in os.walk(root, followlinks=True):  # symlinked run folders count: pick runs by linking
        if "metrics.csv" in files or ".hydra" in dirs:
            folders.add(Path(here))
        dirs[:] = [d for d in dirs if d != "wandb" and d != ".hydra"]
    runs = []
    for folder in sorted(folders, key=_natural_key):
        if (folder / "metrics.csv").is_file():
            runs.append(load_run(folder))
        else:  # failed before its first logged step
            runs.append(RunRecord(path=folder, name=folder.name))
    return runs


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
    runs = list(runs)
    jobs = [_job_config(run) for run in runs]
    options = [_options(job) for job in jobs]
    keys = sorted({k for opts in options for k in opts})
    # an option is shown where it differs between the jobs that have it (strategy names tell the rest apart)
    hidden = {"seed", *hide}
    varying = [k for k in keys if len({repr(o[k]) for o in options if k in o}) > 1 and k.split(".", 1)[1] not in hidden]
    rows = []
    for run, job, opts in zip(runs, jobs, options, strict=True):
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


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ppl_vs_samples(rows: list[SummaryRow], path: str | Path, metric: str = "test") -> Path:
    """Test perplexity (``metric="val"``: best validation perplexity; best val where a run has no test) against m,
    one line per sampler, log x.

    Strategies without samples (full softmax) are drawn as horizontal reference lines, as in Blanc & Rendle Fig. 2.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    use_test = metric == "test" and any(r.test_ppl is not None for r in rows)
    score = [(r, r.test_ppl if use_test else r.best_val_ppl) for r in rows]
    score = [(r, s) for r, s in score if r.finished and s is not None and math.isfinite(s)]  # final values only
    for label in sorted({r.label for r, _ in score if r.num_samples is not None}):
        points = [(r.num_samples, s) for r, s in score if r.label == label and r.num_samples is not None]
        sizes = sorted({m for m, _ in points})
        means = [statistics.mean(s for m, s in points if m == size) for size in sizes]  # repeated runs (seeds)
        (line,) = ax.plot(sizes, means, marker="o", label=label)
        if len(points) > len(sizes):
            ax.scatter([m for m, _ in points], [s for _, s in points], s=12, color=line.get_color(), alpha=0.5)
    references = [(r, s) for r, s in score if r.num_samples is None]
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]  # several references (full, hsm, adaptive) must stay apart
    for i, (r, s) in enumerate(references):
        shade = str(0.15 + 0.45 * i / max(len(references) - 1, 1))  # dark to mid gray
        ax.axhline(s, ls=styles[i % len(styles)], lw=1.2, color=shade, label=f"{r.label} (no m): {s:,.0f}")
    ax.set(xscale="log", yscale="log", xlabel="number of samples m", title="perplexity against sample size")
    sizes = sorted({r.num_samples for r, _ in score if r.num_samples is not None})
    if sizes:  # label the m values of the sweep, not powers of ten
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_ylabel("test perplexity" if use_test else "best validation perplexity")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    return save_figure(fig, path, plt)


def validated_within_epochs(runs: Iterable[RunRecord]) -> bool:
    """Whether some run was validated several times per epoch (trainer.val_check_interval): then validation
    curves are plotted against the optimizer step rather than the epoch."""
    return any(
        len({e for _, e, _ in r.series["val/ppl"]}) < len(r.series["val/ppl"]) for r in runs if r.series.get("val/ppl")
    )


def val_curve(run: RunRecord, by_step: bool) -> tuple[list[int], list[float]]:
    """x (step or epoch, 1-based) and validation perplexity of a run."""
    val = run.series.get("val/ppl", [])
    return [(s if by_step else e) + 1 for s, e, _ in val], [v for _, _, v in val]


def plot_val_curves(rows: list[SummaryRow], path: str | Path) -> Path:
    """Validation perplexity per epoch (or per step), one line per strategy, one panel per m (RF-softmax, Fig. 3)."""
    plt = pyplot()
    curves = [r for r in rows if r.run.series.get("val/ppl")]
    sizes = sorted({r.num_samples for r in curves if r.num_samples is not None}) or [None]
    by_step = validated_within_epochs([r.run for r in curves])
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False)
    xlabel = "optimizer step" if by_step else "epochs trained"
    for ax, m in zip(axes[0], sizes, strict=True):
        for row in curves:
            if row.num_samples in (m, None):
                ls = "--" if row.num_samples is None else "-"
                ax.plot(*val_curve(row.run, by_step), ls=ls, marker="o", label=row.label)
        ax.set(xlabel=xlabel, ylabel="validation perplexity (exact)", yscale="log")
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.set_title("all runs" if m is None else f"m = {m}")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    return save_figure(fig, path, plt)


def save_figure(fig: Any, path: str | Path, plt: Any) -> Path:
    """Lay out, write (creating the folder) and close ``fig``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # with a legend placed outside the axes
    plt.close(fig)
    return out


def offline_wandb_runs(root: str | Path) -> list[Path]:
    """W&B offline run folders under ``root`` (to upload with ``wandb sync``)."""
    return sorted(Path(root).glob("**/wandb/offline-run-*"), key=_natural_key)
