"""The model's own softmax as proposal: the unbiased O(nd) reference (``output=exp``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmtrain.sampler.dense import DenseProposal, DenseSampler


class SoftmaxProposal(DenseProposal):
    """One step's softmax proposal: its table is log q of every class at every position (N, n)."""

    sampler: SoftmaxSampler

    def table(self) -> Tensor:
        return torch.log_softmax(self.sampler._score(self.query, self.weight), dim=1)  # (N, n)

    def weights(self, table: Tensor) -> Tensor:
        return table.exp()  # (N, n) q

    def lookup(self, table: Tensor, ids: Tensor | None) -> Tensor:
        return table if ids is None else table.gather(1, ids)  # (N, k)


class SoftmaxSampler(DenseSampler):
    """q(i | h) = softmax(score(query(h), weight))_i, per example: the output layer's own softmax over its current
    weights (its ``score``: the dot product by default, tau * cos for ``output=rff``, |o| for ``output=quadratic``).

    ``update`` keeps a reference to the weight it is given (no copy), so q always follows the live
    parameters. Every step costs a full (N, n) product: this is the reference that makes sampled
    softmax exact (docs/strategies.md), not a fast proposal.
    """

    name = "softmax"  # sampler=softmax
    proposal = SoftmaxProposal

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self._score: Callable[[Tensor, Tensor], Tensor] = lambda query, weight: query @ weight.T

    def use_scores(self, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        self._score = score  # e.g. tau * cos for output=rff, |o| for output=quadratic: q is then exactly p
