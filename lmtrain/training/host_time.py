"""Lightning's per-step bookkeeping made cheap where it costs host time and buys nothing for lmtrain's runs.

On a small model the host time around a step decides the speed (a GPU kernel of a 1x32 LSTM takes microseconds):
Lightning dispatches about 18 module and strategy hooks and 6 hooks per callback at every step, and each one goes
through ``trainer.profiler.profile`` and writes ``LightningModule._current_fx_name`` twice. These classes keep what
those calls do and drop the cost that comes with them; ``docs/architecture.md`` measures the difference.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import Profiler

_NO_PROFILE = contextlib.nullcontext()  # reusable, stateless: entered once per Lightning hook call


class NoProfiler(Profiler):
    """The profiler of a run that profiles nothing: ``profile()`` hands back one shared null context.

    Lightning's own default (``PassThroughProfiler``) builds a generator-based context manager and calls ``start``
    and ``stop`` for every hook of every step (about 50 per step), a few microseconds each; this one costs a method
    call. A run with ``+trainer.profiler=simple`` (or any other) keeps that profiler instead."""

    def __init__(self) -> None:
        super().__init__(dirpath=None, filename=None)

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:  # type: ignore[override]
        return _NO_PROFILE

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        return ""

    def describe(self) -> None:  # nothing was recorded: write no profile file
        pass


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with its state key computed once, and a time trigger beside the step trigger.

    Lightning formats ``state_key`` (a ``repr`` of the triggers) for every hook it calls on the callback, six times
    a step; it never changes after construction, so it is computed here once, as ``ModelCheckpoint`` spells it.
    ``every_minutes`` writes the periodic checkpoint also when that many minutes of training passed since the last
    one (Lightning's batch-end check reads both triggers; its constructor only refuses them together), so one
    callback does what two did."""

    def __init__(self, every_minutes: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if every_minutes is not None:
            self._train_time_interval = timedelta(minutes=every_minutes)
        # the key Lightning's own class gives (its name first), so that checkpoints written with either restore the
        # callback's state: the best score so far, above all
        self._state_key = "ModelCheckpoint" + super().state_key.removeprefix(type(self).__qualname__)

    @property
    def state_key(self) -> str:
        return self._state_key


class FastAttributes:
    """Mixin for an ``nn.Module`` whose listed attributes hold plain host values (numbers, strings, tuples): writing
    them skips ``nn.Module.__setattr__``, which checks every value against parameters, buffers and submodules
    (``isinstance(value, Parameter)`` runs Python code). Lightning writes ``_current_fx_name`` around every hook call
    (about 50 writes a step) and the step metrics write a few counters; none is ever a tensor or a module.

    The class attribute ``FAST_ATTRIBUTES`` lists the names; any other name takes the normal path."""

    FAST_ATTRIBUTES: frozenset[str] = frozenset({"_current_fx_name"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.FAST_ATTRIBUTES:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)
