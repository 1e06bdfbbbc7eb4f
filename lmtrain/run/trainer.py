"""The Lightning Trainer of a run: its callbacks (checkpoints, lmtrain's own, the configured ones), its arguments,
and the checks and defaults that need the data's size (validation interval)."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from lmtrain.common.trainer_options import epoch_batches
from lmtrain.process.signals import GracefulStop
from lmtrain.run.callbacks import EpochSummary, TimedCheckpoint, TrainingTimeLimit, ValidateAtEnd
from lmtrain.run.host_time import NoProfiler
from lmtrain.run.progress import ProgressBar
from lmtrain.run_folder.checkpoints import AtomicCheckpointIO


def build_callbacks(cfg: DictConfig, ckpt_dir: Path, resume: str) -> list[L.Callback]:
    """The best checkpoint by val/ppl first (``train`` reads it back), the periodic last.ckpt (by steps and by
    minutes), lmtrain's callbacks
    (a signal writes last.ckpt too; ``resume``: the command that resumes it) and the configured ones
    (``callbacks.NAME._target_``)."""
    return [
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best-{epoch:02d}",
            monitor="val/ppl",
            mode="min",
            auto_insert_metric_name=False,
            save_last=True,
            enable_version_counter=False,
        ),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            every_n_train_steps=cfg.checkpoint_every_n_steps,
            save_top_k=0,
            save_last=True,
            enable_version_counter=False,
        ),
        TimedCheckpoint(  # by time as well: a short run killed before its first periodic step is resumable too
            dirpath=ckpt_dir,
            train_time_interval=timedelta(minutes=cfg.checkpoint_every_minutes),
            save_top_k=0,
            save_last=True,
            enable_version_counter=False,
        ),
        EpochSummary(),
        ValidateAtEnd(),
        GracefulStop(ckpt_dir / "last.ckpt", resume),
        *([TrainingTimeLimit(cfg.max_train_seconds)] if cfg.get("max_train_seconds") else []),
        *([ProgressBar()] if cfg.progress_bar else []),
        *(instantiate(spec) for spec in (cfg.get("callbacks") or {}).values()),
    ]


def build_trainer(cfg: DictConfig, loggers: list[Logger], callbacks: list[L.Callback], run_dir: Path) -> L.Trainer:
    """``cfg.trainer`` with what lmtrain sets itself: loggers, callbacks, the run folder, atomic checkpoint writes,
    and a profiler that costs nothing per hook unless one was asked for (``+trainer.profiler=simple``)."""
    profiler = {} if cfg.trainer.get("profiler") else {"profiler": NoProfiler()}
    # variable_bptt: each epoch has its own windows, so its own number of batches (lmtrain.data.window_lengths)
    reload = {"reload_dataloaders_every_n_epochs": 1} if cfg.data.get("variable_bptt") else {}
    return instantiate(
        cfg.trainer,
        **profiler,
        **reload,
        logger=loggers,
        callbacks=callbacks,
        default_root_dir=str(run_dir),
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=cfg.progress_bar,
        _convert_="all",
    )


def check_against_data(cfg: DictConfig, windows: int) -> None:
    """What needs the data's size: an integer val_check_interval must fit into an epoch of ``windows`` training
    windows (after limit_train_batches), unless validation counts steps across epochs."""
    interval = cfg.trainer.get("val_check_interval")
    batches = epoch_batches(windows, cfg.trainer.get("limit_train_batches"))
    if isinstance(interval, int) and interval > batches and cfg.trainer.get("check_val_every_n_epoch") is not None:
        raise ValueError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches of an epoch: use "
            "a fraction of the epoch (0.5), or trainer.check_val_every_n_epoch=null to count steps across epochs"
        )


def default_val_check_interval(cfg: DictConfig, windows: int) -> int | None:
    """Enough validations for a curve: a run that ``trainer.max_steps`` ends inside its first epoch (which would
    validate once, at its end) validates about ``VALIDATIONS`` times, every N steps (at least ``MIN_STEPS_BETWEEN``)
    and at its end. Sets and returns ``trainer.val_check_interval`` (in training batches, as Lightning counts);
    None, changing nothing, where the run sets it (or ``check_val_every_n_epoch``) or is longer."""
    trainer = cfg.trainer
    if trainer.get("val_check_interval") is not None or trainer.get("check_val_every_n_epoch") != 1:
        return None
    accumulate = int(trainer.get("accumulate_grad_batches") or 1)
    batches = epoch_batches(windows, trainer.get("limit_train_batches"))
    max_steps = int(trainer.get("max_steps") or -1)
    if not 0 < max_steps < math.ceil(batches / accumulate):  # ValidateAtEnd validates at max_steps
        return None
    every = max(MIN_STEPS_BETWEEN, math.ceil(max_steps / VALIDATIONS)) * accumulate
    if every >= max_steps * accumulate:  # a few steps: the validation at their end is enough
        return None
    trainer.val_check_interval = every
    return every


VALIDATIONS = 10  # validations of a run inside one epoch that sets no trainer.val_check_interval
MIN_STEPS_BETWEEN = 5  # optimizer steps between two of them at least
