"""Absolute softmax p ∝ exp(|o|), trained with a quadratic-kernel proposal (Blanc & Rendle 2018)."""

from __future__ import annotations

from torch import Tensor

from lmtrain.output.sampled.softmax import SampledSoftmax


class AbsoluteSampledSoftmax(SampledSoftmax):
    """Sampled softmax over absolute logits |o_i| = |[h, 1] . [w_i, b_i]| (docs/strategies.md, ``output=quadratic``).

    The quadratic kernel alpha o^2 + 1 tracks exp(|o|) far better than exp(o), so this model is the
    one the quadratic proposal is paired with; training and exact evaluation both use |o|
    (evaluation normalizes exp(|o|) over all classes). Any sampler works; the config selects
    ``sampler=quadratic``, whose tree is refreshed in ``after_optimizer_step``.
    """

    name, companions = "quadratic", {"sampler": "quadratic"}  # output=quadratic: with the quadratic-kernel proposal
    signed_scores = False  # |o| would turn log-unigram biases (all negative) into a rare-word preference

    def row_logits(self, logit_query: Tensor, rows: Tensor) -> Tensor:
        return super().row_logits(logit_query, rows).abs()
