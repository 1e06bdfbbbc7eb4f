"""The run folder's own files and how the run is shown: config.yaml, vocab.tsv and run.json (written when the run
starts, so that a run still training, or killed, has them), the run's name, its final metrics in run.json and the
result line. Checkpoints: ``checkpoints.py``; metrics.csv: the loggers (``lmtrain.run.loggers``), carried over on a
resume by ``resume.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lmtrain.data.vocab import Vocabulary
from lmtrain.run_folder.ckpt_path import shown_path


def hydra_context() -> tuple[str | None, list[str]]:
    """(output choice, task overrides) of the running Hydra app; (None, []) outside one (e.g. in tests)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None, []
    hc = HydraConfig.get()
    return hc.runtime.choices.get("output"), list(hc.overrides.task)


def run_name(cfg: DictConfig, output_choice: str | None, overrides: list[str]) -> str:
    """The W&B / plot label: cfg.name, else the overrides that define the job, else the output strategy."""
    if cfg.get("name"):
        return str(cfg.name)
    shown = [o for o in overrides if not o.startswith(("ckpt_path=", "hydra.", "run_dir="))]
    return ",".join(shown) if shown else (output_choice or cfg.output._target_.rsplit(".", 1)[-1])


def write_start_files(run_dir: Path, cfg: DictConfig, name: str, output_choice: str | None, datamodule: Any) -> None:
    """The files a run leaves in its folder from its start, also if it dies: config.yaml (the resolved config),
    vocab.tsv (what generate and score read text with) and run.json (``write_run_info``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    Vocabulary(datamodule.vocab, datamodule.counts).save(run_dir)
    write_run_info(run_dir, name, output_choice, cfg, datamodule.entropy_rate)


def write_run_info(
    run_dir: Path, name: str, output_choice: str | None, cfg: DictConfig, entropy_rate: float | None = None
) -> None:
    """run.json, written when the run starts: what scripts need to label and tabulate the run without re-resolving
    the config (and, for a synthetic source, ``best_possible_ppl`` = exp(entropy rate)). It is there from the
    start so that a run still training, or killed, is labelled too; its ``metrics`` stay empty until
    ``add_results``."""
    output = OmegaConf.to_container(cfg.output, resolve=True)
    sampler = OmegaConf.to_container(cfg.sampler, resolve=True) if cfg.get("sampler") else None
    info = {
        "name": name,
        "output": output_choice or str(cfg.output._target_).rsplit(".", 1)[-1],
        "output_options": {k: v for k, v in output.items() if not k.startswith("_")},
        "sampler": sampler,
        "data": str(cfg.data.get("name", "")),
        "best_possible_ppl": None if entropy_rate is None else math.exp(entropy_rate),
        "threads": torch.get_num_threads(),  # the compute threads threads=auto chose (lmtrain.process.threads)
        "metrics": {},
        "wall_time_s": None,
    }
    (run_dir / "run.json").write_text(json.dumps(info, indent=2, default=str))


def add_results(run_dir: Path, metrics: dict[str, float], wall_time_s: float) -> None:
    """Put a finished run's final ``metrics`` and ``wall_time_s`` (of this invocation: a resumed run counts from its
    restart) into the run.json that ``write_run_info`` wrote when it started."""
    path = run_dir / "run.json"
    info = json.loads(path.read_text())
    info.update(metrics=metrics, wall_time_s=wall_time_s)
    path.write_text(json.dumps(info, indent=2, default=str))


def result_line(metrics: dict[str, float], run_dir: Path) -> str:
    """'lmtrain: val ppl 227.52, test ppl 219.03 — outputs/2026-11-23/15-00-00': best validation, test, folder."""
    val, test = metrics.get("val/ppl_best", metrics.get("val/ppl")), metrics.get("test/ppl")
    parts = [f"{label} {value:.2f}" for label, value in (("val ppl", val), ("test ppl", test)) if value is not None]
    return f"lmtrain: {', '.join(parts) or 'no validation or test'} — {shown_path(run_dir)}"
