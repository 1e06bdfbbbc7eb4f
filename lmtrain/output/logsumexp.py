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


def class_rows(table: Tensor, start: int, end: int) -> Tensor:
    """Rows start..end of a per-class table; the table itself when that is all of it (a slice's backward would
    allocate a zero table and copy the gradient into it)."""
    return table if start == 0 and end == table.shape[0] else table[start:end]


def exact_log_prob(
    scores: Callable[[int, int], Tensor], target_score: Callable[[], Tensor], target: Tensor, num_classes: int,
    chunk: int,
) -> Tensor:  # fmt: skip
    """log p(target) = s_target - logsumexp over classes of s, (N,) (``target_and_log_z``)."""
    target_logit, log_z = target_and_log_z(scores, target_score, target, num_classes, chunk)
    return target_logit - log_z


def target_and_log_z(
    scores: Callable[[int, int], Tensor], target_score: Callable[[], Tensor], target: Tensor, num_classes: int,
    chunk: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """s_target and logsumexp over classes of s, each (N,). When one chunk holds every class, both come from the one
    logits matrix scores(0, n) (N, n): their gradient is one product with the class vectors, which dynamic
    evaluation's step per segment needs; else ``target_score()``, one row read per position, and the chunked
    logsumexp (n = 10^6)."""
    if chunk >= num_classes:
        logits = scores(0, num_classes)  # (N, n)
        return logits.gather(1, target.unsqueeze(1)).squeeze(1), torch.logsumexp(logits, dim=1)
    return target_score(), chunked_logsumexp(scores, num_classes, chunk)
