"""What a training run writes besides the exact evaluation: the loss at every step, the perplexity, learning
rate and throughput every ``trainer.log_every_n_steps`` steps, all in Lightning's rows of metrics.csv, and with
each validation the training seconds so far (``train/seconds``), the clock of ``max_train_seconds``."""

from __future__ import annotations

import time

import lightning as L
from torch import Tensor


class StepMetrics(L.LightningModule):
    """The LightningModule base that writes the per-step training metrics (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._clock: float | None = None  # training_seconds() when tokens_per_sec was last written
        self._tokens = 0  # training tokens since then
        self._loss_sum, self._loss_steps = 0.0, 0  # training loss since the last validation (EpochSummary)
        self._trained: tuple[int, int] | None = None  # (epoch, step) of the last training step: labels the test row
        self.train_seconds = 0.0  # time in training so far, validation and its checkpoints left out (resumed too)
        self._segment: float | None = None  # when the current stretch of training started
        self._run_tokens, self._run_from = 0, 0.0  # this session's training tokens, training_seconds() at its start

    def _write_loss(self, loss: float) -> None:
        """train/loss to every logger at every step. Lightning writes what ``self.log`` collects only every
        ``log_every_n_steps``; this row carries Lightning's labels for the step (its 0-based index, which is the
        global step before the optimizer step, and the epoch), so that metrics.csv merges both into one row."""
        self._loss_sum, self._loss_steps = self._loss_sum + loss, self._loss_steps + 1
        self._trained = (self.current_epoch, self.global_step)
        for logger in self.loggers:
            logger.log_metrics({"train/loss": loss, "epoch": self.current_epoch}, step=self.global_step)

    def take_mean_train_loss(self) -> float | None:
        """The mean training loss since the previous call (None without training steps since then)."""
        if not self._loss_steps:
            return None
        mean = self._loss_sum / self._loss_steps
        self._loss_sum, self._loss_steps = 0.0, 0
        return mean

    def _log_step_metrics(self, loss: Tensor, tokens: int, loss_is_nll: bool) -> None:
        """Perplexity (when the loss is the exact NLL), learning rate and throughput, on the steps whose metrics
        Lightning writes: each ``self.log`` call costs milliseconds in Lightning, more than a small model's step
        can spare."""
        self._tokens += tokens
        self._run_tokens += tokens
        if not writes_step_metrics(self.trainer):
            return
        if loss_is_nll:  # only then is exp(loss) a perplexity
            self.log("train/ppl", loss.detach().exp(), on_step=True, on_epoch=False, prog_bar=True)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        now = self.training_seconds()
        if self._clock is not None:  # mean over the steps since the last write (validation time left out)
            self.log("tokens_per_sec", self._tokens / (now - self._clock), on_step=True, on_epoch=False)
        self._clock, self._tokens = now, 0

    def training_seconds(self) -> float:
        """Seconds spent training so far (this process and the runs it resumed), validation left out."""
        running = time.perf_counter() - self._segment if self._segment is not None else 0.0
        return self.train_seconds + running

    def mean_tokens_per_sec(self) -> float | None:
        """Training tokens per second over this session's training so far (validation left out), None before a
        step: the run's mean, beside ``tokens_per_sec`` (the last ``log_every_n_steps`` window)."""
        seconds = self.training_seconds() - self._run_from
        return self._run_tokens / seconds if self._run_tokens and seconds > 0 else None

    def on_train_start(self) -> None:
        self._run_tokens, self._run_from = 0, self.training_seconds()
        self._segment = time.perf_counter()

    def on_train_end(self) -> None:
        self.train_seconds, self._segment = self.training_seconds(), None

    def on_validation_start(self) -> None:  # validation and the checkpoints it writes are not training time
        if self._segment is not None:
            self.train_seconds, self._segment = self.training_seconds(), None

    def on_validation_end(self) -> None:
        if self.trainer.state.fn == "fit":
            self._segment = time.perf_counter()

    def _label_test_row(self) -> None:
        """Put the test metrics in the row of the last training step: Lightning would label them with the epoch
        after the last one (an epoch that max_steps ended counts as done) and the number of steps."""
        if self._trained is not None:
            epoch, step = self._trained
            self.log("epoch", float(epoch), sync_dist=False)
            self.log("step", float(step), sync_dist=False)


def writes_step_metrics(trainer: L.Trainer) -> bool:
    """Whether Lightning writes on_step metrics at this training step (every ``log_every_n_steps``).

    Read from Lightning's logger connector; a Lightning without it gets every step logged."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True) or trainer.fast_dev_run)
