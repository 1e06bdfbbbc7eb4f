"""Exact softmax cross-entropy over a large vocabulary without the (N, n) logit matrix.

``exact_softmax_nll`` is the entry point of the strategies whose dense logits exceed their budget: it takes torch's
``F.linear_cross_entropy`` in row chunks sized from the logits budget, or the hand-written vocabulary chunks below,
whichever ``takes_torch_linear_ce`` picks (the reason: docs/bench/linear_ce_cpu.json).

The hand-written form (``chunked_softmax_nll``): the forward pass walks the vocabulary in chunks of ``chunk`` classes
and carries a running log-sum-exp per row; it keeps only the inputs, the rows' log-normalizers (N,) and the target
ids. The backward pass recomputes each chunk's logits and turns them, in their own buffer, into that chunk's columns
of the softmax; these enter the products unscaled (the incoming gradient scales the (N, d) sides), and the one-hot
part of softmax - one-hot is added once after the loop, one class per row. Peak extra memory is a few (N, chunk)
blocks instead of several (N, n) ones, and no weight-sized buffer beyond the gradient; the arithmetic is the dense
path's. A chunk is read or written about 12 times per step (forward product and log-softmax; backward product,
shift, exp, bias sum and the two products), which matters where a step is bound by memory traffic (a GPU at large
N x n); on a CPU the four products dominate.

Under autocast the logits are computed in the autocast dtype (as ``F.linear`` would compute the dense logits) and
everything after them (log-sum-exp, softmax, gradient accumulation) in float32 or wider.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.common.precision import float32_region

# torch's chunked fused loss: recent releases have it, the declared minimum (torch 2.6) does not (the hand-written form
# runs there)
HAS_TORCH_LINEAR_CE = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
Reduction = Literal["none", "mean", "sum"]


def product_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the logits are computed in: autocast's for the hidden's device when it is on, else the hidden's."""
    device = hidden.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


class _ChunkedSoftmaxNLL(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, chunk: int
    ) -> Tensor:
        dtype = product_dtype(hidden)
        acc = torch.promote_types(dtype, torch.float32)  # log-sum-exp and gradients: at least float32
        num_classes = weight.shape[0]
        with float32_region():  # autocast off: the casts below are explicit
            h = hidden.to(dtype)
            log_z = hidden.new_full((hidden.shape[0],), float("-inf"), dtype=acc)  # (N,)
            target_logit = hidden.new_zeros(hidden.shape[0], dtype=acc)  # (N,)
            for start in range(0, num_classes, chunk):
                end = min(start + chunk, num_classes)
                logits = F.linear(h, weight[start:end].to(dtype), chunk_bias(bias, start, end, dtype)).to(acc)  # (N, c)
                local, inside = local_targets(target, start, end)
                picked = logits.gather(1, local[:, None])[:, 0]  # (N,)
                # the chunk's log-sum-exp as cross-entropy + picked logit: one fused log-softmax reads the chunk
                # twice, where logsumexp's max, shift, exp and sum read and write it about six times
                chunk_log_z = F.cross_entropy(logits, local, reduction="none") + picked  # (N,)
                log_z = torch.logaddexp(log_z, chunk_log_z)
                target_logit = torch.where(inside, picked, target_logit)
        ctx.save_for_backward(hidden, weight, bias, target, log_z)
        ctx.chunk, ctx.dtype = chunk, dtype
        return log_z - target_logit  # (N,) per-row negative log-likelihood

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_nll: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None]:  # type: ignore[override]
        """d nll_i / d logit_ij = p_ij - [j = target_i], times grad_i. The softmax part p is recomputed per chunk and
        enters the products unscaled (grad_i scales the (N, d) and (N,) sides instead of every (N, c) element); the
        one-hot part touches one class per row and is added once, outside the loop."""
        hidden, weight, bias, target, log_z = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype, num_classes = ctx.dtype, weight.shape[0]
        acc = log_z.dtype
        grad = grad_nll.to(acc)  # (N,)
        with float32_region():
            h = hidden.to(dtype)
            scaled_h = (hidden.to(acc) * grad[:, None]).to(dtype)  # (N, d): grad_i h_i, the weight gradient's side
            probs_w = torch.zeros_like(hidden, dtype=acc) if need_hidden else None  # (N, d): sum_j p_ij w_j
            grad_weight = torch.empty_like(weight) if need_weight else None  # (n, d)
            grad_bias = torch.empty_like(bias) if need_bias else None  # (n,); never for a missing bias
            for start in range(0, num_classes, ctx.chunk):
                end = min(start + ctx.chunk, num_classes)
                w = weight[start:end].to(dtype)  # (c, d)
                logits = F.linear(h, w, chunk_bias(bias, start, end, dtype)).to(acc)  # (N, c)
                probs = logits.sub_(log_z[:, None]).exp_()  # (N, c) softmax over all n, in the logits' buffer
                if grad_bias is not None:
                    product_into(grad_bias[start:end], probs.T, grad)  # (c,)
                probs = probs.to(dtype)  # the products in the logits' dtype, as the dense path's
                if probs_w is not None:
                    probs_w.add_(probs @ w)  # (N, d)
                if grad_weight is not None:
                    product_into(grad_weight[start:end], probs.T, scaled_h)  # (c, d)
            # the one-hot part: -grad_i at (i, target_i)
            if grad_bias is not None:
                grad_bias.index_add_(0, target, -grad.to(grad_bias.dtype))
            if grad_weight is not None:
                grad_weight.index_add_(0, target, -scaled_h.to(grad_weight.dtype))
            grad_hidden = None
            if probs_w is not None:
                grad_hidden = ((probs_w - weight[target].to(acc)) * grad[:, None]).to(hidden.dtype)  # (N, d)
        return grad_hidden, grad_weight, grad_bias, None, None


def product_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out`` := a @ b, written in place where the dtypes agree (no temporary of out's size to copy), else cast."""
    if a.dtype == b.dtype == out.dtype:
        torch.matmul(a, b, out=out)
    else:
        out.copy_(a @ b)


def chunk_bias(bias: Tensor | None, start: int, end: int, dtype: torch.dtype) -> Tensor | None:
    """The biases of the chunk [start, end) in the product's dtype, or None for classes without biases."""
    return None if bias is None else bias[start:end].to(dtype)


def logits_budget_mib(logits_mib: float, gpu_fraction: float, device: torch.device) -> float:
    """The MiB that a step's dense float32 logits may take on ``device``: ``logits_mib`` on a CPU (or with
    ``gpu_fraction`` 0), else that fraction of the GPU's memory. No host sync; the memory is read once per device.

    Why two budgets: on a CPU, chunks that stay cache-sized keep a 10^6-class step within a few GiB at no cost in
    speed; on a GPU one dense product beats a loop over chunks (the side-by-side figure: docs/bench/gpu_h200.md),
    and the dense step's peak, about three times its logits, stays well inside the device at a sixteenth."""
    if device.type != "cuda" or not gpu_fraction:
        return logits_mib
    return gpu_fraction * _cuda_memory_mib(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_memory_mib(index: int) -> float:
    return torch.cuda.get_device_properties(index).total_memory / 2**20


def fitting_chunk(budget_mib: float, num_positions: int) -> int:
    """The most classes (at least 1) whose float32 logits at ``num_positions`` rows take at most ``budget_mib`` MiB:
    the chunk of the training loss, dense when it reaches the vocabulary size."""
    return max(int(budget_mib * 2**20) // (4 * max(num_positions, 1)), 1)


def budget_rows(budget_mib: float, num_classes: int) -> int:
    """The most batch rows (at least 1) whose (rows, n) float32 logits take at most ``budget_mib`` MiB: torch's row
    chunk from the budget that sizes the hand-written vocabulary chunk (``fitting_chunk``, rows and classes swapped)."""
    return fitting_chunk(budget_mib, num_classes)


def takes_torch_linear_ce(hidden: Tensor, weight: Tensor, budget_mib: float, chunk: int | None = None) -> bool:
    """Whether ``exact_softmax_nll`` takes torch's ``F.linear_cross_entropy`` (row chunks of ``budget_rows``) over
    the hand-written vocabulary chunks: where it is not worse. The reason is docs/bench/linear_ce_cpu.json, torch's
    op beside ``chunked_softmax_nll`` at the same logits budget: faster at every size there, lighter where the
    vocabulary is moderate, but it holds one more weight-sized float32 buffer (n d 4 bytes) through the step, and
    with bfloat16 inputs it returns a bfloat16 loss, summed less exactly than the hand-written form's float32.

    So torch's op runs where that buffer fits in the logits budget (``budget_mib``, the one the caller sizes its
    chunks with) and the logits' product dtype (``product_dtype``) is float32 or float64 (the inputs' own). The
    hand-written form keeps the rest: bfloat16 / float16 products (autocast, or such inputs), a weight too large for
    the budget, a fixed vocabulary ``chunk`` (``output.train_chunk`` counts classes, torch chunks rows), and a torch
    without the op. Memory and dtype only: the same rule on every device."""
    dtype = product_dtype(hidden)
    return (
        HAS_TORCH_LINEAR_CE
        and chunk is None
        and dtype in (torch.float32, torch.float64)
        and hidden.dtype == weight.dtype == dtype
        and weight.shape[0] * weight.shape[1] * 4 <= budget_mib * 2**20
    )


def exact_softmax_nll(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    budget_mib: float,
    chunk: int | None = None,
    reduction: Reduction = "none",
) -> Tensor:
    """(N, d), (n, d), (n,) or None, (N,) -> exact -log softmax(hidden W^T + b)[target] without the (N, n) logits:
    per row (N,) for ``reduction="none"``, else their mean or sum. ``budget_mib``: the MiB a chunk's float32 logits
    may take; ``chunk``: a fixed vocabulary chunk of the hand-written form, None to size it from the budget.
    ``takes_torch_linear_ce`` picks the form; both give the same values and gradients to float rounding."""
    if takes_torch_linear_ce(hidden, weight, budget_mib, chunk):
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=budget_rows(budget_mib, weight.shape[0]))
        return F.linear_cross_entropy(hidden, weight, target, linear_bias=bias, reduction=reduction, options=options)
    nll = chunked_softmax_nll(
        hidden, weight, bias, target, fitting_chunk(budget_mib, hidden.shape[0]) if chunk is None else chunk
    )
    if reduction == "none":
        return nll  # (N,)
    return nll.sum() if reduction == "sum" else nll.mean()


def local_targets(target: Tensor, start: int, end: int) -> tuple[Tensor, Tensor]:
    """Targets as column indices of the chunk [start, end) (clamped into it) and whether each lies in it: (N,), (N,).
    Fixed shapes and no host sync, so the loop costs the same launches for any batch."""
    inside = (target >= start) & (target < end)
    return (target - start).clamp_(0, end - start - 1), inside


def chunked_softmax_nll(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, chunk: int) -> Tensor:
    """(N, d), (n, d), (n,) or None, (N,) -> (N,) exact -log softmax(hidden W^T + b)[target], vocabulary chunks of
    ``chunk``; ``bias=None``: classes without biases (b = 0)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _ChunkedSoftmaxNLL.apply(hidden, weight, bias, target, chunk)
