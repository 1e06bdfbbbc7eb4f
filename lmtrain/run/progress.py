"""The progress display of a run. In a terminal: one bar over the run's optimizer steps (``trainer.max_steps``, else
the epochs' steps), whose time left is the sooner of the steps' end and a time limit (``max_train_seconds``,
``trainer.max_time``), with log lines (a validation's) written above it. Elsewhere (a file, a pipe): no redraws, a
plain line about every twentieth of the run, and the validation lines.

Bar and log lines write each metric in one format (``metric_text``): ``val/ppl 1169.85`` in both."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, convert_inf
from tqdm.contrib.logging import logging_redirect_tqdm

from lmtrain.run.callbacks import TrainingTimeLimit, metric_text

LINES_PER_RUN = 20  # without a terminal: a progress line about every 1/20 of the run's steps
LINES_UNKNOWN_TOTAL = 200  # ... and every this many steps when the run has no step limit
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{left}, {rate_noinv_fmt}{postfix}]"


class RunBar(Tqdm):
    """The training bar: Lightning's tqdm bar, with ``{left}`` (the time left) from ``seconds_left``."""

    seconds_left: Callable[[int, int, float], float | None] | None = None  # (n, initial, elapsed seconds)

    @property
    def format_dict(self) -> dict[str, Any]:
        values = super().format_dict
        elapsed = values.get("elapsed") or 0.0
        seconds = self.seconds_left(self.n, self.initial, elapsed) if self.seconds_left is not None else None
        values["left"] = "?" if seconds is None else self.format_interval(seconds)
        return values


def is_console(handler: logging.Handler) -> bool:
    """A handler that writes to the terminal (Hydra's console handler), not to a file."""
    stream = getattr(handler, "stream", None)
    return isinstance(handler, logging.StreamHandler) and stream in (sys.stdout, sys.stderr)


class ProgressBar(TQDMProgressBar):
    """The progress display (module docstring); ``terminal``: whether stdout is a terminal (default: asked)."""

    def __init__(self, terminal: bool | None = None) -> None:
        super().__init__()
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self._redirect = ExitStack()  # console log records through tqdm.write while the bar is drawn
        self._started = 0.0  # time.monotonic() when this session's training started
        self._every = 1  # without a terminal: steps between progress lines

    def _quiet_bar(self) -> Tqdm:
        return Tqdm(disable=True)  # keeps n, total and desc; draws nothing

    def init_sanity_tqdm(self) -> Tqdm:
        return super().init_sanity_tqdm() if self.terminal else self._quiet_bar()

    def init_validation_tqdm(self) -> Tqdm:
        return super().init_validation_tqdm() if self.terminal else self._quiet_bar()

    def init_test_tqdm(self) -> Tqdm:
        return super().init_test_tqdm() if self.terminal else self._quiet_bar()

    def init_train_tqdm(self) -> Tqdm:
        if not self.terminal:
            return self._quiet_bar()
        bar = RunBar(
            desc=self.train_description,
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,  # the rate over this session's steps
            unit=" steps",
            bar_format=BAR_FORMAT,
        )
        bar.seconds_left = self._seconds_left
        return bar

    def get_metrics(self, trainer: L.Trainer, module: L.LightningModule) -> dict[str, int | str | float | dict]:
        """The bar's metrics without the logger's version number, each as the log line writes it."""
        items = super().get_metrics(trainer, module)
        items.pop("v_num", None)
        return {k: metric_text(k, v) if isinstance(v, int | float) else v for k, v in items.items()}

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.train_progress_bar = bar = self.init_train_tqdm()
        bar.total = convert_inf(trainer.estimated_stepping_batches)  # max_steps, else the epochs' optimizer steps
        bar.initial = bar.n = trainer.global_step  # after a resume: the rate counts this session's steps only
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)  # also when resumed mid-epoch
        self._started = time.monotonic()
        per_line = math.ceil(bar.total / LINES_PER_RUN) if bar.total else LINES_UNKNOWN_TOTAL
        self._every = max(1, per_line)
        if self.terminal and self.is_enabled and any(is_console(h) for h in logging.root.handlers):
            self._redirect.enter_context(logging_redirect_tqdm(tqdm_class=Tqdm))
        if self.is_enabled:
            bar.refresh()

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)  # no reset

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *_: Any) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        stepped, bar.n = step != bar.n, step  # not stepped: a batch that accumulated gradients
        if not (stepped and self.is_enabled):
            return
        if self.terminal:
            if step % self.refresh_rate == 0 or step == bar.total:
                bar.set_postfix(self.get_metrics(trainer, module))  # redraws
        elif step % self._every == 0 or step == bar.total:
            print(self.progress_line(trainer, module), flush=True)

    def on_train_end(self, *args: Any) -> None:
        super().on_train_end(*args)
        self._redirect.close()

    def on_exception(self, *args: Any) -> None:
        self._redirect.close()

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        super().teardown(*args, **kwargs)
        self._redirect.close()

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``LightningModule.print``: above the bar in a terminal, else a plain line."""
        if self.terminal:
            super().print(*args, sep=sep, **kwargs)
        elif self.is_enabled:
            print(*args, sep=sep, **kwargs, flush=True)

    def _seconds_left(self, n: int, initial: int, elapsed: float) -> float | None:
        """The sooner of the steps' end at this session's rate and the end of a time limit (None: unknown)."""
        total = self.train_progress_bar.total
        candidates = [(total - n) * elapsed / (n - initial)] if total and n > initial and elapsed > 0 else []
        trainer, module = self.trainer, self.trainer.lightning_module
        for callback in trainer.callbacks:
            if isinstance(callback, TrainingTimeLimit) and hasattr(module, "training_seconds"):
                candidates.append(callback.seconds - module.training_seconds())
            elif isinstance(callback, Timer) and callback.time_remaining() is not None:
                candidates.append(callback.time_remaining())
        return max(0.0, min(candidates)) if candidates else None

    def progress_line(self, trainer: L.Trainer, module: L.LightningModule) -> str:
        """One line without a terminal: ``Epoch 0 | 60/300 steps | 0:12 elapsed, 0:48 left | 5.00 steps/s | ...``."""
        bar = self.train_progress_bar
        elapsed = time.monotonic() - self._started
        left = self._seconds_left(bar.n, bar.initial, elapsed)
        done = bar.n - bar.initial
        parts = [
            f"Epoch {trainer.current_epoch}",
            f"{bar.n}/{bar.total or '?'} steps",
            f"{Tqdm.format_interval(elapsed)} elapsed, {'?' if left is None else Tqdm.format_interval(left)} left",
            f"{done / elapsed if elapsed > 0 else 0.0:.2f} steps/s",
        ]
        parts += [f"{key} {value}" for key, value in self.get_metrics(trainer, module).items()]
        return " | ".join(parts)
