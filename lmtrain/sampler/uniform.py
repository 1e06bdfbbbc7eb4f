"""Uniform proposal over all classes (context-free)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lmtrain.common.constants import constant
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal, per_position_shape, positions_of


class UniformSampler(Sampler):
    """q_i = 1 / n for every class; draws are ``torch.randint`` (O(1) each), shared across the batch."""

    name = "uniform"  # sampler=uniform
    context_free = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"UniformSampler needs at least 2 classes, got num_classes={num_classes}")
        self.num_classes = num_classes
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows the module's device/dtype

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> UniformProposal:
        return UniformProposal(self, positions_of(query, inputs, targets), targets is not None)


class UniformProposal(Proposal):
    """The uniform q of one step: its log q is a view of one cached value, -ln n, whatever the ids."""

    def __init__(self, sampler: UniformSampler, positions: int, with_targets: bool) -> None:
        self.sampler, self.positions, self.shared, self.with_targets = sampler, positions, sampler.shared, with_targets

    @property
    def device(self) -> torch.device:
        return self.sampler._anchor.device

    def draw(self, num_samples: int) -> Draws:
        shape = (num_samples,) if self.shared else per_position_shape(self.positions, num_samples)
        ids = torch.randint(self.sampler.num_classes, shape, device=self.device)  # (m,) or (N, m)
        target_log_q = self.log_q_of_shape((self.positions, 1)) if self.with_targets else None
        return Draws(ids, self.log_q_of_shape(ids.shape), target_log_q)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.log_q_of_shape(ids.shape)

    def log_q_of_shape(self, shape: tuple[int, ...] | torch.Size) -> Tensor:
        """-ln n as a view of one cached value (read-only), exact in the anchor's dtype: a fill would be a launch."""
        anchor = self.sampler._anchor
        return constant(-math.log(self.sampler.num_classes), anchor.device, anchor.dtype).expand(shape)
