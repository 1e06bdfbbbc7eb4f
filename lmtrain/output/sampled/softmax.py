"""Sampled softmax with the exact proposal correction of docs/strategies.md."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from lmtrain.output.base import ExactClasses
from lmtrain.output.sampled.base import Drawn, SampledOutput
from lmtrain.output.sampled.estimators import (
    accidental_hits,
    classic_offsets,
    draw_unique,
    exact_offsets,
    expected_count_offsets,
    joint_softmax_nll,
)
from lmtrain.output.sampled.options import EstimatorOptions, SoftmaxOptions
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Proposal


class SampledSoftmax(SampledOutput):
    """Softmax trained on the target plus ``num_samples`` negatives drawn from ``sampler`` (``SoftmaxOptions``).

    Context-free samplers share negatives by default and draw N x m with ``shared_negatives=false``; kernel samplers
    draw per position by default and, with ``shared_negatives=true``, m for the batch from the mixture of the
    batch's proposals (then log q of every position's target is the mixture's); samplers with only a per-position
    mode (softmax, bigram) ignore it. ``unique`` draws distinct negatives and corrects with expected counts;
    ``correction`` picks the exact estimator (docs/strategies.md) or the classic ln(m q) one;
    ``remove_accidental_hits`` masks negatives equal to the target. Subclasses change the logit (absolute, cosine)
    by overriding ``score``.
    """

    name, companions = "sampled", {"sampler": "uniform"}  # output=sampled, with sampler=uniform unless one is chosen
    holds_exact_classes = True
    Options: ClassVar[type[EstimatorOptions]] = SoftmaxOptions
    options: EstimatorOptions

    def check_options(self, num_classes: int, sampler: Sampler) -> None:
        if self.options.unique and not self.shared_negatives:
            raise ValueError(
                "output.unique=true needs shared negatives for the batch: a context-free sampler (uniform, unigram) "
                "or a kernel sampler with output.shared_negatives=true"
            )
        if self.options.unique and self.options.num_samples >= num_classes:
            raise ValueError(
                f"output.unique=true needs num_samples < num_classes ({num_classes}), got {self.options.num_samples}"
            )

    def draw(self, proposal: Proposal) -> Drawn:
        if not self.options.unique:
            return super().draw(proposal)
        return Drawn(*draw_unique(proposal, self.options.num_samples))

    def loss(
        self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None, exact: ExactClasses | None = None
    ) -> Tensor:
        """The mean sampled NLL; with ``exact``, its classes join every position's normalizer as they are (offset
        0, the target's own entry left to the target) and their drawn copies leave the sample. Each correction's
        weights stay unbiased for the classes outside the set, which a draw from the proposal reaches alike."""
        d = self.negatives(hidden, target, inputs)
        offsets = self.offsets(target, d.ids, d.log_q, d.target_log_q, d.tries)  # (N, m)
        if exact is None:
            return joint_softmax_nll(d.scores, offsets, mean=True)
        offsets = offsets.masked_fill(exact.member[d.ids].expand(offsets.shape), float("inf"))  # (N, m)
        known = self.id_logits(self.logit_query(self.query(hidden)), exact.ids)  # (N, r)
        kept = exact.include.unsqueeze(0) & (exact.ids.unsqueeze(0) != target.unsqueeze(1))  # (N, r)
        known_offsets = torch.zeros_like(known).masked_fill_(~kept, float("inf"))  # (N, r)
        scores = torch.cat([d.scores, known], dim=1)  # (N, 1 + m + r)
        return joint_softmax_nll(scores, torch.cat([offsets, known_offsets], dim=1), mean=True)

    def offsets(self, target: Tensor, ids: Tensor, log_q: Tensor, target_log_q: Tensor, tries: Tensor | None) -> Tensor:
        """What the estimator subtracts from each negative's score, (N, m), +inf where a negative is removed: the
        exact correction (docs/strategies.md), the classic ln(m q), or for distinct draws the log of their expected
        counts. ``ids`` and ``log_q`` (m,) shared or (N, m), ``target_log_q`` (N, 1), ``tries`` as ``draw``'s.
        ``lmtrain.diagnose`` differentiates the loss built from them with respect to the scores."""
        opts = self.options
        hits = accidental_hits(ids, target)  # (N, m)
        log_q = log_q.expand(hits.shape)  # (N, m)
        drawn = ids.shape[-1]  # m as drawn: a proposal may fix its own (in-batch negatives)
        if tries is None and opts.correction == "exact" and opts.remove_accidental_hits:
            return exact_offsets(log_q, target_log_q.reshape(-1), hits, drawn)
        # classic, and exact when no negative is removed (the two agree then)
        offsets = classic_offsets(log_q, drawn) if tries is None else expected_count_offsets(log_q, tries)
        return offsets.masked_fill(hits, float("inf")) if opts.remove_accidental_hits else offsets
