"""Negative sampling (Mikolov et al. 2013): logistic regression of the target against noise (docs/strategies.md)."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from lmtrain.output.sampled import SampledSoftmax
from lmtrain.sampler.base import Sampler


class NegativeSampling(SampledSoftmax):
    """loss = softplus(−s_t) + Σ_j softplus(s_{s_j}) with ``num_samples`` negatives from ``sampler``.

    The scores s = [W, b] . [h, 1] are the sampled-softmax scores; training does not estimate a
    normalized model, but evaluation normalizes the same scores with an exact full softmax.
    Subclasses change the classifier's logits (NCE subtracts ln(k q_w) + ln Z) in ``classifier_logits``.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler,
        num_samples: int = 100,
        shared_negatives: bool | None = None,
        bias: bool = True,
        sparse: bool = True,
        init_range: float = 0.1,
        eval_chunk: int = 65536,
        bias_init: Literal["zero", "log_unigram"] = "zero",
        counts: Tensor | None = None,
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
            bias_init=bias_init,
            counts=counts,
        )

    def classifier_logits(
        self,
        query: Tensor,
        target: Tensor,
        target_score: Tensor,
        noise_log_q: Tensor,
        noise_score: Tensor,
        inputs: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Logits of "data, not noise" for the target (N, 1) and the noise draws (N, m): the raw scores here.
        ``inputs`` (N,) are the input tokens, for a noise conditioned on them."""
        return target_score, noise_score

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        query = self.query(hidden)  # (N, d'), built once for the draw and the scores
        ids, log_q, _ = self.draw(hidden, inputs, query)
        target_score = self.query_scores(query, target.unsqueeze(1))  # (N, 1)
        noise_score = self.query_scores(query, ids)  # (N, m)
        target_logit, noise_logit = self.classifier_logits(query, target, target_score, log_q, noise_score, inputs)
        return (F.softplus(-target_logit).sum(1) + F.softplus(noise_logit).sum(1)).mean()
