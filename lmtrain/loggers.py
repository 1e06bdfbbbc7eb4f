"""The run's loggers: metrics.csv always, plus the configured ones (W&B), and the end of a W&B run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from lmtrain.build import accepted
from lmtrain.csv_logger import MetricsCSVLogger


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


def build_loggers(
    cfg: DictConfig, run_dir: Path, name: str, resume_id: str | None, output_choice: str | None = None
) -> list[Logger]:
    """A CSV logger (every run leaves run_dir/metrics.csv) plus the configured ones (W&B)."""
    loggers: list[Logger] = [
        MetricsCSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=10**9)
    ]
    for spec in (cfg.get("logger") or {}).values():
        extra = {"name": name, "save_dir": str(run_dir)}
        if resume_id:
            extra.update(id=resume_id, resume="allow")
        kwargs = accepted(spec._target_, extra)
        if issubclass(get_class(spec._target_), WandbLogger):  # passed on to wandb.init through its **kwargs
            kwargs.update(wandb_settings(cfg, output_choice))
            if "settings" not in spec:
                kwargs["settings"] = console_settings(spec.get("mode"))
        logger = instantiate(spec, **kwargs, _convert_="all")
        if isinstance(logger, WandbLogger):
            # Lightning always passes anonymous=None to wandb.init, and W&B warns that the setting has no effect
            if logger._wandb_init.get("anonymous", False) is None:
                del logger._wandb_init["anonymous"]
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))  # the run's resolved config
        loggers.append(logger)
    return loggers


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
