"""The quartic-kernel proposal of Blanc & Rendle (2018), q_i ∝ o_i^4 + 1, drawn by scoring every class."""

from __future__ import annotations

from torch import Tensor

from lmtrain.sampler.dense import DenseProposal, DenseSampler


class QuarticProposal(DenseProposal):
    """One step's quartic proposal: its table is the kernel value o^4 + 1 of every class at every position (N, n),
    normalized by its row sums only where log q is read."""

    def table(self) -> Tensor:
        return (self.query @ self.weight.T).pow_(4).add_(1)  # (N, n)

    def lookup(self, table: Tensor, ids: Tensor | None) -> Tensor:
        total = table.sum(1, keepdim=True)  # (N, 1)
        return (table if ids is None else table.gather(1, ids)).div_(total).log_()  # (N, k)


class QuarticSampler(DenseSampler):
    """q(i | h) = (o_i^4 + 1) / sum_j (o_j^4 + 1) with o_i = [h, 1] . [w_i, b_i], per position (``output=quartic``
    pairs it with the absolute softmax exp(|o|), which it tracks more closely than the quadratic kernel does).

    Its feature map (the degree-4 monomials of [h, 1]: about d'^4 / 24 entries) is far too wide for a kernel tree,
    so every step scores all n classes as ``sampler=softmax`` does: an (N, d') x (d', n) product, O(N n d') a step.
    ``update`` keeps a reference to the class vectors (no copy), so q follows the live weights. The raw dot product
    is its score whatever the output's (``use_scores`` is ignored).
    """

    name = "quartic"  # sampler=quartic
    proposal = QuarticProposal
