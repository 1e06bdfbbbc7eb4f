"""The LightningModule, ``LanguageModel``: TBPTT with a carried state, exact evaluation, sparse-aware optimisation, the
hooks of an exact resume (what they save and restore: ``lmtrain.run_folder.resume``), and, in its base
``MeteredModule``, what a training run writes besides the exact evaluation. That is the loss at every step, the
perplexity, learning rate and throughput every ``trainer.log_every_n_steps`` steps, all in Lightning's rows of
metrics.csv, and with each validation the training seconds so far (``train/seconds``), the clock of
``max_train_seconds``. The training metrics are computed on the host from the one loss value a step reads
(``MeteredModule._record_step``)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lmtrain.common.optim_options import OWN_KEYS, OptimOptions
from lmtrain.common.precision import float32_region
from lmtrain.model import State
from lmtrain.output import OutputLayer
from lmtrain.run_folder.resume import Resumed, checkpoint_entry, resume_fit
from lmtrain.run_folder.rng import set_rng_states
from lmtrain.training.averaging import WeightAverage
from lmtrain.training.optim import build_optimizer, ddp_ignored, mean_over_ranks
from lmtrain.training.schedule import build_scheduler, scaled_lr
from lmtrain.training.step import (
    NonFiniteLossError,
    Window,
    after_update,
    clip_gradients,
    window_log_prob,
    window_loss,
)

__all__ = ["LanguageModel", "NonFiniteLossError"]


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


class LanguageModel(MeteredModule):
    """An encoder (tokens -> hidden) and an output strategy (hidden -> loss / exact log-prob).

    The LSTM state is carried across the windows of an epoch and detached (truncated BPTT); it is saved in
    checkpoints together with the data position and RNG states, so a resumed run continues exactly
    (``lmtrain.run_folder.resume``). ``lr_window``: each step's learning rate is scaled by its window's length /
    ``lr_window`` (variable BPTT; None: not scaled). ``optim.average``: validation and the checkpoints' weights are
    the running mean of the weights once it starts (``lmtrain.training.averaging``).
    """

    def __init__(
        self,
        encoder: nn.Module,
        output: OutputLayer,
        optim: dict[str, Any],
        loss_reduction: str,
        lr_window: int | None = None,
    ) -> None:
        super().__init__()
        self.encoder, self.output = encoder, output
        self.optim = dict(optim)
        self.loss_reduction = loss_reduction
        self.lr_window = lr_window
        self._lr_factor = 1.0  # this step's window length / lr_window
        # a saved run config without these keys takes their defaults
        self.average = WeightAverage(
            self.optim.get("average", OptimOptions.average), self.optim.get("nonmono", OptimOptions.nonmono)
        )
        self._state: dict[str, State | None] = {"train": None, "val": None, "test": None}
        self._eval_sums: Tensor = torch.zeros(2, dtype=torch.float64)  # (sum of -log p, token count, output eval_sums)
        self._batches_done = 0  # training windows finished in the current epoch
        self._resumed: Resumed | None = None  # from the checkpoint of a resumed fit, until its first batch
        self._window: Window | None = None  # the training window whose backward pass is under way
        self._off_schedule = False  # a checkpoint written now is off the run's step schedule (``off_schedule``)

    # --- one window (lmtrain.training.step) ----------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        where = f" at global step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx})"
        window = window_loss(self.encoder, self.output, batch, self._state["train"], self.loss_reduction, where)
        self._state["train"] = window.state
        self._batches_done = batch_idx + 1  # read by checkpoints saved at the end of this batch
        self._window = window
        return window.objective

    def on_after_backward(self) -> None:
        """The loss read (the step's one host sync) and checked once the backward pass is queued, before clipping
        and the optimizer step (``step.LossReading``); then the step's metrics."""
        window, self._window = self._window, None
        if window is not None:
            value = window.value
            extra = window.reading.extra()  # the encoder's penalties (AR / TAR), read with the loss
            self._record_step(window.loss, value, window.hidden.shape[0], self.output.loss_is_nll, extra)

    def on_train_epoch_start(self) -> None:
        if self._resumed is not None and self._resumed.mid_epoch:  # Lightning may or may not call this hook then
            self._resumed.mid_epoch = False
            return
        self._state["train"], self._batches_done = None, 0

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.lr_window is not None:  # a shape: known on the host, no sync
            self._lr_factor = batch[0].shape[1] / self.lr_window
        if self._resumed is not None:  # the resumed epoch is under way; the next epoch start resets
            set_rng_states(self._resumed.rng)  # not earlier: creating the loader iterator may draw numbers
            self.output.restore_kept_state(self._resumed.kept)  # over the tree the load rebuilt
            self._resumed = None

    # --- exact evaluation --------------------------------------------------------------------------
    def _eval_step(self, batch: tuple[Tensor, Tensor], split: str) -> None:
        """Exact log-probabilities of one window, in float32 also under mixed precision (``window_log_prob``)."""
        log_p, hidden, self._state[split] = window_log_prob(self.encoder, self.output, batch, self._state[split])
        with float32_region():
            extra = self.output.extra_metrics(hidden)
            own = self.output.eval_sums(hidden, batch[1].reshape(-1), log_p)  # e.g. Σ ln Z, Σ (ln Z)²
        for name, value in extra.items():  # e.g. NCE's mean ln Z
            self.log(f"{split}/{name}", value, on_epoch=True, batch_size=hidden.shape[0], sync_dist=True)
        totals = torch.stack([-log_p.double().sum().cpu(), torch.tensor(log_p.numel(), dtype=torch.float64)])
        self._eval_sums += torch.cat([totals, own.cpu()])

    def _eval_start(self, split: str) -> None:
        if split == "val":  # the test reads a checkpoint's weights, already the averaged ones
            self.average.swap_in(self)
        self._state[split] = None
        self._eval_sums = torch.zeros(2 + self.output.eval_sum_count, dtype=torch.float64)

    def _eval_end(self, split: str) -> None:
        sums = self._eval_sums.to(self.device)
        if self.trainer.world_size > 1:  # every rank evaluated its own rows: add them up
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        mean_nll = (sums[0] / sums[1].clamp(min=1)).float()
        self.log(f"{split}/loss", mean_nll, sync_dist=False)
        self.log(f"{split}/ppl", mean_nll.exp(), prog_bar=True, sync_dist=False)
        for name, value in self.output.eval_summary(sums[2:], sums[1], mean_nll).items():  # e.g. ppl_unnormalized
            self.log(f"{split}/{name}", value, sync_dist=False)
        if split == "val":
            self.average.swap_out(self)
            if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
                self.average.observe(float(mean_nll))  # at the end of a validation, not in a training step
        if split == "val" and self.trainer.state.fn == "fit":  # the x axis of perplexity against training time
            self.log("train/seconds", self.train_seconds, sync_dist=False)
        if split == "test":
            self._label_test_row()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_start(self) -> None:
        self._eval_start("val")

    def on_test_epoch_start(self) -> None:
        self._eval_start("test")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # --- optimisation ------------------------------------------------------------------------------
    def sparse_parameters(self) -> list[nn.Parameter]:
        """The parameters with sparse row gradients: the output's sampled rows, and the encoder's input embedding
        when it is sparse."""
        encoder = getattr(self.encoder, "sparse_parameters", None)
        return self.output.sparse_parameters() + (encoder() if encoder is not None else [])

    def configure_optimizers(self) -> dict[str, Any]:
        sparse = self.sparse_parameters()
        sparse_ids = {id(p) for p in sparse}
        dense = [p for p in self.parameters() if id(p) not in sparse_ids]
        kwargs = {k: v for k, v in self.optim.items() if k not in OWN_KEYS and v}
        optimizer = build_optimizer(self.optim["name"], dense, sparse, lr=self.optim["lr"], **kwargs)
        config: dict[str, Any] = {"optimizer": optimizer}
        scheduler = build_scheduler(optimizer, self.optim.get("schedule") or {})
        if scheduler is not None:
            config["lr_scheduler"] = scheduler
        return config

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        clip_gradients(self.parameters(), self.optim.get("clip"))

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        with scaled_lr(self.trainer.optimizers[0], self._lr_factor):
            super().optimizer_step(*args, **kwargs)
        after_update(self.output)  # e.g. refresh a kernel sampler's tree from the changed rows
        self.average.update(self)

    # --- multi-process (DDP) -----------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.trainer.world_size > 1:  # runs before the strategy wraps this module in DistributedDataParallel
            self._ddp_params_and_buffers_to_ignore = ddp_ignored(self, self.sparse_parameters(), self.output)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.trainer.world_size > 1:  # DDP averaged the dense gradients; average the sparse ones alike
            for param in self.sparse_parameters():
                param.grad = mean_over_ranks(param, self)

    # --- exact resume ------------------------------------------------------------------------------
    @contextmanager
    def off_schedule(self) -> Iterator[None]:
        """Checkpoints written inside are off the run's step schedule (a stop's, a timed one): they carry the
        output's derived state as kept (``OutputLayer.kept_state``) instead of rebuilding it, so that writing them
        leaves the run on the path of one that never wrote them."""
        self._off_schedule = True
        try:
            yield
        finally:
            self._off_schedule = False

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        bad = [name for name, p in self.named_parameters() if not all_finite(p)]
        if bad:  # raising here aborts the write: the previous checkpoint stays the last good one
            raise NonFiniteLossError(
                f"parameters are not finite at global step {self.global_step} ({', '.join(bad[:3])}); "
                "the checkpoint was not written. Lower optim.lr or check the data"
            )
        kept = self.output.kept_state() if self._off_schedule else {}
        if not self._off_schedule:
            self.output.before_checkpoint()  # e.g. a kernel tree rebuilt from the weights, as a resume from here is
        for logger in self.loggers:  # metrics on disk stay in step with the checkpoint a resume starts from
            logger.save()
        checkpoint["lmtrain"] = checkpoint_entry(self, self._batches_done, self._state["train"], kept)
        self.average.save(checkpoint, self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._trainer is None or self.trainer.state.fn != "fit":
            return
        self.average.restore(checkpoint, self)  # before Lightning loads state_dict: the training weights
        self._resumed = resume_fit(checkpoint, self.trainer)  # also sets the data sampler's start
        if self._resumed is None:
            return
        self.train_seconds = self._resumed.train_seconds
        if self._resumed.mid_epoch:
            self._state["train"], self._batches_done = self._resumed.state, self._resumed.batches_done


def all_finite(param: Tensor, block: int = 1 << 20) -> bool:
    """Whether every entry of ``param`` is finite, read in blocks of ``block`` entries: ``torch.isfinite`` of a
    whole 10^6 x 200 matrix would hold 1.3 GiB of temporaries, more than a chunked full-softmax step."""
    flat = param.detach().reshape(-1)
    if flat.numel() == 0:
        return True
    return bool(torch.stack([torch.isfinite(part).all() for part in flat.split(block)]).all())
