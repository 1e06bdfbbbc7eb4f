"""The values lmtrain passes to the parts' constructors at run time, which a config must never set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass
class Runtime:
    """The values lmtrain passes to constructors at run time (from the data and the model), never read from the
    config: the vocabulary size, the hidden size, the training counts and token stream, the built sampler, and the
    vocabulary's strings in id order (``words``; None where a caller has only a size, e.g. a benchmark)."""

    num_classes: int
    dim: int = 0
    counts: Tensor | None = None
    train_ids: Tensor | None = None
    sampler: Any = None
    words: list[str] | None = None
