"""Constants as views: one cached element per value, device and dtype, expanded where a tensor of it is needed.

A tensor filled with a constant is a kernel launch on a GPU each time it is made; an expanded cached element is a
view, which launches nothing. Uses: the column [x, 1] that lets one dot product with a row [w, b] add the bias b,
the log q of a uniform proposal, and the class index 0 of the sampled softmax's cross entropy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

_CONSTANTS: dict[tuple[float, torch.device, torch.dtype], Tensor] = {}
_FIRST_CLASS: dict[tuple[int, torch.device], Tensor] = {}


def _made_once(cache: dict[Any, Tensor], key: Any, make: Callable[[], Tensor]) -> Tensor:
    """``cache[key]``, made by ``make`` at the first call: an ordinary tensor even if made during evaluation."""
    cached = cache.get(key)
    if cached is None:
        with torch.inference_mode(False), torch.no_grad():
            cached = cache[key] = make()
    return cached


def constant(value: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dimensional tensor of ``value``, made once per (value, device, dtype); read-only (expand it, never write)."""
    return _made_once(_CONSTANTS, (value, device, dtype), lambda: torch.full((), value, device=device, dtype=dtype))


def with_column(x: Tensor, value: float) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, value]: one operator (the join), where a fresh column is a fill and a join."""
    return torch.cat([x, constant(value, x.device, x.dtype).expand(*x.shape[:-1], 1)], dim=-1)


def with_ones_column(x: Tensor) -> Tensor:
    """(..., d) -> (..., d + 1) = [x, 1], whose dot product with a row [w, b] adds the bias b."""
    return with_column(x, 1.0)


def first_class(positions: int, device: torch.device) -> Tensor:
    """(positions,) int64 zeros, class 0 for every position (the target of a cross entropy whose first logit is the
    target's), made once per size and device: contiguous, since a loss kernel may copy an expanded index first.
    Read-only."""
    key = (positions, device)
    if key not in _FIRST_CLASS and len(_FIRST_CLASS) > 8:  # sizes come and go (an epoch's last batch): keep a few
        _FIRST_CLASS.clear()
    return _made_once(_FIRST_CLASS, key, lambda: torch.zeros(positions, dtype=torch.long, device=device))
