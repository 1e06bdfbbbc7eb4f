"""Cosine-similarity softmax with a temperature, trained with an RFF kernel proposal (Rawat et al. 2019)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.output.sampled.options import CosineOptions
from lmtrain.output.sampled.softmax import SampledSoftmax


class CosineSampledSoftmax(SampledSoftmax):
    """Sampled softmax over logits tau * <h / |h|, w_i / |w_i|> with normalized embeddings and no bias (``output=rff``).

    The RFF kernel exp(nu cos) is a proposal for exactly this model; ``tau`` (default 1 / 0.3^2) is
    the inverse temperature of the logits. Exact evaluation is the full softmax over the same logits.

    ``norm_eps`` (default 2) normalizes the hidden state softly, h / sqrt(|h|^2 + eps^2): the unit vector once
    |h| >> eps, but linear near zero, so the gradient into the LSTM is at most tau / eps instead of tau / |h|.
    With exact normalization (``norm_eps=0``) the gradient scales as tau / |h|, and a freshly initialized LSTM has
    |h| below 1, so it receives gradients far larger than under a dot-product softmax; SGD at lr 1 then drives
    every position to one saturated hidden state within the first steps (the measurements: docs/strategies.md,
    "Why the hidden state is normalized softly"). The class vectors are always normalized exactly.
    """

    Options: ClassVar[type[CosineOptions]] = CosineOptions
    options: CosineOptions

    @property
    def tau(self) -> float:
        """The inverse temperature of the logits (``options.tau``)."""
        return float(self.options.tau)

    @property
    def norm_eps(self) -> float:
        """The soft normalization of the hidden state (``options.norm_eps``; 0: exact h / |h|)."""
        return float(self.options.norm_eps)

    def score(self, query: Tensor, rows: Tensor) -> Tensor:
        # divide the dot products by the row norms instead of normalizing the (N, k, d) gathered rows
        eps, tau = self.norm_eps, self.tau
        if eps > 0:
            unit = query * torch.rsqrt(query.square().sum(-1, keepdim=True) + eps**2)  # (N, d), |.| < 1
        else:
            unit = F.normalize(query, dim=-1)
        dots = super().score(unit, rows)  # (N, k)
        return tau * dots / rows.norm(dim=-1).clamp_min(1e-12)  # norms (k,) or (N, k)

    def extra_repr(self) -> str:
        return f"tau={self.tau:.4g}, norm_eps={self.norm_eps:.4g}"
