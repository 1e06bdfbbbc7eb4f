"""One training step and the exact evaluation as plain functions of an encoder and an output strategy.

The LightningModule's hooks (``module.py``), the tools (``lmtrain.tools``) and the scripts call these, so the step
is written once: ``window_loss`` (the forward pass of one window with the carried LSTM state, the loss and its
reduction over time), ``clip_gradients`` and ``after_update`` (the output's after-step hook), put together by
``train_step``; ``window_log_prob`` and ``evaluate`` for the exact log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmtrain.common.precision import float32_region
from lmtrain.model import State
from lmtrain.output import OutputLayer
from lmtrain.training.optim import clip_grad_norm

Batch = tuple[Tensor, Tensor]  # inputs, targets: (B, T) token ids


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; raised before the optimizer step, so the weights stay untouched."""


class LossReading:
    """A step's loss on its way to the host. On a GPU it is copied without waiting (into pinned memory, an event
    recorded after the copy), so the host goes on queuing the backward pass and, when it asks for the value, waits
    for the forward pass only, long done by then: reading it at once would leave the device idle while the host
    queues the backward pass (10% of a plain loop's speed at n = 10^5 on an H200). Elsewhere it is read when asked."""

    def __init__(self, loss: Tensor, extra: dict[str, Tensor] | None = None) -> None:
        self._names = list(extra or {})  # values read in the same copy, e.g. the AR / TAR terms
        loss = loss.detach()
        if self._names:  # one vector: still one copy and one wait
            loss = torch.stack([loss.float(), *(v.detach().float() for v in (extra or {}).values())])
        self._event: torch.cuda.Event | None = None
        if loss.is_cuda:
            host = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
            host.copy_(loss, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(loss.device))
            loss = host
        self._tensor = loss
        self._value: float | None = None
        self._extra: dict[str, float] = {}

    def value(self) -> float:
        """The loss as a Python float: the step's one host sync (on a GPU, a wait for the copy's event)."""
        if self._value is None:
            if self._event is not None:
                self._event.synchronize()
            if self._names:  # on a GPU a host copy by now, read without a further wait
                first, *rest = self._tensor.tolist()
                self._value, self._extra = first, dict(zip(self._names, rest, strict=True))
            else:
                self._value = self._tensor.item()
        return self._value

    def extra(self) -> dict[str, float]:
        """The other values read with the loss, by name (read with it: no further sync)."""
        self.value()
        return self._extra


@dataclass
class Window:
    """One training window's forward pass: the mean loss per position (``train/loss``) on its way to the host
    (``reading``, with the encoder's penalties), the objective the optimizer sees (the loss plus the penalties,
    reduced by ``loss_reduction``), the hidden states (N, d) and the detached state to carry on; ``where`` names the
    step in the error of a non-finite loss."""

    loss: Tensor
    objective: Tensor
    hidden: Tensor
    state: State
    reading: LossReading
    where: str = ""

    @property
    def value(self) -> float:
        """The loss read on the host, for the non-finite check and every metric of the step; raises
        NonFiniteLossError for a NaN or infinite loss. Read it after queuing the backward pass (``train_step``,
        ``LanguageModel.on_after_backward``) and before the optimizer step."""
        value = self.reading.value()
        for name, read in {"loss": value, **self.reading.extra()}.items():
            if not math.isfinite(read):
                what = "loss" if name == "loss" else f"{name} term"
                raise NonFiniteLossError(f"training {what} became {read}{self.where}; lower optim.lr or check the data")
        return value


def carry(encoder: nn.Module, inputs: Tensor, state: State | None) -> tuple[Tensor, State]:
    """The encoder over ``inputs`` (B, T) from ``state`` (dropped when the batch layout changed, e.g. after resuming
    with another batch size): hidden states (B*T, d) and the new state, detached (truncated BPTT)."""
    if state is not None and state[0].shape[1] != inputs.shape[0]:
        state = None
    hidden, state = encoder(inputs, state)  # (B, T, d)
    return hidden.reshape(-1, hidden.shape[-1]), (state[0].detach(), state[1].detach())


def window_loss(
    encoder: nn.Module, output: OutputLayer, batch: Batch, state: State | None, loss_reduction: str, where: str = ""
) -> Window:
    """The training loss of one window; ``sum`` multiplies the per-token mean by T (the classic PTB recipes).
    The encoder's penalties of this forward (``encoder.penalties``: AR / TAR, when set) join the objective, not
    the loss. The loss starts on its way to the host (``Window.reading``); ``Window.value`` reads and checks it,
    naming ``where`` if it is NaN or infinite."""
    inputs, targets = batch
    hidden, state = carry(encoder, inputs, state)
    loss = output.loss(hidden, targets.reshape(-1), inputs=inputs.reshape(-1))
    penalties: dict[str, Tensor] = getattr(encoder, "penalties", {})
    regularized = loss + sum(penalties.values()) if penalties else loss
    objective = regularized * inputs.shape[1] if loss_reduction == "sum" else regularized
    return Window(loss, objective, hidden, state, LossReading(loss, penalties), where)


def clip_gradients(params: Iterable[Tensor], clip: float | None) -> None:
    """Clip the global gradient norm (sparse gradients included) at ``clip``; None or 0: no clipping."""
    if clip:
        clip_grad_norm(params, clip)


def after_update(output: OutputLayer) -> None:
    """What follows every optimizer step: the output's hook (e.g. a kernel sampler's tree refreshed)."""
    output.after_optimizer_step()


def train_step(
    encoder: nn.Module,
    output: OutputLayer,
    batch: Batch,
    state: State | None,
    optimizer: torch.optim.Optimizer,
    clip: float | None,
    loss_reduction: str = "sum",
    inspect: Callable[[Window], None] | None = None,
) -> Window:
    """One optimizer step on one window, as a training run takes it: forward, backward, the loss read and checked
    (``Window.value``), ``inspect`` (e.g. gradient norms before clipping), clipping, the optimizer step and the
    output's after-step hook. A run's own step (``LanguageModel.optimizer_step``) adds what only a run has: the
    learning rate scaled to a variable window's length, and the weight average's update."""
    window = window_loss(encoder, output, batch, state, loss_reduction)
    optimizer.zero_grad(set_to_none=True)
    window.objective.backward()
    _ = window.value  # the read, once the backward pass is queued; raises before the weights change
    if inspect is not None:
        inspect(window)
    clip_gradients([p for m in (encoder, output) for p in m.parameters()], clip)
    optimizer.step()
    after_update(output)
    return window


def window_log_prob(
    encoder: nn.Module, output: OutputLayer, batch: Batch, state: State | None
) -> tuple[Tensor, Tensor, State]:
    """The exact log p of each target of one window (B*T,), the hidden states (B*T, d) and the state to carry on.
    In float32 also under mixed precision: the encoder and the output run with autocast off, so that validation
    and test perplexity are the float32 evaluation of the weights whatever ``trainer.precision`` trained them with."""
    inputs, targets = batch
    with float32_region():
        hidden, state = carry(encoder, inputs, state)
        return output.log_prob(hidden, targets.reshape(-1)), hidden, state


@dataclass
class Evaluation:
    """The summed negative log-likelihood of ``tokens`` targets."""

    nll: float
    tokens: int

    @property
    def ppl(self) -> float:
        """exp(mean NLL)."""
        return float(torch.tensor(self.nll / max(self.tokens, 1)).exp())


@torch.no_grad()
def evaluate(
    encoder: nn.Module, output: OutputLayer, batches: Iterable[Batch], max_tokens: int | None = None
) -> Evaluation:
    """The exact NLL of ``batches`` read in order with the state carried, up to ``max_tokens`` targets (None: all)."""
    state, nll, tokens = None, 0.0, 0
    for batch in batches:
        log_p, _, state = window_log_prob(encoder, output, batch, state)
        nll, tokens = nll - float(log_p.double().sum()), tokens + log_p.numel()
        if max_tokens is not None and tokens >= max_tokens:
            break
    return Evaluation(nll, tokens)
