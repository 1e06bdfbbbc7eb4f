"""Learning-rate schedules: step decay per epoch (Zaremba et al.) and reduce-on-plateau."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from lmtrain.common.optim_options import ScheduleOptions


@dataclass
class StepDecay:
    """lr factor for epoch e (0-based): decay ** max(0, e + 1 - start): constant for `start` epochs, then decays."""

    start: int
    decay: float

    def __call__(self, epoch: int) -> float:
        return self.decay ** max(0, epoch + 1 - self.start)


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: dict[str, Any]) -> dict[str, Any] | None:
    """A Lightning lr_scheduler config for `schedule.kind` in step | plateau | none; a missing key takes its
    ``ScheduleOptions`` default."""
    options = ScheduleOptions(**schedule)  # checks the kind
    kind = options.kind
    if kind == "step":
        rule = StepDecay(int(options.start), float(options.decay))
        return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, rule), "interval": "epoch"}
    if kind == "plateau":
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=float(options.decay), patience=int(options.patience)
        )
        return {"scheduler": plateau, "monitor": "val/ppl", "interval": "epoch"}
    return None  # none: ScheduleOptions' choices (checked above) leave no other kind


@contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Every parameter group's learning rate times ``factor`` inside (one step of a variable-length window), then
    exactly what it was, so that the schedule never sees the scaling."""
    if factor == 1.0:
        yield
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr * factor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
