"""Negative sampling (Mikolov et al. 2013): logistic regression of the target against noise (docs/strategies.md)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from lmtrain.output.sampled.base import SampledOutput
from lmtrain.output.sampled.estimators import logistic_loss, logistic_nll
from lmtrain.output.sampled.options import NegativeOptions


class NegativeSampling(SampledOutput):
    """loss = softplus(−s_t) + Σ_j softplus(s_{s_j}) with ``num_samples`` negatives from ``sampler``
    (``NegativeOptions``).

    The scores s = [W, b] . [h, 1] are the sampled-softmax scores; training does not estimate a
    normalized model, but evaluation normalizes the same scores with an exact full softmax.
    """

    name, companions = "negative", {"sampler": "noise"}  # output=negative: with unigram^0.75 noise
    Options: ClassVar[type[NegativeOptions]] = NegativeOptions

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        d = self.scored_draw(hidden, target, inputs)
        if self.gpu_paths:
            return logistic_nll(d.target_score, d.noise_score).mean()
        return logistic_loss(d.target_score, d.noise_score).mean()
