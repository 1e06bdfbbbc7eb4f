"""What a run reads and leaves in its folder: its name, the checkpoint it resumes, run.json, the result line."""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lmtrain.training.checkpoints import CheckpointError, check_compatible, find_last, read_checkpoint
from lmtrain.training.loggers.metrics_csv import drop_rows_from

log = logging.getLogger("lmtrain")


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


def resolve_ckpt(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> Path | None:
    """The checkpoint a run resumes: none, ``last`` (``find_last``), ``auto`` (this folder's last.ckpt when there is
    one, else a fresh start: a requeued job's command) or a file."""
    own = run_dir / "checkpoints" / "last.ckpt"
    if cfg.ckpt_path == "auto" and own.is_file():
        return own
    if cfg.ckpt_path in (None, "", "auto"):
        if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("*.ckpt")):
            raise CheckpointError(
                f"run folder {run_dir} already holds checkpoints; pass ckpt_path=last to resume it, "
                "or choose another hydra.run.dir (nothing was overwritten)"
            )
        return None
    if cfg.ckpt_path == "last":
        return find_last(run_dir, run_dir.parent.parent, overrides)
    return Path(str(cfg.ckpt_path)).expanduser().resolve()


def resume_command(run_dir: Path, overrides: list[str]) -> str:
    """The command that resumes this run in its folder from its last.ckpt."""
    kept = [o for o in overrides if not o.lstrip("+").startswith(("ckpt_path=", "hydra.run.dir="))]
    return shlex.join(["python", "-m", "lmtrain", *kept, f"hydra.run.dir={shown_path(run_dir)}", "ckpt_path=last"])


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


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
        "threads": torch.get_num_threads(),  # the compute threads threads=auto chose (lmtrain.training.threads)
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


def load_initial_weights(path: Path, module: Any) -> None:
    """``init_from``: ``module`` takes the weights of the checkpoint at ``path`` (its ``state_dict``: the averaged
    weights of a run that averaged), of the same vocabulary, output strategy and weight shapes (options that shape
    no weight, e.g. dropout, may differ); nothing else of that run is taken."""
    kept = {key: module.signature[key] for key in ("num_classes", "output") if key in module.signature}
    try:
        saved = read_checkpoint(path)
        check_compatible(saved, kept, path)
    except CheckpointError as exc:
        raise CheckpointError(str(exc).replace("ckpt_path", "init_from", 1)) from None
    try:
        module.load_state_dict(saved["state_dict"])
    except RuntimeError as exc:  # a missing or unexpected key, another shape
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"init_from {path}: its weights do not fit this model ({detail})") from None
    log.info("starting from the weights of %s", path)


def prepare_resume(ckpt: Path, signature: dict[str, Any], run_dir: Path) -> str | None:
    """Check that ``ckpt`` fits this model (``signature``), carry its run's metrics.csv over into ``run_dir`` (a
    copy: the old file is never touched) without the rows the resumed run logs again (``drop_rows_from``), and
    return its W&B run id. Only rank 0 touches metrics.csv (the one that writes it)."""
    saved = read_checkpoint(ckpt)
    check_compatible(saved, signature, ckpt)
    previous_csv, metrics = ckpt.parent.parent / "metrics.csv", run_dir / "metrics.csv"
    if rank_zero_only.rank == 0:
        if previous_csv.is_file() and previous_csv.parent != run_dir:  # keep the history; never touch the old file
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(previous_csv, metrics)
        step = int(saved.get("global_step", 0))
        if metrics.is_file() and (dropped := drop_rows_from(metrics, step)):
            log.info("metrics.csv: %d rows from step %d on, which this run logs again, dropped", dropped, step)
    log.info("resuming from %s", ckpt)
    if ckpt.parent.name == "checkpoints" and ckpt.parent.parent != run_dir:
        log.info(
            "the run goes on in the new folder %s (its metrics.csv copied there, the same W&B run), not in %s: "
            "its best checkpoint so far stays there; hydra.run.dir=%s ckpt_path=last goes on in that folder",
            shown_path(run_dir),
            shown_path(ckpt.parent.parent),
            shown_path(ckpt.parent.parent),
        )
    return saved["lmtrain"].get("wandb_id")


def result_line(metrics: dict[str, float], run_dir: Path) -> str:
    """'lmtrain: val ppl 227.52, test ppl 219.03 — outputs/2026-11-23/15-00-00': best validation, test, folder."""
    val, test = metrics.get("val/ppl_best", metrics.get("val/ppl")), metrics.get("test/ppl")
    parts = [f"{label} {value:.2f}" for label, value in (("val ppl", val), ("test ppl", test)) if value is not None]
    return f"lmtrain: {', '.join(parts) or 'no validation or test'} — {shown_path(run_dir)}"
