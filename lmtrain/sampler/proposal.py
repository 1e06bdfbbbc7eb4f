"""One step's proposal: q given this step's context, built once by ``Sampler.propose`` and dropped after the step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.common.precision import wrap_methods


class Draws(NamedTuple):
    """A step's negatives and the log q that corrects them: ``ids`` and ``log_q`` (m,) shared by the batch or (N, m)
    per position; ``target_log_q`` (N, 1) the log q of the targets given to ``Sampler.propose`` (None without);
    ``joint_ids`` (N, 1 + m), the targets then the ids, where the proposal joined them to look their log q up at
    once (per position; the output layer then gathers their rows from it too)."""

    ids: Tensor
    log_q: Tensor
    target_log_q: Tensor | None
    joint_ids: Tensor | None = None


class Proposal:
    """The proposal q of one step, its context bound (queries, input tokens, targets).

    ``draw(m)`` returns m negatives with their exact log q and the targets' log q under the same q (a proposal that
    fixes m itself, such as in-batch negatives, ignores it); ``log_q(ids)`` is the exact log-probability of any ids
    under that q: (N, k) ids for a per-position q, any shape for one shared by the batch. ``shared``: ``draw`` gives
    (m,) ids for the whole batch, else (N, m). ``positions`` is N.
    """

    shared: bool = False
    positions: int = 0
    per_position: bool = False  # True where q differs between positions (then ``log_q`` takes (N, k) ids)
    fixes_num_samples: bool = False  # True where the proposal draws its own m whatever is asked (in-batch negatives)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # float32 under autocast, as the samplers' (precision.py)
        wrap_methods(cls, ("draw", "log_q", "log_q_all", "observe"))

    def draw(self, num_samples: int) -> Draws:
        """``num_samples`` ids drawn with replacement, their log q and the targets' log q."""
        raise NotImplementedError

    def log_q(self, ids: Tensor) -> Tensor:
        """Exact log q of ``ids``: (N, k) per position, any shape for a q shared by the batch."""
        raise NotImplementedError

    def observe(self, ids: Tensor, scores: Tensor) -> None:
        """The output's logits (N, m) of the negatives ``ids`` it drew from this proposal, handed over in the
        training loss once they are scored (detached), for a proposal that adapts to the model (``sampler=
        adaptive_ngram``). Default: ignored."""

    def log_q_all(self, num_classes: int) -> Tensor:
        """log q of every class at every position, (N, n), for diagnostics (KL(p || q)); O(N n) memory."""
        every = torch.arange(num_classes, device=self.device)
        if self.per_position:
            return self.log_q(every.expand(self.positions, -1))
        return self.log_q(every).expand(self.positions, -1)

    @property
    def device(self) -> torch.device:
        """The device the draws come on."""
        raise NotImplementedError


def positions_of(*context: Tensor | None) -> int:
    """N, the positions of a step, from the first of its context tensors that is given (queries, inputs, targets);
    0 when none is (a proposal shared by the batch needs none)."""
    for tensor in context:
        if tensor is not None:
            return tensor.shape[0]
    return 0


def per_position_shape(positions: int, num_samples: int) -> tuple[int, int]:
    """(N, m), the shape of per-position draws; N = 0 means the step's context was not given."""
    if positions == 0:
        raise ValueError("per-position draws need the step's context: pass the queries, the inputs or the targets")
    return positions, num_samples


class TableProposal(Proposal):
    """A proposal shared by every position whose log q is a lookup in one table (n,): drawn by ``draw_ids`` (k,), m
    for the batch when ``shared`` else N x m; the targets' log q is looked up with the draws' in one gather."""

    def __init__(
        self,
        draw_ids: Callable[[int], Tensor],
        table: Tensor,
        positions: int,
        shared: bool,
        targets: Tensor | None,
    ) -> None:
        self.draw_ids, self.table, self.positions = draw_ids, table, positions
        self.shared, self.targets = shared, targets

    @property
    def device(self) -> torch.device:
        return self.table.device

    def draw(self, num_samples: int) -> Draws:
        if self.shared:
            ids = self.draw_ids(num_samples)  # (m,)
        else:
            shape = per_position_shape(self.positions, num_samples)
            ids = self.draw_ids(math.prod(shape)).view(shape)  # (N, m)
        if self.targets is None:
            return Draws(ids, self.table[ids], None)
        if self.shared:
            log_q = self.table[torch.cat([self.targets.reshape(-1), ids])]  # (N + m,) one lookup for both
            return Draws(ids, log_q[self.positions :], log_q[: self.positions].unsqueeze(1))
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m)
        log_q = self.table[joint]  # (N, 1 + m) one lookup for both
        return Draws(joint[:, 1:], log_q[:, 1:], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.table[ids]
