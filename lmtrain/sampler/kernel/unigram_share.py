"""A kernel proposal mixed with the training unigram: q = (1 - s) q_kernel + s u (``sampler.unigram_share``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

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
    Each position draws its own unigram ids (ids shared by the batch push the same few frequent rows with the
    whole batch's gradient, which trains worse, as shared negatives do); their kernel log q is
    ``KernelTree.log_q_many``.
    """

    def __init__(self, share: float, num_classes: int | None, counts: Tensor | None) -> None:
        super().__init__()
        if counts is None:
            raise ValueError("sampler.unigram_share > 0 needs the training-split counts of the classes")
        self.nominal = float(share)
        self.share = float(share)
        self.unigram = UnigramSampler(num_classes or counts.numel(), counts, power=1.0)
        self._scaled: Tensor | None = None  # ``scaled_log_u``'s table, for the key below
        self._scaled_key: tuple[float, torch.dtype, torch.device] | None = None

    def split(self, num_samples: int) -> tuple[int, int]:
        """(kernel draws, unigram draws) per position for m = ``num_samples``; sets ``share`` to their ratio."""
        from_unigram = min(num_samples - 1, round(self.nominal * num_samples))
        self.share = from_unigram / num_samples
        return num_samples - from_unigram, from_unigram

    def draw(self, *shape: int) -> Tensor:
        """Ids drawn from u, of the given shape."""
        return self.unigram.draw_ids(math.prod(shape)).view(shape)

    def mix(self, log_kernel: Tensor, ids: Tensor | None = None) -> Tensor:
        """log q = log((1 - s') q_kernel + s' u) from the kernel's log-probabilities of ``ids`` (same shape), or of
        every class when ``ids`` is None (log_kernel (..., n))."""
        if self.share == 0.0:
            return log_kernel
        log_u = self.scaled_log_u(log_kernel.dtype)  # (n,) log(s' u)
        log_u = log_u if ids is None else log_u[ids]
        return torch.logaddexp(log_kernel + math.log1p(-self.share), log_u)

    def scaled_log_u(self, dtype: torch.dtype) -> Tensor:
        """log(s' u) of every class, (n,) in ``dtype``: made once per share, dtype and device (the same values as
        adding log s' to log u where it is read)."""
        probs = self.unigram.log_probs
        key = (self.share, dtype, probs.device)
        if key != self._scaled_key:
            self._scaled, self._scaled_key = probs.to(dtype) + math.log(self.share), key
        return self._scaled
