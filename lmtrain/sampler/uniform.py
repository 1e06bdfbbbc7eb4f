"""Uniform proposal over all classes (context-free)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lmtrain.common.constants import constant
from lmtrain.sampler.base import Sampler


class UniformSampler(Sampler):
    """q_i = 1 / n for every class; draws are ``torch.randint`` (O(1) each), shared across the batch."""

    name = "uniform"  # sampler=uniform
    per_example = False
    log_q_by_lookup = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"UniformSampler needs at least 2 classes, got num_classes={num_classes}")
        self.num_classes = num_classes
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows the module's device/dtype

    def sample(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        ids = self.sample_ids(hidden, num_samples)  # (m,)
        return ids, self.log_q(None, ids)

    def sample_ids(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> Tensor:
        return torch.randint(self.num_classes, (num_samples,), device=self._anchor.device)  # (m,)

    def log_q(self, hidden: Tensor | None, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        # -ln n as a view of one cached value (read-only), exact in the anchor's dtype: a fill would be a launch
        return constant(-math.log(self.num_classes), self._anchor.device, self._anchor.dtype).expand(ids.shape)
