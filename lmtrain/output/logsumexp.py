"""Exact normalization over the whole vocabulary, in chunks so n = 10^6 fits in memory."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def chunked_logsumexp(scores: Callable[[int, int], Tensor], num_classes: int, chunk: int) -> Tensor:
    """logsumexp over classes of scores(start, end) -> (N, end - start); returns (N,)."""
    total: Tensor | None = None
    for start in range(0, num_classes, chunk):
        part = torch.logsumexp(scores(start, min(start + chunk, num_classes)), dim=1)  # (N,)
        total = part if total is None else torch.logaddexp(total, part)
    assert total is not None, "num_classes must be positive"
    return total
