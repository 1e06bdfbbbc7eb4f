"""The model's own softmax as proposal: the unbiased O(nd) reference (``output=exp``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal


class SoftmaxSampler(Sampler):
    """q(i | h) = softmax(score(query(h), weight))_i, per example: the output layer's own softmax over its current
    weights (its ``score``: the dot product by default, tau * cos for ``output=rff``, |o| for ``output=quadratic``).

    ``update`` keeps a reference to the weight it is given (no copy), so q always follows the live
    parameters. Every step costs a full (N, n) product: this is the reference that makes sampled
    softmax exact (docs/strategies.md), not a fast proposal.
    """

    name = "softmax"  # sampler=softmax
    shared = False
    per_position_only: ClassVar[bool] = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self._weight: Tensor | None = None
        self._score: Callable[[Tensor, Tensor], Tensor] = lambda query, weight: query @ weight.T

    def use_scores(self, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        self._score = score  # e.g. tau * cos for output=rff, |o| for output=quadratic: q is then exactly p

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        self._weight = weight  # a (detached) view of the live parameter: always current

    def follow(self, weight: Tensor) -> None:
        self._weight = weight  # after model.to("cuda") the old reference would still point at the CPU copy

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> SoftmaxProposal:
        if query is None or self._weight is None:
            raise ValueError("SoftmaxSampler needs the query vectors and the weights (call update(weight) first)")
        return SoftmaxProposal(self, query, targets)


class SoftmaxProposal(Proposal):
    """One step's softmax proposal: its log-probabilities (N, n), computed once, give the draws and, in one gather
    with them, the targets' log q; ``draw`` lets the table go, so that it does not live through the backward pass
    (``log_q`` afterwards computes it again)."""

    per_position = True

    def __init__(self, sampler: SoftmaxSampler, query: Tensor, targets: Tensor | None) -> None:
        self.sampler, self.query, self.targets = sampler, query.detach(), targets
        self.positions = query.shape[0]

    @property
    def device(self) -> torch.device:
        return self.query.device

    def table(self) -> Tensor:
        """log q of every class at every position, (N, n)."""
        assert self.sampler._weight is not None  # propose checked it
        return torch.log_softmax(self.sampler._score(self.query, self.sampler._weight), dim=1)

    def draw(self, num_samples: int) -> Draws:
        log_probs = self.table()  # (N, n)
        ids = torch.multinomial(log_probs.exp(), num_samples, replacement=True)  # (N, m)
        if self.targets is None:
            return Draws(ids, log_probs.gather(1, ids), None)
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m)
        log_q = log_probs.gather(1, joint)  # (N, 1 + m), one lookup
        return Draws(joint[:, 1:], log_q[:, 1:], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.table().gather(1, ids)  # (N, k)

    def log_q_all(self, num_classes: int) -> Tensor:
        return self.table()
