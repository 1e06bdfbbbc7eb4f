"""Small Lightning callbacks: a one-line summary per validation, validation at the end of a short run, a training
time limit, and the progress bar."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

log = logging.getLogger("lmtrain")


class EpochSummary(L.Callback):
    """Logs one readable line per validation: epoch (from 0, as everywhere), steps done, exact val perplexity,
    mean training loss since the previous validation, lr and throughput (the last logging window's, and the run's
    mean)."""

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        mean_loss = module.take_mean_train_loss() if hasattr(module, "take_mean_train_loss") else None
        if not trainer.is_global_zero:  # one line per validation under DDP (rank 0's loss, as in the logs)
            return
        m = trainer.callback_metrics
        parts = [f"epoch {trainer.current_epoch}", f"{trainer.global_step} steps"]
        if "val/ppl" in m:
            parts.append(f"val/ppl {float(m['val/ppl']):.2f}")
        if mean_loss is not None:
            parts.append(f"train/loss {mean_loss:.4f}")
        for key, fmt in (("lr", "{:.4g}"), ("tokens_per_sec", "{:,.0f}")):
            if key in m:
                parts.append(f"{key} " + fmt.format(float(m[key])))
        mean = module.mean_tokens_per_sec() if hasattr(module, "mean_tokens_per_sec") else None
        if mean is not None:  # the last window's rate above, the run's mean here
            parts.append(f"mean tokens_per_sec {mean:,.0f}")
        log.info(" | ".join(parts))


class ValidateAtEnd(L.Callback):
    """Validation also when ``trainer.max_steps`` ends training inside an epoch, so that every run ends with a
    val/ppl and a best checkpoint. Lightning validates when ``should_stop`` is set (as after early stopping)."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class TrainingTimeLimit(L.Callback):
    """Ends training once the module has trained for ``seconds`` (``max_train_seconds``; validation and checkpoint
    time left out, resumed time counted), then validates as ``ValidateAtEnd`` does, so that strategies can be
    compared at equal training time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        over = module.training_seconds() >= self.seconds
        if trainer.strategy.reduce_boolean_decision(over, all=False):  # every rank stops at the same step
            trainer.should_stop = True


class ProgressBar(TQDMProgressBar):
    """Lightning's progress bar without the logger's version number, and with the epoch and its length also after
    resuming mid-epoch (Lightning does not call ``on_train_epoch_start`` then, which sets them)."""

    def get_metrics(self, trainer: L.Trainer, module: L.LightningModule) -> dict[str, int | str | float | dict]:
        items = super().get_metrics(trainer, module)
        items.pop("v_num", None)
        return items

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        super().on_train_start(trainer, module)
        loop = trainer.fit_loop
        if loop.restarted_mid_epoch or loop.restarted_on_epoch_end:
            self.on_train_epoch_start(trainer, module)
            done = loop.epoch_loop.batch_progress.current.processed  # the batches of the checkpoint
            self.train_progress_bar.initial = done  # the rate counts this session's batches only
            self.train_progress_bar.n = done
            self.train_progress_bar.refresh()
