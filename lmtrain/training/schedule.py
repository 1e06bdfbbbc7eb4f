"""Learning-rate schedules: step decay per epoch (Zaremba et al.) and reduce-on-plateau."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass
class ScheduleOptions:
    """The keys of ``optim.schedule``."""

    kind: Literal["step", "plateau", "none"] | None = "none"
    start: int = 0  # step: epochs at the full learning rate before the decay starts
    decay: float = 0.5  # the factor applied per epoch (step) or per plateau
    patience: int = 0  # plateau: epochs without a val/ppl improvement before a decay


@dataclass
class StepDecay:
    """lr factor for epoch e (0-based): decay ** max(0, e + 1 - start): constant for `start` epochs, then decays."""

    start: int
    decay: float

    def __call__(self, epoch: int) -> float:
        return self.decay ** max(0, epoch + 1 - self.start)


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: dict[str, Any]) -> dict[str, Any] | None:
    """A Lightning lr_scheduler config for `schedule.kind` in step | plateau | none."""
    kind = schedule.get("kind", "none")
    if kind == "step":
        rule = StepDecay(int(schedule.get("start", 0)), float(schedule.get("decay", 1.0)))
        return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, rule), "interval": "epoch"}
    if kind == "plateau":
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=float(schedule.get("decay", 0.5)),
            patience=int(schedule.get("patience", 0)),
        )
        return {"scheduler": plateau, "monitor": "val/ppl", "interval": "epoch"}
    if kind in ("none", None):
        return None
    raise ValueError(f"optim.schedule.kind must be step, plateau or none, got {kind!r}")
