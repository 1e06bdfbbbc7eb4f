"""Constants as views: one cached element per value, device and dtype, expanded where a tensor of it is needed.

A tensor filled with a constant is a kernel launch on a GPU each time it is made; an expanded cached element is a
view, which launches nothing. Uses: the column [x, 1] that lets one dot product with a row [w, b] add the bias b,
and the log q of a uniform proposal."""

from __future__ import annotations

import torch
from torch import Tensor

_CONSTANTS: dict[tuple[float, torch.device, torch.dtype], Tensor] = {}


def constant(value: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dimensional tensor of ``value``, made once per (value, device, dtype); read-only (expand it, never write)."""
    key = (value, device, dtype)
    cached = _CONSTANTS.get(key)
    if cached is None:
        with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor even if made during evaluation
            cached = _CONSTANTS[key] = torch.full((), value, device=device, dtype=dtype)
    return cached


def with_column(x: Tensor, value: float) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, value]: one operator (the join), where a fresh column is a fill and a join."""
    return torch.cat([x, constant(value, x.device, x.dtype).expand(*x.shape[:-1], 1)], dim=-1)


def with_ones_column(x: Tensor) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, 1], whose dot product with a row [w, b] adds the bias b."""
    return with_column(x, 1.0)
