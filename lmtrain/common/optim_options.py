"""The ``optim`` keys and their schedule's: what the optimizer builder reads (``lmtrain.training.optim``,
``lmtrain.training.schedule``) and the config schema of ``optim`` (``lmtrain/config/``; the YAML files of
``conf/optim`` are its presets)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from lmtrain.common.ranges import Checked, Choice


class ScheduleKind(Choice):
    """step: lr * decay every epoch after ``start`` epochs; plateau: lr * decay after ``patience`` epochs without a
    val/ppl improvement; none (or null)."""

    step = "step"
    plateau = "plateau"
    none = "none"


class OptimName(Choice):
    """The optimizer of the dense parameters (``lmtrain.training.optim.build_optimizer``)."""

    sgd = "sgd"
    adagrad = "adagrad"
    adam = "adam"


class SparseOptimizer(Choice):
    """Under adam, the optimizer of the sparse rows."""

    sparse_adam = "sparse_adam"
    adagrad = "adagrad"


class AverageWhen(Choice):
    """When the evaluated weights become the average of the weights since (``lmtrain.training.averaging``): none;
    nonmono (NT-ASGD): once ``nonmono`` validations in a row have not beaten the best val loss; always: from the
    first step (the finetune stage)."""

    none = "none"
    nonmono = "nonmono"
    always = "always"


@dataclass
class ScheduleOptions(Checked):
    """The keys of ``optim.schedule`` and their defaults (also its config schema, ``lmtrain/config/``)."""

    kind: ScheduleKind | None = ScheduleKind.none
    start: int = field(default=0, metadata={"at_least": 0})  # step: epochs at the full lr before the decay
    decay: float = field(default=0.5, metadata={"above": 0})  # the factor applied per epoch (step) or per plateau
    patience: int = field(default=0, metadata={"at_least": 0})  # plateau: epochs without a val/ppl improvement


@dataclass
class OptimOptions:
    """The ``optim`` keys lmtrain reads itself; every other key is passed to the torch optimizer named by ``name``
    (``torch_optimizer``), so it must be one of that class's arguments (momentum, betas, eps, nesterov, ...)."""

    name: OptimName
    lr: float = field(metadata={"above": 0})
    clip: float | None = field(default=5.0, metadata={"above": 0})  # global gradient-norm clip (sparse-aware); null=off
    weight_decay: float = field(default=0.0, metadata={"at_least": 0})
    sparse_lr: float | None = None  # learning rate of the sparse output rows (default lr)
    sparse_optimizer: SparseOptimizer = SparseOptimizer.sparse_adam  # adam: the optimizer of the sparse rows
    schedule: ScheduleOptions | None = field(default_factory=ScheduleOptions)
    # weight averaging (NT-ASGD with sgd): validation and the checkpoints' weights are the average once it starts
    average: AverageWhen = AverageWhen.none
    nonmono: int = field(default=5, metadata={"at_least": 1})  # average=nonmono: validations without a new best

    @staticmethod
    def extra_keys(node: Any) -> tuple[str, list[str]]:
        """The torch optimizer ``name`` selects and the arguments it takes besides lmtrain's keys (the config check's
        list of the keys ``optim`` may have)."""
        optimizer = torch_optimizer(str(node.get("name")))
        names = [] if optimizer is None else list(inspect.signature(optimizer).parameters)
        return f"optim={node.get('name')}", [name for name in names if name != "params"]


# the keys lmtrain reads itself and never passes to the torch optimizer
OWN_KEYS = ("name", "lr", "clip", "schedule", "average", "nonmono")


def torch_optimizer(name: str) -> type[torch.optim.Optimizer] | None:
    """The torch.optim class whose name is ``name`` up to case (sgd -> SGD, adam -> Adam), or None."""
    found = [cls for key, cls in vars(torch.optim).items() if key.lower() == str(name).lower()]
    return next((cls for cls in found if isinstance(cls, type)), None)
