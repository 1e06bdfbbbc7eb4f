"""Lightning's per-step bookkeeping made cheap where it costs host time and buys nothing for lmtrain's runs, through
Lightning's public API only (the ``Trainer``'s ``profiler`` argument and the ``Profiler`` interface).

On a small model the host time around a step decides the speed (a GPU kernel of a 1x32 LSTM takes microseconds):
Lightning dispatches about 18 module and strategy hooks and 6 hooks per callback at every step, and each one goes
through ``trainer.profiler.profile``.
"""

from __future__ import annotations

import contextlib

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
