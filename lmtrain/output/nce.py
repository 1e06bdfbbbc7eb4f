"""Noise-contrastive estimation (Gutmann & Hyvärinen; Mnih & Teh 2012), self-normalized (DESIGN §3)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.output.sampled import SampledSoftmax
from lmtrain.sampler.base import Sampler


class NCE(SampledSoftmax):
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
        shared_negatives: bool = True,
        bias: bool = True,
        sparse: bool = True,
        init_range: float = 0.1,
        eval_chunk: int = 65536,
    ) -> None:
        super().__init__(
            num_classes,
            dim,
            sampler,
            num_samples=num_samples,
            remove_accidental_hits=False,
            shared_negatives=shared_negatives,
            bias=bias,
            sparse=sparse,
            init_range=init_range,
            eval_chunk=eval_chunk,
        )
        self.log_z = nn.Parameter(torch.zeros(())) if learn_log_z else None

    def log_z_value(self) -> Tensor:
        """The ln Z subtracted in training: the learned scalar, or 0."""
        return self.log_z if self.log_z is not None else self.weight.new_zeros(())

    def loss(self, hidden: Tensor, target: Tensor) -> Tensor:
        ids, log_q, _ = self.draw(hidden)
        query = self.query(hidden)  # (N, d')
        context = query.detach() if self.sampler.per_example else None
        log_q_target = self.sampler.log_q(context, target.unsqueeze(1))  # (N, 1)
        shift = math.log(self.num_samples) + self.log_z_value()  # ln k + ln Z
        delta_target = self.query_scores(query, target.unsqueeze(1)) - log_q_target - shift  # (N, 1)
        delta_noise = self.query_scores(query, ids) - log_q - shift  # (N, m)
        return (F.softplus(-delta_target).sum(1) + F.softplus(delta_noise).sum(1)).mean()

    def extra_metrics(self, hidden: Tensor) -> dict[str, Tensor]:
        metrics = {"log_z": self.log_normalizer(hidden).mean()}
        if self.log_z is not None:
            metrics["log_z_learned"] = self.log_z.detach()
        return metrics
