"""A kernel proposal mixed with the training unigram: q = (1 - s) q_kernel + s u (``sampler.unigram_share``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.unigram import UnigramSampler


class UnigramShare(nn.Module):
    """The unigram part of a kernel proposal mixed with the training unigram u.

    Why: a kernel proposal knows the geometry of h and the class vectors but not how frequent each word is, and
    where the model's softmax is sharper than the kernel (an RFF estimate of exp(nu cos) with nu well below the
    model's own scale) it under-draws the frequent words that carry most of p's mass. A share of draws from u
    bounds the importance weights of those words (defensive importance sampling).

    Draws are stratified: of m draws per position, m_u = round(s m) come from u and the rest from the kernel,
    and every id is corrected with the mixture density q = (1 - s') q_kernel + s' u with s' = m_u / m, which
    is exactly the expected share of draws at each class (the balance heuristic of multiple importance
    sampling). ``share`` is the s' of the last draw; ``log_q`` of ids drawn elsewhere (the targets) uses it.
    The m_u unigram ids are drawn once for the batch (u does not depend on the position), so the kernel's
    log q of them for every position costs one product with the few tree nodes on their paths
    (``kernel_log_q_shared``) instead of a path read per position and id.
    """

    def __init__(self, share: float, num_classes: int | None, counts: Tensor | None) -> None:
        super().__init__()
        if not 0.0 <= share < 1.0:
            raise ValueError(f"sampler.unigram_share must be in [0, 1) (the unigram's share of draws), got {share}")
        if counts is None:
            raise ValueError("sampler.unigram_share > 0 needs the training-split counts of the classes")
        self.nominal = float(share)
        self.share = float(share)
        self.unigram = UnigramSampler(num_classes or counts.numel(), counts, power=1.0)

    def split(self, num_samples: int) -> tuple[int, int]:
        """(kernel draws, unigram draws) per position for m = ``num_samples``; sets ``share`` to their ratio."""
        from_unigram = min(num_samples - 1, round(self.nominal * num_samples))
        self.share = from_unigram / num_samples
        return num_samples - from_unigram, from_unigram

    def draw(self, count: int) -> Tensor:
        """``count`` ids drawn from u, (count,)."""
        return self.unigram.sample(None, count)[0]

    def mix(self, log_kernel: Tensor, ids: Tensor | None = None) -> Tensor:
        """log q = log((1 - s') q_kernel + s' u) from the kernel's log-probabilities of ``ids`` (same shape), or of
        every class when ``ids`` is None (log_kernel (..., n))."""
        if self.share == 0.0:
            return log_kernel
        log_u = self.unigram.log_probs.to(log_kernel.dtype)
        log_u = log_u if ids is None else log_u[ids]
        return torch.logaddexp(log_kernel + math.log1p(-self.share), log_u + math.log(self.share))


def kernel_log_q_shared(tree: KernelTree, query: Tensor, ids: Tensor) -> Tensor:
    """Per-example kernel log q (N, k) of one set of ids (k,) shared by all queries (N, d): the walk's branch
    probabilities at the distinct nodes on the ids' paths, scored for all queries by one product, times the
    exact in-bucket probability. Equal to ``tree.log_q(query, ids.expand(N, -1))``."""
    n_query, k = query.shape[0], ids.numel()
    bucket = torch.div(ids, tree.bucket_size, rounding_mode="floor")  # (k,)
    logk, _ = tree._kernel_log_weights(query, bucket.repeat(n_query), k)  # (N k, L)
    pick = (ids - bucket * tree.bucket_size).repeat(n_query).unsqueeze(1)  # (N k, 1)
    log_q = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
    if tree.depth == 0:
        return log_q
    phi = tree.features(query)  # (N, F)
    parents, right = tree._path_parents(bucket)  # (k, depth) each
    distinct, inverse = torch.unique(parents, return_inverse=True)  # (u,), (k, depth)
    pairs = tree.nodes[1:].view(-1, 2, phi.shape[1]).index_select(0, distinct)  # (u, 2, F)
    floor = tree.floor[1:].view(-1, 2).index_select(0, distinct)  # (u, 2)
    s = torch.maximum((phi @ pairs.flatten(0, 1).T).view(n_query, -1, 2), floor)  # (N, u, 2)
    s = s[:, inverse]  # (N, k, depth, 2)
    chosen = s.gather(3, right.expand(n_query, -1, -1).unsqueeze(3)).squeeze(3)  # (N, k, depth)
    return log_q + (chosen.log() - s.sum(3).log()).sum(2)
