"""A benchmark's clock inside a training run: the time at the end of every optimizer step, for tokens/s that need
no logging interval (``scripts/bench_gpu.py``).

``StepClock`` is added to a run as a configured callback (``+callbacks.clock._target_=lab.step_clock.StepClock
+callbacks.clock.path=FILE +callbacks.clock.warmup=W``) and writes, when training ends, the end time and
tokens of every step to FILE. On a GPU the host runs ahead of the device, so the clock waits for the device
(``torch.cuda.synchronize``) at the end of each of the first ``warmup`` steps and of the last one: the timed
stretch then starts and ends with the device idle, and the steps in between run as they would in a real run
(lmtrain reads each step's loss on the host, so the host is never more than a step ahead between those points).
``clock_throughput`` turns the file into tokens/s over the steps after the warm-up.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch


class StepClock(L.Callback):
    """Records (seconds since training started, tokens) at the end of every training step; see the module doc."""

    def __init__(self, path: str, warmup: int = 0) -> None:
        self.path, self.warmup = Path(path), int(warmup)
        self.start: float | None = None
        self.times: list[float] = []
        self.tokens: list[int] = []

    def _wait_for_device(self, module: L.LightningModule) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._wait_for_device(module)
        self.start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        if len(self.times) < self.warmup or trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step:
            self._wait_for_device(module)  # the timed stretch starts and ends with the device idle
        self.times.append(time.perf_counter() - (self.start or 0.0))
        self.tokens.append(int(batch[0].numel()))  # the inputs (B, T): one target per input token

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"warmup": self.warmup, "seconds": self.times, "tokens": self.tokens}))


def clock_throughput(path: str | Path, warmup: int) -> tuple[float, int]:
    """(tokens/s, steps timed) of a StepClock file: the steps after the first ``warmup`` (fewer when the run took
    fewer than 2 ``warmup`` steps: then the first third, at least one) over the time from the end of the last
    warm-up step to the end of the last step. Raises ValueError for a run of fewer than 2 steps."""
    clock = json.loads(Path(path).read_text())
    seconds, tokens = clock["seconds"], clock["tokens"]
    if len(seconds) < 2:
        raise ValueError(f"{path}: {len(seconds)} step(s) timed, at least 2 are needed")
    skip = min(warmup, max(1, len(seconds) // 3)) if len(seconds) < 2 * warmup else warmup
    skip = min(max(skip, 1), len(seconds) - 1)  # the end of step `skip` is the first synchronized timestamp used
    return sum(tokens[skip:]) / (seconds[-1] - seconds[skip - 1]), len(seconds) - skip
