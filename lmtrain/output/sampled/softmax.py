"""Sampled softmax with the exact proposal correction of docs/strategies.md."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from lmtrain.output.sampled.base import SampledOutput
from lmtrain.output.sampled.estimators import (
    accidental_hits,
    classic_logits,
    draw_unique,
    exact_logits,
    exact_offsets,
    expected_count_logits,
    joint_softmax_nll,
    softmax_nll,
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
    Options: ClassVar[type[EstimatorOptions]] = SoftmaxOptions
    options: EstimatorOptions

    def check_options(self, num_classes: int, sampler: Sampler) -> None:
        if self.options.unique and (sampler.per_example or not self.shared_negatives):
            raise ValueError(
                "output.unique=true needs shared negatives for the batch: a context-free sampler (uniform, unigram) "
                "or a kernel sampler with output.shared_negatives=true"
            )
        if self.options.unique and self.options.num_samples >= num_classes:
            raise ValueError(
                f"output.unique=true needs num_samples < num_classes ({num_classes}), got {self.options.num_samples}"
            )

    def draw(
        self, hidden: Tensor, inputs: Tensor | None = None, proposal: Proposal | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if not self.options.unique:
            return super().draw(hidden, inputs, proposal)
        proposal = self.propose(self.query(hidden), inputs) if proposal is None else proposal
        return draw_unique(proposal, self.options.num_samples)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        d = self.scored_draw(hidden, target, inputs)
        return self.sampled_nll(
            d.query,
            target,
            d.target_score,
            d.noise_score,
            d.ids,
            d.log_q,
            d.tries,
            inputs,
            d.proposal,
            d.scores,
            mean=True,
        )

    def sampled_nll(
        self,
        query: Tensor,
        target: Tensor,
        target_logit: Tensor,
        neg_logits: Tensor,
        ids: Tensor,
        log_q: Tensor,
        tries: Tensor | None,
        inputs: Tensor | None = None,
        proposal: Proposal | None = None,
        scores: Tensor | None = None,
        mean: bool = False,
    ) -> Tensor:
        """The per-position sampled-softmax loss (N,) from the logits of the targets (N, 1) and of the drawn
        ids (N, m) (``draw``'s ids, log q and tries; ``inputs`` and ``proposal`` as given to ``draw``): the estimator
        that training minimises and that ``lmtrain.diagnose`` differentiates with respect to the logits. ``scores``:
        the (N, 1 + m) tensor that both logits are views of, where there is one (the GPU paths' ``Draw.scores``).
        ``mean``: its mean over the positions instead, the training loss."""
        opts = self.options
        hits = accidental_hits(ids, target)  # (N, m)
        log_q = log_q.expand_as(neg_logits)  # (N, m)
        if tries is not None:  # distinct draws: expected counts
            neg_logits = expected_count_logits(neg_logits, log_q, tries)
        elif opts.correction == "exact" and opts.remove_accidental_hits:
            log_q_target = self.target_log_q(query, target, inputs, proposal).reshape(-1)  # (N,)
            if self.gpu_paths:  # the same logits, hits removed, in fewer operators
                offsets = exact_offsets(log_q, log_q_target, hits, opts.num_samples)  # (N, m)
                if scores is not None:
                    return joint_softmax_nll(scores, offsets, mean)
                nll = softmax_nll(target_logit, neg_logits - offsets)
                return nll.mean() if mean else nll
            neg_logits = exact_logits(neg_logits, log_q, log_q_target, hits, opts.num_samples)
        else:  # classic, and exact when no negative is removed (the two agree then)
            neg_logits = classic_logits(neg_logits, log_q, opts.num_samples)
        if opts.remove_accidental_hits:
            neg_logits = neg_logits.masked_fill(hits, float("-inf"))
        nll = softmax_nll(target_logit, neg_logits)
        return nll.mean() if mean else nll
