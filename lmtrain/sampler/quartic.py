"""The quartic-kernel proposal of Blanc & Rendle (2018), q_i ∝ o_i^4 + 1, drawn by scoring every class."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal


class QuarticSampler(Sampler):
    """q(i | h) = (o_i^4 + 1) / sum_j (o_j^4 + 1) with o_i = [h, 1] . [w_i, b_i], per position (``output=quartic``
    pairs it with the absolute softmax exp(|o|), which it tracks more closely than the quadratic kernel does).

    Its feature map (the degree-4 monomials of [h, 1]: about d'^4 / 24 entries) is far too wide for a kernel tree,
    so every step scores all n classes as ``sampler=softmax`` does: an (N, d') x (d', n) product, O(N n d') a step.
    ``update`` keeps a reference to the class vectors (no copy), so q follows the live weights.
    """

    name = "quartic"  # sampler=quartic
    shared = False
    per_position_only: ClassVar[bool] = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self._weight: Tensor | None = None

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        self._weight = weight  # a (detached) view of the live parameter: always current

    def follow(self, weight: Tensor) -> None:
        self._weight = weight  # after model.to("cuda") the old reference would still point at the CPU copy

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> QuarticProposal:
        if query is None or self._weight is None:
            raise ValueError("sampler=quartic needs the query vectors and the weights (call update(weight) first)")
        return QuarticProposal(self, query, targets)


class QuarticProposal(Proposal):
    """One step's quartic proposal: the kernel values (N, n), computed once, give the draws and, in one gather with
    them, the targets' log q; ``draw`` lets them go, so that they do not live through the backward pass."""

    per_position = True

    def __init__(self, sampler: QuarticSampler, query: Tensor, targets: Tensor | None) -> None:
        self.sampler, self.query, self.targets = sampler, query.detach(), targets
        self.positions = query.shape[0]

    @property
    def device(self) -> torch.device:
        return self.query.device

    def kernel(self) -> tuple[Tensor, Tensor]:
        """o^4 + 1 of every class at every position (N, n), and its row sums (N, 1)."""
        assert self.sampler._weight is not None  # propose checked it
        kernel = (self.query @ self.sampler._weight.T).pow_(4).add_(1)  # (N, n)
        return kernel, kernel.sum(1, keepdim=True)  # (N, n), (N, 1)

    @staticmethod
    def log_q_of(kernel: Tensor, total: Tensor, ids: Tensor) -> Tensor:
        """log q (N, k) of ids (N, k): the gathered kernel values over their row sums, normalized only there."""
        return kernel.gather(1, ids).div_(total).log_()

    def draw(self, num_samples: int) -> Draws:
        kernel, total = self.kernel()  # (N, n), (N, 1)
        ids = torch.multinomial(kernel, num_samples, replacement=True)  # (N, m), rows normalized by multinomial
        if self.targets is None:
            return Draws(ids, self.log_q_of(kernel, total, ids), None)
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m)
        log_q = self.log_q_of(kernel, total, joint)  # (N, 1 + m), one lookup
        return Draws(joint[:, 1:], log_q[:, 1:], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.log_q_of(*self.kernel(), ids.expand(self.positions, -1))  # (N, k)

    def log_q_all(self, num_classes: int) -> Tensor:
        kernel, total = self.kernel()
        return kernel.div_(total).log_()  # (N, n)
