"""Target sampling (Jean et al. 2015): one candidate set per batch, the batch's distinct targets topped up with other
classes, uniform over the set."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor

from lmtrain.common.constants import constant
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal, positions_of

log = logging.getLogger("lmtrain")


class TargetSampler(Sampler):
    """One set of K = max(m, N) classes for the whole batch (m = the output's ``num_samples``, N the positions, at
    most n): every distinct target of the batch exactly once, the rest drawn uniformly from the other classes.

    The set is taken as the top K of one random key per class, raised above every other key for the batch's targets
    (a (n,) ``rand``, an ``index_fill`` and a ``topk``: a fixed shape however many distinct targets the batch holds,
    no host sync). A batch never holds more than N distinct targets, so a set of max(m, N) always holds all of
    them: when N > m the set grows to N (said once in the log). Every member has log q = -ln K, so the sampled
    softmax's correction is a constant that cancels (the exact one is 0), and the position's own target in the set
    is an accidental hit, which the sampled softmax removes: each position's loss is the softmax over the set.
    ``output.shared_negatives`` is not read (one set per batch by definition).
    """

    name = "target"  # sampler=target
    context_free = True  # the targets alone: no query, input token or class vector

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"TargetSampler needs at least 2 classes, got num_classes={num_classes}")
        self.num_classes = num_classes
        self.warned = False  # the set grew beyond m already (logged once per sampler)
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows the module's device/dtype

    def share_negatives(self, shared: bool) -> None:
        """One set for the whole batch, whatever the output asks."""

    def check_output(self, output: Any) -> None:
        """Refuse the sampled outputs that cannot train on the set: one that hands no targets to its sampler
        (negative sampling), distinct draws (the set is distinct already) and kept accidental hits (the target
        would count twice)."""
        options = output.options
        if not getattr(output, "corrects_with_log_q", True):
            name = getattr(output, "name", type(output).__name__)
            raise ValueError(f"sampler=target builds its set from the targets, which output={name} does not pass")
        if getattr(options, "unique", False):
            raise ValueError("sampler=target draws a set of distinct classes itself: set output.unique=false")
        if getattr(options, "remove_accidental_hits", True) is False:
            raise ValueError(
                "sampler=target puts every target in the set, so a kept hit counts it twice: "
                "set output.remove_accidental_hits=true"
            )

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> TargetProposal:
        if targets is None:
            raise ValueError("sampler=target builds its set from the batch's targets: pass them (the loss does)")
        return TargetProposal(self, targets.reshape(-1), positions_of(query, inputs, targets))

    def set_size(self, num_samples: int, positions: int) -> int:
        """K = max(m, N), at most n; logged once where N > m."""
        size = min(max(num_samples, positions), self.num_classes)
        if size > num_samples and not self.warned:
            self.warned = True
            log.warning(
                "sampler=target: a batch of %d positions can hold more distinct targets than output.num_samples=%d, "
                "so each step's set holds %d classes",
                positions,
                num_samples,
                size,
            )
        return size


class TargetProposal(Proposal):
    """One step's candidate set, drawn by ``draw(m)``: ids (K,) with log q = -ln K each; ``log_q`` of any ids is
    -ln K inside the last drawn set and -inf outside it."""

    shared = fixes_num_samples = True  # the set holds max(m, N) classes

    def __init__(self, sampler: TargetSampler, targets: Tensor, positions: int) -> None:
        self.sampler, self.targets, self.positions = sampler, targets, positions
        self.ids: Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.sampler._anchor.device

    def draw(self, num_samples: int) -> Draws:
        size = self.sampler.set_size(num_samples, self.positions)
        anchor = self.sampler._anchor
        key = torch.rand(self.sampler.num_classes, device=anchor.device, dtype=anchor.dtype)  # (n,) in [0, 1)
        key.index_fill_(0, self.targets.to(anchor.device), 2.0)  # (n,) the targets above every other class
        self.ids = ids = key.topk(size, sorted=False).indices  # (K,) every distinct target, then random fillers
        log_q = constant(-math.log(size), anchor.device, anchor.dtype)  # one cached value: views, no fill
        return Draws(ids, log_q.expand(size), log_q.expand(self.positions, 1))

    def log_q(self, ids: Tensor) -> Tensor:
        if self.ids is None:
            raise ValueError("sampler=target knows its set after draw(m): draw first, then ask log_q")
        member = (ids.unsqueeze(-1) == self.ids).any(-1)  # (..., ) in the set
        inside = -math.log(self.ids.numel())
        return torch.where(member, inside, float("-inf")).to(self.sampler._anchor.dtype)
