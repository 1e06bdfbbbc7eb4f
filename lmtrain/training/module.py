"""The LightningModule: TBPTT with a carried state, exact evaluation, sparse-aware optimisation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lmtrain.common.optim_options import OWN_KEYS, OptimOptions
from lmtrain.common.precision import float32_region
from lmtrain.model import State
from lmtrain.output import OutputLayer
from lmtrain.training.averaging import WeightAverage
from lmtrain.training.ddp import ddp_ignored, mean_over_ranks
from lmtrain.training.metered_module import MeteredModule
from lmtrain.training.optim import build_optimizer
from lmtrain.training.resume import Resumed, checkpoint_entry, resume_fit
from lmtrain.training.rng import set_rng_states
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


class LanguageModel(MeteredModule):
    """An encoder (tokens -> hidden) and an output strategy (hidden -> loss / exact log-prob).

    The LSTM state is carried across the windows of an epoch and detached (truncated BPTT); it is saved in
    checkpoints together with the data position and RNG states, so a resumed run continues exactly
    (``lmtrain.training.resume``). ``lr_window``: each step's learning rate is scaled by its window's length /
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
