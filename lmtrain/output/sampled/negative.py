"""Negative sampling (Mikolov et al. 2013): logistic regression of the target against noise (docs/strategies.md)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from lmtrain.output.sampled.base import SampledOutput
from lmtrain.output.sampled.estimators import logistic_nll
from lmtrain.output.sampled.options import NegativeOptions


class NegativeSampling(SampledOutput):
    """loss = softplus(−s_t) + Σ_j softplus(s_{s_j}) with ``num_samples`` negatives from ``sampler``
    (``NegativeOptions``).

    The scores s = [W, b] . [h, 1] are the sampled-softmax scores; training does not estimate a
    normalized model, but evaluation normalizes the same scores with an exact full softmax.
    """

    name, companions = "negative", {"sampler": "noise"}  # output=negative: with unigram^0.75 noise
    Options: ClassVar[type[NegativeOptions]] = NegativeOptions
    corrects_with_log_q: ClassVar[bool] = False

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        d = self.negatives(hidden, target, inputs)
        nll = logistic_nll(d.target_scores, d.noise_scores).mean()
        return nll.to(torch.promote_types(nll.dtype, torch.float32))  # float32 under autocast, as the others' losses
