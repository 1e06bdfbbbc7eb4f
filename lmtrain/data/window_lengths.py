"""Variable TBPTT window lengths (Merity et al. 2018, AWD-LSTM): one epoch's lengths, drawn anew for every epoch.

Each window's base length is ``bptt``, or ``bptt / 2`` with probability ``half_prob``; its length is a normal draw
around that base with std ``std``, truncated to an integer and at least ``minimum``. The windows follow each other
from the first position, the last one cut to what is left, so an epoch reads every position once. The draws are a
function of the seed and the epoch alone (NumPy's seed sequence of the two), so a run resumed in any epoch sees the
same windows as one that was never interrupted, with nothing to keep in a checkpoint.
"""

from __future__ import annotations

import numpy as np

from lmtrain.data.options import BatchOptions


def fixed_lengths(positions: int, bptt: int) -> list[int]:
    """Windows of ``bptt`` positions over ``positions``, the last one shorter when they do not divide."""
    full, rest = divmod(positions, bptt)
    return [bptt] * full + ([rest] if rest else [])


def window_lengths(positions: int, batch: BatchOptions, epoch: int) -> list[int]:
    """The lengths of the training windows of ``epoch`` over ``positions`` target positions per row, in order; they
    add up to ``positions``. Fixed ``batch.bptt`` windows (the last one shorter) unless ``batch.variable_bptt``."""
    if not batch.variable_bptt:
        return fixed_lengths(positions, batch.bptt)
    rng = np.random.default_rng([batch.bptt_seed, epoch])
    lengths: list[int] = []
    left = positions
    chunk = positions // batch.bptt_min + 1  # enough draws for the whole epoch: every window is >= bptt_min
    halves = rng.random(chunk) < batch.bptt_half_prob  # (chunk,)
    base = np.where(halves, batch.bptt / 2, float(batch.bptt))
    drawn = np.maximum(batch.bptt_min, rng.normal(base, batch.bptt_std).astype(np.int64))  # int(): toward zero
    for length in drawn.tolist():
        if left <= 0:
            break
        lengths.append(min(length, left))
        left -= lengths[-1]
    return lengths
