"""The run's loggers: metrics.csv always (its writer: ``lmtrain.run_folder.metrics_csv``), plus the configured ones
(W&B; ``wandb_run.py``: its settings and the end of a W&B run)."""

from __future__ import annotations

import inspect
from pathlib import Path

from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from lmtrain.run.loggers.wandb_run import console_settings, wandb_settings
from lmtrain.run_folder.metrics_csv import MetricsCSVLogger


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
        params = inspect.signature(get_class(spec._target_)).parameters  # a Lightning logger: its arguments
        kwargs = {key: value for key, value in extra.items() if key in params}
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
