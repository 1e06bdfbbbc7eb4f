"""The values lmtrain passes to the parts' constructors at run time, which a config must never set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor


class StepForms:
    """The forms a training step's code takes, decided once when the model is built (``lmtrain.run.build``, the
    config's ``step_forms``) and handed to the parts that have two: a GPU's (``fixed_shapes``: every shape known
    before the step, no host sync: the kernel tree's fixed backend, the adaptive softmax's fixed-shape loss) or a
    CPU's (shapes found from the data where that is cheaper there: the tree's walk, torch's adaptive module). Both
    give the same losses and gradients to float rounding, and draws from the same proposal (docs/architecture.md,
    one form on every device). A plain object, not a dataclass: Hydra hands it to a part's constructor as it is (a
    dataclass it would turn into a dict)."""

    __slots__ = ("fixed_shapes",)

    def __init__(self, fixed_shapes: bool = False) -> None:
        self.fixed_shapes = bool(fixed_shapes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepForms) and other.fixed_shapes == self.fixed_shapes

    def __hash__(self) -> int:
        return hash(self.fixed_shapes)

    def __repr__(self) -> str:
        return f"StepForms(fixed_shapes={self.fixed_shapes})"


CPU_FORMS, GPU_FORMS = StepForms(fixed_shapes=False), StepForms(fixed_shapes=True)


@dataclass
class Runtime:
    """The values lmtrain passes to constructors at run time (from the data and the model), never read from the
    config: the vocabulary size, the hidden size, the training counts and token stream, the built sampler, the
    vocabulary's strings in id order (``words``; None where a caller has only a size, e.g. a benchmark) and the
    training step's forms (``forms``; a CPU's unless the build decides otherwise)."""

    num_classes: int
    dim: int = 0
    counts: Tensor | None = None
    train_ids: Tensor | None = None
    sampler: Any = None
    words: list[str] | None = None
    forms: StepForms = CPU_FORMS
