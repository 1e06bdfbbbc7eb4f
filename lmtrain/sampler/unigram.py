"""Unigram^power and log-uniform (Zipf) proposals with O(1) alias-table draws (context-free)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.options import UnigramOptions
from lmtrain.sampler.proposal import TableProposal, positions_of

_SCALE_BITS = 32  # alias thresholds are integers in [0, 2^32]: exact probabilities, immune to dtype casts


class UnigramSampler(Sampler):
    """q_i ∝ base_i ** power, drawn in O(1) per sample from a Walker/Vose alias table.

    ``distribution="unigram"``: base_i = counts_i + ``smoothing`` (training-split counts; the floor keeps
    q > 0, hence log q finite, for classes never seen in training). ``distribution="log_uniform"``:
    base_i = ln((i + 2) / (i + 1)), the Zipf-like proposal for frequency-ordered vocabularies (no counts
    needed). ``power`` = 0.75 gives the word2vec / NCE noise, 1.0 the plain unigram.

    The table is built without Python loops over classes; its bucket thresholds are integers, so the
    distribution actually sampled is known exactly and ``log_q`` returns exactly that distribution.
    """

    name, Options = "unigram", UnigramOptions  # sampler=unigram (sampler=noise: power 0.75, conf/sampler/noise.yaml)
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "counts")
    context_free = True

    def __init__(self, num_classes: int, counts: Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = opts = UnigramOptions(**options)  # the keys left out take their defaults
        power, distribution, smoothing = opts.power, opts.distribution, opts.smoothing
        if num_classes < 2 or num_classes >= 2**30:
            raise ValueError(f"UnigramSampler needs 2 <= num_classes < 2^30, got {num_classes}")
        self.num_classes, self.power, self.distribution = num_classes, float(power), distribution
        base = self._base_weights(num_classes, counts, distribution, smoothing)  # (n,) float64, all > 0
        threshold, alias = alias_table(base.pow(self.power))
        # (n, 2) int64: bucket k's threshold in [0, 2^32] and its alias, side by side so one gather reads both
        self.register_buffer("buckets", torch.stack([threshold, alias], 1), persistent=False)
        mass = threshold.clone()  # (n,) each class's exact share of the n * 2^32 integer cells
        mass.scatter_add_(0, alias, (1 << _SCALE_BITS) - threshold)
        log_probs = mass.double().log() - torch.tensor(num_classes * 2.0**_SCALE_BITS, dtype=torch.float64).log()
        self.register_buffer("log_probs", log_probs.to(torch.get_default_dtype()), persistent=False)  # (n,)

    @staticmethod
    def _base_weights(n: int, counts: Tensor | None, distribution: str, smoothing: float) -> Tensor:
        if distribution == "log_uniform":
            rank = torch.arange(n, dtype=torch.float64)
            return torch.log1p(1.0 / (rank + 1.0))  # ln((i + 2) / (i + 1))
        if counts is None:
            raise ValueError("sampler.distribution=unigram needs the training-split counts; use log_uniform without")
        if counts.numel() != n:
            raise ValueError(f"counts has {counts.numel()} entries but num_classes is {n}; pass one count per class")
        if bool((counts < 0).any()):  # smoothing > 0 (UnigramOptions) then keeps every q_i > 0
            raise ValueError("counts must be >= 0 so that every q_i > 0")
        return counts.detach().cpu().to(torch.float64) + smoothing

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> TableProposal:
        return TableProposal(self.draw_ids, self.log_probs, positions_of(query, inputs, targets), self.shared, targets)

    def draw_ids(self, num_samples: int) -> Tensor:
        """``num_samples`` ids (k,) drawn from the alias table."""
        device = self.buckets.device
        bucket = torch.randint(self.num_classes, (num_samples,), device=device)  # (k,)
        coin = torch.randint(1 << _SCALE_BITS, (num_samples,), device=device)  # (k,) uniform integer
        threshold, alias = self.buckets[bucket].unbind(1)  # (k,) each, views of one gather
        return torch.where(coin < threshold, bucket, alias)  # (k,)


def alias_table(weights: Tensor) -> tuple[Tensor, Tensor]:
    """Vectorized alias table for weights (n,) > 0: (thresholds in [0, 2^32], alias ids), both int64 (n,).

    Bucket k keeps class k when a uniform integer in [0, 2^32) is below threshold k, else gives alias k.
    Construction (a vectorized Vose sweep): scale weights to mean 1; light classes (w < 1) are topped up,
    in order, from the excess of heavy classes (w >= 1), in order; heavy j keeps 1 + E_j - D (E_j = excess
    prefix, D = deficit prefix when its bucket is placed) and is topped up by heavy j + 1. Every interval
    lies inside one heavy's supply, so each bucket holds at most two classes.
    """
    n = weights.numel()
    w = weights.to(torch.float64) * (n / weights.to(torch.float64).sum())  # (n,) mean 1
    light = (w < 1).nonzero().squeeze(1)  # (a,)
    heavy = (w >= 1).nonzero().squeeze(1)  # (b,) never empty: the mean is 1
    deficit = torch.cat([w.new_zeros(1), (1 - w[light]).cumsum(0)])  # (a + 1,) D_0 .. D_a
    excess = (w[heavy] - 1).cumsum(0)  # (b,) E_1 .. E_b
    placed = torch.searchsorted(deficit, excess).clamp(max=light.numel())  # (b,) lights before heavy j
    own = torch.zeros(n, dtype=torch.float64)
    alias = torch.arange(n)
    own[light] = w[light]
    own[heavy] = (1 + excess - deficit[placed]).clamp(0, 1)
    own[heavy[-1]] = 1.0  # the last heavy fills its own bucket (up to rounding)
    alias[heavy[:-1]] = heavy[1:]
    donor = torch.searchsorted(excess, deficit[:-1], right=True).clamp(max=heavy.numel() - 1)  # (a,)
    alias[light] = heavy[donor]
    threshold = (own * float(1 << _SCALE_BITS)).round().to(torch.int64)  # (n,)
    threshold[light] = threshold[light].clamp(min=1)  # every class keeps a nonzero probability
    return threshold, alias
