"""W&B plumbing: the run's group and job type, its console output, and the end of a run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

# the run folders of the checkpoint this process's run resumed, when another folder (``resumed_from``): their
# wandb/ folders hold the earlier offline segments of its W&B run
EARLIER: list[Path] = []


def wandb_settings(cfg: DictConfig, output_choice: str | None) -> dict[str, Any]:
    """wandb.init arguments: group (cfg.group, else the sweep folder in a multirun) and job type (the strategy)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    group = cfg.get("group")
    if not group and HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        group = "/".join(Path(HydraConfig.get().sweep.dir).parts[-2:])  # e.g. 2026-01-31/12-00-00
    return {
        "group": str(group) if group else None,
        "job_type": output_choice or str(cfg.output._target_).rsplit(".", 1)[-1],
    }


def console_settings(mode: str | None) -> dict[str, Any]:
    """W&B's console output: offline, none (lmtrain prints the run's folder and the `wandb sync` line itself), else
    only what matters (the run's address, warnings). WANDB_SILENT / WANDB_QUIET in the environment decide instead."""
    if "WANDB_SILENT" in os.environ or "WANDB_QUIET" in os.environ:
        return {}
    return {"silent": True} if (mode or "offline") in ("offline", "disabled") else {"quiet": True}


def finish_wandb(exit_code: int = 0) -> Path | None:
    """End this process's W&B run (so a sweep's next job starts its own); its folder when it ran offline."""
    if "wandb" not in sys.modules:  # W&B was never started here
        return None
    import wandb

    run = wandb.run
    if run is None:
        return None
    folder = Path(run.dir).resolve().parent if run.settings.mode == "offline" else None  # run.dir: its files/
    run.finish(exit_code=exit_code)
    return folder


def resumed_from(folders: list[Path]) -> None:
    """The run folders whose wandb/ holds earlier offline segments of this process's run (none: a fresh run, or
    one resumed in its own folder, whose segments lie beside its own)."""
    EARLIER[:] = folders


def sync_line(folder: Path) -> str:
    """The one line that uploads an offline run whose newest segment is ``folder``: ``wandb sync`` with every
    offline segment of the run (a resumed run adds one per start, all under the same run id), oldest first."""
    run_id = folder.name.rsplit("-", 1)[-1]
    places = [folder.parent, *(run / "wandb" for run in EARLIER)]
    found = {p.resolve() for place in places for p in place.glob(f"offline-run-*-{run_id}") if p.is_dir()}
    segments = sorted(found | {folder.resolve()}, key=lambda p: p.name)  # offline-run-YYYYMMDD_HHMMSS-ID
    return f"lmtrain: W&B run saved offline; upload it with: wandb sync {' '.join(map(str, segments))}"
