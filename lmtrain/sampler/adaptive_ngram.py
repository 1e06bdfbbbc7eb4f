"""Adaptive importance sampling (Bengio & Senécal 2008): a mixture of the unigram and the bigram of the previous word
whose weights, per frequency bin of that word, are trained during training to bring q closer to the model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.sampler.bigram import BigramSampler, PreviousWordSampler
from lmtrain.sampler.proposal import Draws, Proposal

# the BigramSampler whose tables this sampler reads is built with this unigram weight, so that its bigram term
# pair_q = (1 - 1/2) c(p, j) / c(p) gives c(p, j) / c(p) by an exact doubling
_HALF = 0.5


@dataclass
class AdaptiveNgramOptions(Checked):
    """``sampler=adaptive_ngram``: q(j | p) = (1 - pi(p)) u(j) + pi(p) c(p, j) / c(p), the bigram's weight pi per
    frequency bin of the previous word p learned during training (docs/strategies.md)."""

    # bins of the previous word by its frequency rank, each about 1 / num_bins of the training tokens
    num_bins: int = field(default=8, metadata=AT_LEAST_1)
    lr: float = field(default=1.0, metadata={"at_least": 0})  # SGD step of the mixture logits; 0 keeps them fixed
    unigram_weight: float = field(default=0.25, metadata={"above": 0, "below": 1})  # 1 - pi in every bin at the start
    smoothing: float = field(default=1.0, metadata={"above": 0})  # added to every unigram count


class AdaptiveNgramSampler(PreviousWordSampler):
    """A per-position proposal mixing the smoothed training unigram u and the bigram c(p, j) / c(p) of the previous
    word p (c(p) = 0: the unigram again), the bigram's weight pi = sigmoid(``logits[bin(p)]``) per frequency bin.

    Tables and draws are ``BigramSampler``'s: a coin with probability pi picks a random training successor of p,
    else an alias-table draw of u. log q is the mixture under the weight that drew the ids, in float64.

    The weights adapt: the sampled output hands each proposal the logits s_j of its draws (``Proposal.observe``);
    with self-normalized importance weights r_j = softmax_j(s_j - log q_j) over a position's m draws, -sum_j r_j
    log q(j | p) estimates the cross-entropy of the model's distribution under q, which differs from KL(p || q) by
    the model's entropy alone. Its gradient in the logit of bin(p) is -sum_j r_j (post_j - pi) = -pi (sum_j r_j
    B_j / q_j - 1) (post_j = pi B_j / q_j: the bigram's posterior given draw j), averaged over the positions and
    gathered in ``pending``; ``update`` (after each optimizer step) takes one SGD step of ``lr``. ``logits`` and
    ``pending`` are buffers: in checkpoints, outside the model's optimizer. Under DDP the ranks average ``pending``
    first, so that every rank keeps the same weights.
    """

    name, Options = "adaptive_ngram", AdaptiveNgramOptions  # sampler=adaptive_ngram

    def __init__(self, num_classes: int, train_ids: Tensor | None = None, **options: Any) -> None:
        super().__init__(train_ids)
        self.options = opts = AdaptiveNgramOptions(**options)  # the keys left out take their defaults
        self.bigram = BigramSampler(num_classes, train_ids, unigram_weight=_HALF, smoothing=opts.smoothing)
        self.num_classes = num_classes
        count = self.bigram.count  # (n,) c(p): how often each word precedes another in training
        order = torch.sort(count, descending=True, stable=True).indices  # (n,) frequency ranks, ties by id
        before = (count[order].cumsum(0) - count[order]).double() / count.sum()  # (n,) token share of higher ranks
        bins = torch.empty_like(order)
        bins[order] = (before * opts.num_bins).long().clamp(max=opts.num_bins - 1)  # (n,) equal token shares
        self.register_buffer("bins", bins, persistent=False)  # (n,) derived from train_ids
        start = math.log((1 - opts.unigram_weight) / opts.unigram_weight)  # the logit of pi = 1 - unigram_weight
        self.register_buffer("logits", torch.full((opts.num_bins,), start))  # (bins,) learned
        self.register_buffer("pending", torch.zeros(opts.num_bins))  # (bins,) the next step's ascent direction

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> AdaptiveNgramProposal:
        return AdaptiveNgramProposal(self, self.previous(query, inputs, self.bins.device), targets)

    def components(self, prev: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """u(j) and c(p, j) / c(p) (c(p) = 0: u(j)), float64 (N, k) each, of ids (N, k) or (k,) after ``prev``."""
        unigram = self.bigram.unigram_q[ids].expand(prev.numel(), -1)  # (N, k)
        pair = self.bigram.pair_lookup(prev, ids, self.bigram.pair_q).mul_(1 / _HALF)  # (N, k) c(p, j) / c(p)
        return unigram, torch.where((self.bigram.count[prev] > 0).unsqueeze(1), pair, unigram)  # (N, k)

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        """After an optimizer step: one SGD step of the mixture logits on what the step's draws gathered."""
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.pending)  # every rank steps alike
            self.pending.div_(dist.get_world_size())
        self.logits.add_(self.pending, alpha=self.options.lr)
        self.pending.zero_()

    def rebuild(self, weight: Tensor) -> None:
        """Nothing here derives from the class vectors (the mixture logits are loaded, not rebuilt)."""

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, num_bins={self.options.num_bins}, lr={self.options.lr}"


class AdaptiveNgramProposal(Proposal):
    """One step's mixture, its previous tokens (N,), their bins and the bigram's weight pi (N, 1) bound: the
    targets' log q is computed with the draws'; ``observe`` turns the draws' logits into the mixture's step."""

    per_position = True

    def __init__(self, sampler: AdaptiveNgramSampler, prev: Tensor, targets: Tensor | None) -> None:
        self.sampler, self.prev, self.targets = sampler, prev, targets
        self.positions = prev.numel()
        self.bins = sampler.bins[prev]  # (N,)
        self.weight = torch.sigmoid(sampler.logits[self.bins].double()).unsqueeze(1)  # (N, 1) the draws' pi
        self.drawn: tuple[Tensor, ...] | None = None  # the last draws, their bigram part, q and log q

    @property
    def device(self) -> torch.device:
        return self.prev.device

    def mixture(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The bigram part, q (float64) and log q (the logits' dtype) of ids (N, k) or (k,), each (N, k)."""
        unigram, bigram = self.sampler.components(self.prev, ids)  # (N, k) each
        q = torch.addcmul(unigram, self.weight, bigram - unigram)  # (N, k) u + pi (B - u)
        return bigram, q, q.log().to(self.sampler.logits.dtype)

    def draw(self, num_samples: int) -> Draws:
        ids = self.sampler.bigram.draw(self.prev, num_samples, self.weight)  # (N, m); c(p) = 0: the unigram
        if self.targets is None:
            self.drawn = (ids, *self.mixture(ids))
            return Draws(ids, self.drawn[3], None)
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m), one search for both
        bigram, q, log_q = self.mixture(joint)
        self.drawn = (joint[:, 1:], bigram[:, 1:], q[:, 1:], log_q[:, 1:])  # the ids are the view the output scores
        return Draws(self.drawn[0], self.drawn[3], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        """log q(ids | prev): ids (N, k), or (k,) for the same ids at every position -> (N, k)."""
        return self.mixture(ids)[2]

    def observe(self, ids: Tensor, scores: Tensor) -> None:
        drawn = self.drawn
        bigram, q, log_q = drawn[1:] if drawn is not None and ids is drawn[0] else self.mixture(ids)
        with torch.no_grad():
            r = torch.softmax(scores - log_q, dim=1, dtype=q.dtype)  # (N, m) self-normalized importance weights
            expected = torch.bmm(r.unsqueeze(1), (bigram / q).unsqueeze(2)).view(-1)  # (N,) sum_j r_j B_j / q_j
            descent = torch.addcmul(self.weight[:, 0], self.weight[:, 0], expected, value=-1)  # (N,) pi (1 - E)
            pending = self.sampler.pending
            pending.index_add_(0, self.bins, descent.to(pending.dtype), alpha=-1 / self.positions)  # bins' mean
