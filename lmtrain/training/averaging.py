"""Weight averaging for NT-ASGD (Merity et al. 2018) and its finetune stage: the running mean of the weights after
each optimizer step since averaging began, which validation, the test and the saved weights use.

With SGD this is the averaged SGD that torch's ``ASGD`` runs with ``t0`` at the switch and ``lambd=0`` (the steps
are plain SGD steps, the average is kept beside them), but it leaves the optimizer alone: SGD's sparse row updates
stay as they are, and any optimizer can be averaged. The mean is updated with ``torch.optim.swa_utils``' multi-tensor
update. ``average=nonmono`` starts it once ``nonmono`` validations in a row have not beaten the best validation loss
(the non-monotone trigger); ``always`` from the first step.

In a checkpoint, ``state_dict`` holds the weights as evaluated (the average, once there is one), so the best
checkpoint, the test and the tools read the averaged model; the weights training continues from are kept under
``lmtrain.average.train_weights`` with the trigger's state, and a resumed fit puts them back (``restore``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import get_swa_multi_avg_fn


class WeightAverage:
    """The trigger and the running mean of a module's parameters (see the module docstring). ``when``: none,
    nonmono or always (``OptimOptions.average``)."""

    def __init__(self, when: str, nonmono: int) -> None:
        self.when, self.nonmono = str(when), int(nonmono)
        self.active = self.when == "always"  # averaging has begun: every optimizer step from now on adds to the mean
        self.count = 0  # the steps in the mean
        self.best = math.inf  # the best validation loss seen before the switch
        self.since_best = 0  # validations since that best
        self.averaged: list[Tensor] | None = None  # one per parameter of the module, in ``parameters()`` order
        self._trained: list[Tensor] | None = None  # the training weights while the average is swapped in
        self._add = get_swa_multi_avg_fn()

    def observe(self, val_loss: float) -> None:
        """A validation's loss (of the weights as evaluated); under ``nonmono`` it may start the averaging."""
        if self.active or self.when != "nonmono":
            return
        if val_loss < self.best:
            self.best, self.since_best = val_loss, 0
            return
        self.since_best += 1
        self.active = self.since_best >= self.nonmono

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        """After an optimizer step: add the weights to the mean (the first step after the switch starts it)."""
        if not self.active:
            return
        params = [p.detach() for p in module.parameters()]
        if self.averaged is None:
            self.averaged, self.count = [p.clone() for p in params], 0
        self._add(self.averaged, params, self.count)  # lerp by 1 / (count + 1); the first is a copy
        self.count += 1

    @torch.no_grad()
    def swap_in(self, module: nn.Module) -> None:
        """Evaluate with the mean from now on (no-op before there is one); ``swap_out`` puts the training weights
        back, bit for bit."""
        if self.averaged is None or self._trained is not None:
            return
        params = list(module.parameters())
        self._trained = [p.detach().clone() for p in params]
        for param, mean in zip(params, self.averaged, strict=True):
            param.copy_(mean)

    @torch.no_grad()
    def swap_out(self, module: nn.Module) -> None:
        """Back to the training weights after ``swap_in``."""
        if self._trained is None:
            return
        for param, weights in zip(module.parameters(), self._trained, strict=True):
            param.copy_(weights)
        self._trained = None

    def save(self, checkpoint: dict[str, Any], module: nn.Module) -> None:
        """Make ``checkpoint["state_dict"]`` the weights as evaluated, and keep the trigger's state and the training
        weights in ``checkpoint["lmtrain"]["average"]`` (see the module docstring)."""
        entry: dict[str, Any] = {
            "active": self.active,
            "count": self.count,
            "best": self.best,
            "since_best": self.since_best,
            "train_weights": {},
        }
        if self.averaged is not None:
            state, position = checkpoint["state_dict"], {id(p): i for i, p in enumerate(module.parameters())}
            for key, value in module.state_dict(keep_vars=True).items():  # tied weights: every key of a parameter
                index = position.get(id(value))
                if index is None or key not in state:
                    continue
                trained = self._trained[index] if self._trained is not None else state[key]
                entry["train_weights"][key] = trained.detach().clone()
                state[key] = self.averaged[index].detach().clone()
        checkpoint.setdefault("lmtrain", {})["average"] = entry

    def restore(self, checkpoint: dict[str, Any], module: nn.Module) -> None:
        """Before a resumed fit loads ``checkpoint["state_dict"]``: take the mean from it, put the training weights
        back in its place, and take the trigger's state (a checkpoint without one leaves everything as it is)."""
        entry = checkpoint.get("lmtrain", {}).get("average")
        if entry is None:
            return
        self.active, self.count = bool(entry["active"]) or self.when == "always", int(entry["count"])
        self.best, self.since_best = float(entry["best"]), int(entry["since_best"])
        trained = entry["train_weights"]
        if not trained:
            self.averaged = None
            return
        state, position = checkpoint["state_dict"], {id(p): i for i, p in enumerate(module.parameters())}
        averaged: list[Tensor | None] = [None] * len(position)
        for key, value in module.state_dict(keep_vars=True).items():
            index = position.get(id(value))
            if index is not None and key in trained:
                averaged[index] = state[key].to(value.device, value.dtype).clone()
                state[key] = trained[key]
        missing = [i for i, mean in enumerate(averaged) if mean is None]
        if missing:
            raise ValueError(f"the checkpoint's averaged weights lack {len(missing)} of this model's parameters")
        self.averaged = [mean for mean in averaged if mean is not None]
