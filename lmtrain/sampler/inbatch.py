"""In-batch negatives: the batch's own targets as the shared negatives, corrected with the unigram's log q."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.common.ranges import Checked
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal, positions_of
from lmtrain.sampler.unigram import UnigramSampler


@dataclass
class InBatchOptions(Checked):
    """``sampler=inbatch``: the unigram that corrects the batch's targets, (count + smoothing)^power normalized."""

    power: float = field(default=1.0, metadata={"at_least": 0})
    smoothing: float = field(default=1.0, metadata={"above": 0})  # added to every count, so every q_i > 0


class InBatchSampler(Sampler):
    """The recommender systems' in-batch softmax with the log-Q correction (Yi et al. 2019): the negatives of every
    position are the N targets of the batch, one shared set whose size the batch fixes (the output's
    ``num_samples`` is not read), each corrected with log q from the training unigram (``InBatchOptions``), the
    distribution a batch's targets are drawn from. A position's own target, and its repeats elsewhere in the batch,
    are accidental hits, which the sampled softmax removes."""

    name, Options = "inbatch", InBatchOptions  # sampler=inbatch
    context_free = True  # the targets and a fixed table: no query, input token or class vector
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "counts")

    def __init__(self, num_classes: int, counts: Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = opts = InBatchOptions(**options)  # the keys left out take their defaults
        self.unigram = UnigramSampler(num_classes, counts, power=opts.power, smoothing=opts.smoothing)

    def share_negatives(self, shared: bool) -> None:
        """The batch's targets are one set for the whole batch, whatever the output asks."""

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> InBatchProposal:
        if targets is None:
            raise ValueError("sampler=inbatch draws the batch's targets: pass them (the output layer's loss does)")
        return InBatchProposal(self.unigram.log_probs, targets.reshape(-1), positions_of(query, inputs, targets))


class InBatchProposal(Proposal):
    """One step's in-batch negatives: the targets (N,), whatever m is asked, with their unigram log q."""

    shared = fixes_num_samples = True

    def __init__(self, table: Tensor, targets: Tensor, positions: int) -> None:
        self.table, self.targets, self.positions = table, targets, positions

    @property
    def device(self) -> torch.device:
        return self.table.device

    def draw(self, num_samples: int) -> Draws:
        log_q = self.table[self.targets]  # (N,) the negatives' log q, which are the targets' too
        return Draws(self.targets, log_q, log_q.unsqueeze(1))

    def log_q(self, ids: Tensor) -> Tensor:
        return self.table[ids]
