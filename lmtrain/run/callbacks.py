"""Small Lightning callbacks: a one-line summary per validation, validation at the end of a short run, a training
time limit, the checkpoint by time; and the number format of the metrics in log lines and the progress bar."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger("lmtrain")

# how a metric is written in the validation line and the progress bar (others: 4 significant digits)
FORMATS = {"val/ppl": "{:.2f}", "test/ppl": "{:.2f}", "train/ppl": "{:.2f}", "train/loss": "{:.4f}"}
FORMATS |= {"val/loss": "{:.4f}", "test/loss": "{:.4f}", "tokens_per_sec": "{:,.0f}"}


def metric_text(key: str, value: float) -> str:
    """``value`` of metric ``key`` as lmtrain writes it everywhere: ``val/ppl`` 1169.85, ``train/loss`` 6.7184."""
    return FORMATS.get(key, "{:.4g}").format(float(value))


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
            parts.append(f"val/ppl {metric_text('val/ppl', m['val/ppl'])}")
        if mean_loss is not None:
            parts.append(f"train/loss {metric_text('train/loss', mean_loss)}")
        for key in ("lr", "tokens_per_sec"):
            if key in m:
                parts.append(f"{key} {metric_text(key, m[key])}")
        mean = module.mean_tokens_per_sec() if hasattr(module, "mean_tokens_per_sec") else None
        if mean is not None:  # the last window's rate above, the run's mean here
            parts.append(f"mean tokens_per_sec {metric_text('tokens_per_sec', mean)}")
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


class TimedCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``train_time_interval`` (``checkpoint_every_minutes``). The steps it writes at depend on
    the clock, so they are off the run's schedule (``LanguageModel.off_schedule``): its checkpoints carry derived
    state as kept, and a run writes the same numbers whenever they fall."""

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key for the same settings: checkpoints written before this subclass existed resume
        # without Lightning's missing-callback warning, and this one's state lands where theirs was
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        with module.off_schedule():
            super().on_train_batch_end(trainer, module, *args)

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        with module.off_schedule():  # Lightning writes last.ckpt again here after a write at the epoch's last step
            super().on_train_epoch_end(trainer, module)

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        with module.off_schedule():
            super().on_validation_end(trainer, module)
