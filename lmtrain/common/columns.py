"""[x, c]: a constant column joined to vectors, e.g. ones, so that one dot product with a row [w, b] adds the bias b."""

from __future__ import annotations

import torch
from torch import Tensor

# one 1-element tensor per (value, device, dtype), made once: expanded it is a constant column without a fill
_CONSTANTS: dict[tuple[float, torch.device, torch.dtype], Tensor] = {}


def with_column(x: Tensor, value: float) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, value].

    The column is a cached one-element tensor expanded to (..., 1), a view, so the join is one operator, where a
    fresh column is a fill and a join: one kernel launch fewer per call on a GPU, the same values."""
    key = (value, x.device, x.dtype)
    constant = _CONSTANTS.get(key)
    if constant is None:
        with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor even if made during evaluation
            constant = _CONSTANTS[key] = torch.full((1,), value, device=x.device, dtype=x.dtype)
    return torch.cat([x, constant.expand(*x.shape[:-1], 1)], dim=-1)


def with_ones_column(x: Tensor) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, 1], whose dot product with a row [w, b] adds the bias b (``with_column``)."""
    return with_column(x, 1.0)
