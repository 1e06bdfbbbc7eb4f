"""Row gathers whose gradient is a sparse tensor of the whole parameter's shape (docs/strategies.md)."""

from __future__ import annotations

import torch
from torch import Tensor


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, param: Tensor, ids: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.shape = param.shape
        return param[ids]

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        flat_ids = ids.reshape(1, -1)  # (1, K)
        values = grad_out.reshape(flat_ids.shape[1], *ctx.shape[1:])  # (K, ...)
        # uncoalesced (duplicates add); ids come from a gather, so the invariants hold by construction
        grad = torch.sparse_coo_tensor(flat_ids, values, ctx.shape, check_invariants=False)
        return grad, None


def gather_rows(param: Tensor, ids: Tensor, sparse: bool = True) -> Tensor:
    """param[ids] for a (n, ...) parameter; with ``sparse`` its gradient touches only the gathered rows."""
    if sparse and param.requires_grad and torch.is_grad_enabled():
        return _GatherRows.apply(param, ids)
    return param[ids]
