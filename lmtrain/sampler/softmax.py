"""The model's own softmax as proposal: the unbiased O(nd) reference (``output=exp``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmtrain.common.execution import DeviceAware
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Proposal


class SoftmaxSampler(Sampler, DeviceAware):
    """q(i | h) = softmax(score(query(h), weight))_i, per example: the output layer's own softmax over its current
    weights (its ``score``: the dot product by default, tau * cos for ``output=rff``, |o| for ``output=quadratic``).

    ``update`` keeps a reference to the weight it is given (no copy), so q always follows the live
    parameters. Every call costs a full (N, n) product: this is the reference that makes sampled
    softmax exact (docs/strategies.md), not a fast proposal.
    """

    name = "softmax"  # sampler=softmax
    per_example = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self._weight: Tensor | None = None
        self._score: Callable[[Tensor, Tensor], Tensor] = lambda query, weight: query @ weight.T

    def use_scores(self, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        self._score = score  # e.g. tau * cos for output=rff, |o| for output=quadratic: q is then exactly p

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        self._weight = weight  # a (detached) view of the live parameter: always current

    def follow(self, weight: Tensor) -> None:
        self._weight = weight  # after model.to("cuda") the old reference would still point at the CPU copy

    def _log_softmax(self, hidden: Tensor | None) -> Tensor:
        if hidden is None or self._weight is None:
            raise ValueError("SoftmaxSampler needs the query vectors and the weights (call update(weight) first)")
        return torch.log_softmax(self._score(hidden.detach(), self._weight), dim=1)  # (N, n)

    def propose(self, hidden: Tensor | None, inputs: Tensor | None = None) -> Proposal:
        if not self.gpu_paths:  # see SoftmaxProposal: on a CPU each use takes its own table
            return super().propose(hidden, inputs)
        return SoftmaxProposal(self, hidden)

    def sample(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return draw(self._log_softmax(hidden), num_samples)

    def log_q(self, hidden: Tensor | None, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        return self._log_softmax(hidden).gather(1, ids)  # (N, k)


class SoftmaxProposal(Proposal):
    """One step's softmax proposal on the GPU paths: its log-probabilities (N, n) computed once for the draws and for
    the targets' log q (one product and one log-softmax a step where each use takes its own). Its log q is a lookup
    in that table, so the output layer draws the ids alone (``sample_ids``) and looks up the targets' and the draws'
    log q in one gather (``SampledOutput.joint_draw``); the table goes with the proposal, at the end of the loss.
    The CPU paths keep a table per use: on the 2-core CPU this proposal made PTB steps about a fifth slower, not
    faster (``scripts/bench_before_after.py``; the allocator's page faults, by the profile, in the later gathers
    and the backward pass)."""

    per_example = True
    log_q_by_lookup = True

    def __init__(self, sampler: SoftmaxSampler, hidden: Tensor | None) -> None:
        self.sampler, self.hidden = sampler, hidden
        self._log_probs: Tensor | None = None

    @property
    def log_probs(self) -> Tensor:
        """(N, n), computed at the first use."""
        if self._log_probs is None:
            self._log_probs = self.sampler._log_softmax(self.hidden)
        return self._log_probs

    def sample(self, num_samples: int) -> tuple[Tensor, Tensor]:
        return draw(self.log_probs, num_samples)

    def sample_ids(self, num_samples: int) -> Tensor:
        return draw_ids(self.log_probs, num_samples)

    def log_q(self, ids: Tensor) -> Tensor:
        known = self.known_log_q(ids)  # looked up with the draws'
        return known if known is not None else self.log_probs.gather(1, ids)  # (N, k)


def draw(log_probs: Tensor, num_samples: int) -> tuple[Tensor, Tensor]:
    """``num_samples`` ids per row of ``log_probs`` (N, n), with replacement, and their log q: (N, m) each."""
    ids = draw_ids(log_probs, num_samples)  # (N, m)
    return ids, log_probs.gather(1, ids)


def draw_ids(log_probs: Tensor, num_samples: int) -> Tensor:
    """``draw``'s ids alone, (N, m)."""
    return torch.multinomial(log_probs.exp(), num_samples, replacement=True)
