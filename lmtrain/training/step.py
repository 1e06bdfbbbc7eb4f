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
    """Training produced a NaN or infinite loss; raised before the bad step touches the weights."""


@dataclass
class Window:
    """One training window's forward pass: the mean loss per position (``train/loss``) and its value read on the
    host, the objective the optimizer sees (``loss_reduction``), the hidden states (N, d) and the detached state to
    carry on."""

    loss: Tensor
    objective: Tensor
    hidden: Tensor
    state: State
    value: float  # loss.item(): the step's one host sync, for the non-finite check and every metric of the step


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
    Raises NonFiniteLossError (naming ``where``) for a NaN or infinite loss.

    The loss is read on the host once (``Window.value``): on a GPU that read waits for the forward pass, and it is
    the only wait of a training step; the check and the step's metrics all use this one value."""
    inputs, targets = batch
    hidden, state = carry(encoder, inputs, state)
    loss = output.loss(hidden, targets.reshape(-1), inputs=inputs.reshape(-1))
    value = loss.item()
    if not math.isfinite(value):
        raise NonFiniteLossError(f"training loss became {value}{where}; lower optim.lr or check the data")
    objective = loss * inputs.shape[1] if loss_reduction == "sum" else loss
    return Window(loss, objective, hidden, state, value)


def clip_gradients(params: Iterable[Tensor], clip: float | None, fixed_shapes: bool = False) -> None:
    """Clip the global gradient norm (sparse gradients included) at ``clip``; None or 0: no clipping.
    ``fixed_shapes``: the GPU paths' handling of sparse gradients (``lmtrain.training.optim.merge_repeats``)."""
    if clip:
        clip_grad_norm(params, clip, fixed_shapes)


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
    """One optimizer step on one window, as a training run takes it: forward, backward, ``inspect`` (e.g. gradient
    norms before clipping), clipping, the optimizer step and the output's after-step hook."""
    window = window_loss(encoder, output, batch, state, loss_reduction)
    optimizer.zero_grad(set_to_none=True)
    window.objective.backward()
    if inspect is not None:
        inspect(window)
    clip_gradients([p for m in (encoder, output) for p in m.parameters()], clip, output.gpu_paths)
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
