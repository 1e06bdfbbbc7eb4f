"""Proposals that score every class at every position (``sampler=softmax``, ``sampler=quartic``): the sampler keeps
a reference to the live class vectors, and one step's proposal computes its (N, n) table once for the draws and
the targets' log q."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal


class DenseSampler(Sampler):
    """A per-position proposal q(i | h) from the scores of every class against the query: an (N, d') x (d', n)
    product every step, O(N n d'). ``update`` keeps a reference to the class vectors it is given (no copy), so q
    follows the live weights. A subclass names the proposal that turns the scores into q (``proposal``)."""

    shared = False
    per_position_only: ClassVar[bool] = True
    proposal: ClassVar[type[DenseProposal]]

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self._weight: Tensor | None = None

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        self._weight = weight  # a (detached) view of the live parameter: always current

    def follow(self, weight: Tensor) -> None:
        self._weight = weight  # after model.to("cuda") the old reference would still point at the CPU copy

    def propose(self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None) -> Proposal:
        if query is None or self._weight is None:
            raise ValueError(f"sampler={self.name} needs the query vectors and the weights (call update(weight) first)")
        return self.proposal(self, query, targets)


class DenseProposal(Proposal):
    """One step's proposal over every class: its table (N, n), computed once in ``draw``, gives the draws and, in one
    gather with them, the targets' log q; ``draw`` lets it go, so that it does not live through the backward pass
    (``log_q`` afterwards computes it again). A subclass says what the table is (``table``), what the draws are
    drawn in proportion to (``weights``) and how log q is read from it (``lookup``)."""

    per_position = True

    def __init__(self, sampler: DenseSampler, query: Tensor, targets: Tensor | None) -> None:
        self.sampler, self.query, self.targets = sampler, query.detach(), targets
        self.positions = query.shape[0]

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def weight(self) -> Tensor:
        """The class vectors (n, d') the sampler holds (``propose`` checked that it holds them)."""
        assert self.sampler._weight is not None
        return self.sampler._weight

    def table(self) -> Tensor:
        """The proposal of every class at every position, (N, n)."""
        raise NotImplementedError

    def weights(self, table: Tensor) -> Tensor:
        """Non-negative (N, n), each row in proportion to q, for ``torch.multinomial``. Default: the table."""
        return table

    def lookup(self, table: Tensor, ids: Tensor | None) -> Tensor:
        """log q (N, k) of ids (N, k) read from ``table``; ``ids`` None: of every class (N, n), ``table`` may be
        overwritten then."""
        raise NotImplementedError

    def draw(self, num_samples: int) -> Draws:
        table = self.table()  # (N, n)
        ids = torch.multinomial(self.weights(table), num_samples, replacement=True)  # (N, m)
        if self.targets is None:
            return Draws(ids, self.lookup(table, ids), None)
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m)
        log_q = self.lookup(table, joint)  # (N, 1 + m), one lookup
        return Draws(joint[:, 1:], log_q[:, 1:], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.lookup(self.table(), ids.expand(self.positions, -1))  # (N, k)

    def log_q_all(self, num_classes: int) -> Tensor:
        return self.lookup(self.table(), None)  # (N, n)
