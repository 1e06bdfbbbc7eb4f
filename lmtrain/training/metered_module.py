"""``MeteredModule``, the base of the LightningModule (``LanguageModel``): what a training run writes besides the
exact evaluation. The loss at every step, the perplexity, learning rate and throughput every
``trainer.log_every_n_steps`` steps, all in Lightning's rows of metrics.csv, and with each validation the training
seconds so far (``train/seconds``), the clock of ``max_train_seconds``. The training metrics are computed on the
host from the one loss value a step reads (``MeteredModule._record_step``)."""

from __future__ import annotations

import math
import time

import lightning as L
import torch
from torch import Tensor


class MeteredModule(L.LightningModule):
    """A LightningModule that meters its training: the per-step metrics and the training clock (see the module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._clock: float | None = None  # training_seconds() when tokens_per_sec was last written
        self._tokens = 0  # training tokens since then
        self._loss_sum, self._loss_steps = 0.0, 0  # training loss since the last validation (EpochSummary)
        self._trained: tuple[int, int] | None = None  # (epoch, step) of the last training step: labels the test row
        self.train_seconds = 0.0  # time in training so far, validation and its checkpoints left out (resumed too)
        self._segment: float | None = None  # when the current stretch of training started
        self._run_tokens, self._run_from = 0, 0.0  # this session's training tokens, training_seconds() at its start
        # time.perf_counter() when the loggers last wrote their files (metrics.csv); never yet: the first interval saves
        # (perf_counter counts from an arbitrary point, on Linux the boot: 0.0 would wait out its first hour)
        self._saved_at = -math.inf

    def _record_step(
        self, loss: Tensor, value: float, tokens: int, loss_is_nll: bool, extra: dict[str, float] | None = None
    ) -> None:
        """Write one training step's metrics: train/loss at every step, and perplexity (when the loss is the exact
        NLL), learning rate and throughput every ``log_every_n_steps`` steps (Lightning's steps for on_step metrics).

        ``value`` is ``loss`` read on the host (the step's one host sync, ``step.LossReading``); everything here is
        computed from it on the host, so the step waits for the device nowhere else. The values are those
        ``self.log`` gave before (float32 rounding, exp of the loss in its own dtype), but written straight to the
        loggers in one row labelled as Lightning labels a step (its 0-based index, which is the global step before
        the optimizer step, and the epoch), and put in ``trainer.callback_metrics`` and the progress bar's metrics
        as host values: ``self.log`` costs about a millisecond of host time per call, and Lightning reads every
        logged progress-bar tensor back from the device after each batch, more than a small model's step takes.
        ``extra``: further values of the step read with the loss (the encoder's AR / TAR terms), written as
        ``train/NAME`` beside train/loss."""
        self._loss_sum, self._loss_steps = self._loss_sum + value, self._loss_steps + 1
        epoch, step = self.current_epoch, self.global_step
        self._trained = (epoch, step)
        self._tokens += tokens
        self._run_tokens += tokens
        trainer = self.trainer
        metrics = {"train/loss": host_scalar(value, loss.dtype)}
        metrics.update({f"train/{name}": host_scalar(read) for name, read in (extra or {}).items()})
        interval = trainer.log_every_n_steps
        if (interval and (step + 1) % interval == 0) or trainer.fast_dev_run:
            metrics.update(self._interval_metrics(value, loss.dtype, loss_is_nll))
        trainer.callback_metrics.update(metrics)
        row = {name: tensor.tolist() for name, tensor in metrics.items()}  # host tensors: no device read
        if trainer.progress_bar_callback is not None:
            trainer.progress_bar_metrics.update({k: v for k, v in row.items() if k in PROGRESS_BAR})
        for logger in self.loggers:
            logger.log_metrics({**row, "epoch": epoch}, step=step)
        now = time.perf_counter()
        if len(row) > 1 and now - self._saved_at >= SAVE_EVERY_SECONDS:
            # the files at most every few seconds: one save of metrics.csv costs about two milliseconds, as much as
            # a small model's step; validation, the end of a run and a crash save them too (Lightning)
            for logger in self.loggers:
                logger.save()
            self._saved_at = now

    def _interval_metrics(self, value: float, dtype: torch.dtype, loss_is_nll: bool) -> dict[str, Tensor]:
        """train/ppl (exp of the loss, when it is the exact NLL), lr and tokens/s (the mean over the steps since the
        last write, validation time left out), as host tensors."""
        metrics = {}
        if loss_is_nll:  # only then is exp(loss) a perplexity
            metrics["train/ppl"] = host_scalar(value, dtype).exp()
        metrics["lr"] = host_scalar(self.trainer.optimizers[0].param_groups[0]["lr"])
        now = self.training_seconds()
        if self._clock is not None:
            metrics["tokens_per_sec"] = host_scalar(self._tokens / (now - self._clock))
        self._clock, self._tokens = now, 0
        return metrics

    def take_mean_train_loss(self) -> float | None:
        """The mean training loss since the previous call (None without training steps since then)."""
        if not self._loss_steps:
            return None
        mean = self._loss_sum / self._loss_steps
        self._loss_sum, self._loss_steps = 0.0, 0
        return mean

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


PROGRESS_BAR = ("train/loss", "train/ppl")  # shown by the progress bar
SAVE_EVERY_SECONDS = 5.0  # the loggers' files (metrics.csv) are written on a training step at most this often


def host_scalar(value: float, dtype: torch.dtype | None = None) -> Tensor:
    """``value`` as a 0-dim tensor on the host, as ``self.log`` stores a value: in ``dtype`` (default: torch's), then
    in float32 unless it is float32 or float64."""
    tensor = torch.tensor(value, dtype=dtype or torch.get_default_dtype())
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()
