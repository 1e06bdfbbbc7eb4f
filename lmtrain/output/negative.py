"""Negative sampling (Mikolov et al. 2013): NCE without the noise correction (DESIGN §3)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lmtrain.output.sampled import SampledSoftmax
from lmtrain.sampler.base import Sampler


class NegativeSampling(SampledSoftmax):
    """loss = softplus(−s_t) + Σ_j softplus(s_{s_j}) with ``num_samples`` negatives from ``sampler``.

    The scores s = [W, b] . [h, 1] are the sampled-softmax scores; training does not estimate a
    normalized model, but evaluation normalizes the same scores with an exact full softmax.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler,
        num_samples: int = 100,
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

    def loss(self, hidden: Tensor, target: Tensor) -> Tensor:
        ids, _, _ = self.draw(hidden)
        query = self.query(hidden)  # (N, d')
        target_score = self.query_scores(query, target.unsqueeze(1))  # (N, 1)
        noise_scores = self.query_scores(query, ids)  # (N, m)
        return (F.softplus(-target_score).sum(1) + F.softplus(noise_scores).sum(1)).mean()
