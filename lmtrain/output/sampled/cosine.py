"""Cosine-similarity softmax with a temperature, trained with an RFF kernel proposal (Rawat et al. 2019)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.common.constants import constant, with_column
from lmtrain.output.sampled.options import CosineOptions
from lmtrain.output.sampled.softmax import SampledSoftmax

# positions up to which the GPU paths score a step's targets and shared negatives by one product of every query with
# every gathered row (``CosineSampledSoftmax.joint_scores``). Its N x N block of scores no loss reads costs N^2 d
# multiply-adds, three times with the backward pass: at N = 2048 (d = 200) about 2.5 G, some 50 us of a GPU's float32
# arithmetic, against the 20 operators (100-400 us of launches) that the one gather and one pass of row norms save.
# Chosen by that estimate, not timed on a GPU
JOINT_POSITIONS = 2048


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
    _unit: tuple[Tensor, Tensor] | None = None  # the GPU paths' last (query, unit(query)), reused within a step

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
        if eps > 0 and self.gpu_paths:  # sqrt(|q|^2 + eps^2) is the norm of [q, eps]: 3 operators where 5 are below
            return query / torch.linalg.vector_norm(with_column(query, eps), dim=-1, keepdim=True)  # (N, d)
        if eps > 0:
            return query * torch.rsqrt(query.square().sum(-1, keepdim=True) + eps**2)  # (N, d), |.| < 1
        return F.normalize(query, dim=-1)

    def score(self, query: Tensor, rows: Tensor) -> Tensor:
        # divide the dot products by the row norms instead of normalizing the (N, k, d) gathered rows
        tau = self.tau
        if self.gpu_paths:  # a step scores its targets and its negatives with one query: normalize it once
            known = self._unit
            unit = known[1] if known is not None and known[0] is query else self.unit(query)
            self._unit = (query, unit) if query.requires_grad or unit.requires_grad else None
        else:
            unit = self.unit(query)
        dots = super().score(unit, rows)  # (N, k)
        norms = rows.norm(dim=-1)  # (k,) or (N, k)
        if self.gpu_paths:  # the clamp's floor added (the same value for any row of norm above 1e-5 in float32; an
            # addition's gradient passes as it is where a clamp's takes 3 operators), and tau with it, in one operator:
            # dots / ((|w| + 1e-12) / tau)
            floor = constant(1e-12 / tau, norms.device, norms.dtype).expand_as(norms)
            return dots / torch.add(floor, norms, alpha=1 / tau)
        return tau * dots / norms.clamp_min(1e-12)

    def joint_scores(self, query: Tensor, target: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The GPU paths' scores of the targets (N, 1) and of shared negatives (m,) -> (N, m), for at most
        ``JOINT_POSITIONS`` positions: one gather of the N + m rows, one pass of their norms and one product of every
        query with every row, (N, N + m), where a position's target is on the diagonal (the rest of the first N
        columns is not read). Two gathers would normalize rows twice and score twice, forward and
        backward: 20 operators more. Per-position negatives, and more positions: ``SampledOutput.joint_scores``."""
        positions = target.shape[0]
        if ids.dim() == 2 or positions > JOINT_POSITIONS:
            return super().joint_scores(query, target, ids)
        scores = self.query_scores(query, torch.cat([target, ids]))  # (N, N + m): every query against every row
        return scores.diagonal().unsqueeze(1), scores[:, positions:], None  # (N, 1) entries (i, i), (N, m)

    def extra_repr(self) -> str:
        return f"tau={self.tau:.4g}, norm_eps={self.norm_eps:.4g}"
