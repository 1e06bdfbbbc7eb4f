"""Cosine-similarity softmax with a temperature, trained with an RFF kernel proposal (Rawat et al. 2019)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.common.constants import constant, with_column
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

    name, companions = "rff", {"sampler": "rff"}  # output=rff: with the random-Fourier-feature proposal
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

    def unit(self, query: Tensor) -> Tensor:
        """The query normalized softly (``norm_eps``) or exactly, (N, d)."""
        eps = self.norm_eps
        if eps > 0:  # sqrt(|q|^2 + eps^2) is the norm of [q, eps]
            return query / torch.linalg.vector_norm(with_column(query, eps), dim=-1, keepdim=True)  # (N, d), |.| < 1
        return F.normalize(query, dim=-1)

    def logit_query(self, query: Tensor) -> Tensor:
        return self.unit(query)  # (N, d), once per call that scores it (targets and shared negatives: one unit)

    def row_logits(self, logit_query: Tensor, rows: Tensor) -> Tensor:
        # divide the dot products by the row norms instead of normalizing the (N, k, d) gathered rows
        dots = super().row_logits(logit_query, rows)  # (N, k)
        norms = rows.norm(dim=-1)  # (k,) or (N, k)
        # the clamp's floor added (the same value for any row of norm above 1e-5 in float32), and tau with it, in one
        # operator: dots / ((|w| + 1e-12) / tau)
        floor = constant(1e-12 / self.tau, norms.device, norms.dtype).expand_as(norms)
        return dots / torch.add(floor, norms, alpha=1 / self.tau)

    def extra_repr(self) -> str:
        return f"tau={self.tau:.4g}, norm_eps={self.norm_eps:.4g}"
