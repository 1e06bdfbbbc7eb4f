"""Noise-contrastive estimation (Gutmann & Hyvärinen; Mnih & Teh 2012), self-normalized (docs/strategies.md)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmtrain.output.sampled.base import SampledOutput
from lmtrain.output.sampled.estimators import logistic_nll, noise_contrast_logits, noise_offset
from lmtrain.output.sampled.options import NCEOptions
from lmtrain.sampler.base import Sampler


class NCE(SampledOutput):
    """Binary classification of the target against ``num_samples`` noise draws from ``sampler`` (``NCEOptions``).

    With Δ_w = s_w − ln(k q_w) − ln Z: loss = softplus(−Δ_t) + Σ_j softplus(Δ_{s_j}), averaged over
    positions. ln Z is 0 (self-normalization) or, with ``learn_log_z``, one learned scalar. The scores
    s = [W, b] . [h, 1] are the sampled-softmax scores, and evaluation is their exact full softmax;
    ``extra_metrics`` reports the mean ln Σ_i exp(s_i) to show how self-normalized the model is.
    """

    name, companions = "nce", {"sampler": "noise"}  # output=nce: with unigram^0.75 noise (conf/sampler/noise.yaml)
    Options: ClassVar[type[NCEOptions]] = NCEOptions
    options: NCEOptions

    def __init__(
        self, num_classes: int, dim: int, sampler: Sampler, counts: Tensor | None = None, **options: Any
    ) -> None:
        super().__init__(num_classes, dim, sampler, counts, **options)
        self.log_z = nn.Parameter(torch.zeros(())) if self.options.learn_log_z else None

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        d = self.negatives(hidden, target, inputs)
        offset = noise_offset(d.ids.shape[-1], self.log_z)  # ln k + ln Z, k as drawn
        target_logit = noise_contrast_logits(d.target_scores, d.target_log_q, offset)  # Δ_t (N, 1)
        return logistic_nll(target_logit, noise_contrast_logits(d.noise_scores, d.log_q, offset)).mean()

    def extra_metrics(self, hidden: Tensor) -> dict[str, Tensor]:
        metrics = {"log_z": self.log_normalizer(hidden).mean()}
        if self.log_z is not None:
            metrics["log_z_learned"] = self.log_z.detach()
        return metrics
