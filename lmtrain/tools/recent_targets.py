"""The targets of the last ``window`` tokens of a dynamic pass, the classes its sampled loss holds exactly.

A sampled softmax's normalizer reaches a class only when the proposal draws it. Dynamic evaluation pushes up the
rows of the words it has just read, and a proposal that does not follow the model (unigram) seldom draws a rare one
back, so nothing pushes it down again and it inflates the exact normalizer. Holding the recent targets in every
position's normalizer exactly (``ExactClasses``) gives those rows their push down at every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.output.base import ExactClasses


class RecentTargets:
    """A ring of the last ``window`` target ids of a pass, in fixed-size tensors (no host sync, no data-sized
    shape): a slot is included only where it holds its class's latest occurrence, so each class counts once."""

    def __init__(self, window: int, num_classes: int, device: torch.device) -> None:
        self.window = window
        self.ids = torch.zeros(window, dtype=torch.long, device=device)  # (W,) the ring's class ids
        self.at = torch.full((window,), -1, dtype=torch.long, device=device)  # (W,) each slot's position; -1: empty
        self.latest = torch.full((num_classes,), -1, dtype=torch.long, device=device)  # (n,) latest position
        self.seen = 0  # positions pushed (the pass counts its own tokens: no device read)

    def push(self, targets: Tensor) -> None:
        """Append a segment's targets (L,), L at most ``window``; the oldest leave the ring."""
        count = targets.numel()
        if count > self.window:
            raise ValueError(f"a segment of {count} targets does not fit a window of {self.window}")
        positions = torch.arange(self.seen, self.seen + count, device=self.ids.device)  # (L,)
        slots = positions % self.window  # (L,) distinct, since L <= window
        self.ids[slots] = targets
        self.at[slots] = positions
        self.latest.scatter_reduce_(0, targets, positions, reduce="amax")  # a class named twice keeps its last
        self.seen += count

    def classes(self) -> ExactClasses:
        """The window's distinct classes: the ring with each class's latest slot included, and membership."""
        include = (self.at >= 0) & (self.latest[self.ids] == self.at)  # (W,)
        member = (self.latest >= 0) & (self.latest >= self.seen - self.window)  # (n,) latest position still held
        return ExactClasses(self.ids, include, member)

    def clear(self) -> None:
        """Empty, as at the start of a pass."""
        self.at.fill_(-1)
        self.latest.fill_(-1)
        self.seen = 0
