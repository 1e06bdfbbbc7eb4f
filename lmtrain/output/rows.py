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


class _RowScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query: Tensor, rows: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(query, rows)
        return torch.bmm(query.unsqueeze(1), rows.transpose(1, 2)).squeeze(1)  # (N, 1, d) @ (N, d, k) -> (N, k)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        query, rows = ctx.saved_tensors
        grad = grad.to(rows.dtype)  # autocast ran the product in a lower precision: its gradient is widened back
        grad_rows = grad.unsqueeze(2) * query.unsqueeze(1).to(rows.dtype)  # (N, k, d) outer products, contiguous
        # (N, 1, k) @ (N, k, d) -> (N, d); one row per position (the targets): a scaled row, not N 1 x 1 products
        one_row = rows.shape[1] == 1
        grad_query = grad * rows[:, 0] if one_row else torch.bmm(grad.unsqueeze(1), rows).squeeze(1)
        return grad_query.to(query.dtype), grad_rows


def row_scores(query: Tensor, rows: Tensor) -> Tensor:
    """scores[i, j] = query[i] . rows[i, j] for query (N, d) and per-position rows (N, k, d) -> (N, k).

    The query sits on the left of the batched product (a CPU's BLAS runs that shape much faster than the rows on the
    left; a GPU runs either), and the rows' gradient is written as contiguous outer products, so a sparse row
    gradient takes it without a copy: three operators on every device, as a plain ``bmm`` takes."""
    return _RowScores.apply(query, rows)
