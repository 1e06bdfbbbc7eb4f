"""Noise-contrastive estimation (Gutmann & Hyvärinen; Mnih & Teh 2012), self-normalized (docs/strategies.md)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from lmtrain.output.negative import NegativeSampling
from lmtrain.sampler.base import Sampler


class NCE(NegativeSampling):
    """Binary classification of the target against ``num_samples`` noise draws from ``sampler``.

    With Δ_w = s_w − ln(k q_w) − ln Z: loss = softplus(−Δ_t) + Σ_j softplus(Δ_{s_j}), averaged over
    positions. ln Z is 0 (self-normalization) or, with ``learn_log_z``, one learned scalar. The scores
    s = [W, b] . [h, 1] are the sampled-softmax scores, and evaluation is their exact full softmax;
    ``extra_metrics`` reports the mean ln Σ_i exp(s_i) to show how self-normalized the model is.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler,
        num_samples: int = 100,
        learn_log_z: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(num_classes, dim, sampler, num_samples=num_samples, **options)
        self.log_z = nn.Parameter(torch.zeros(())) if learn_log_z else None

    def log_z_value(self) -> Tensor:
        """The ln Z subtracted in training: the learned scalar, or 0."""
        return self.log_z if self.log_z is not None else self.weight.new_zeros(())

    def classifier_logits(
        self,
        query: Tensor,
        target: Tensor,
        target_score: Tensor,
        noise_log_q: Tensor,
        noise_score: Tensor,
        inputs: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        log_q_target = self.target_log_q(query, target, inputs)  # (N, 1)
        shift = math.log(self.num_samples) + self.log_z_value()  # ln k + ln Z
        return target_score - log_q_target - shift, noise_score - noise_log_q - shift  # Δ_t, Δ_{s_j}

    def extra_metrics(self, hidden: Tensor) -> dict[str, Tensor]:
        metrics = {"log_z": self.log_normalizer(hidden).mean()}
        if self.log_z is not None:
            metrics["log_z_learned"] = self.log_z.detach()
        return metrics
