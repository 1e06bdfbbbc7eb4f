"""A stopped run keeps its steps: SIGINT, SIGTERM and a cluster's requeue signal end training at a step boundary.

While training runs, ``GracefulStop`` replaces the handlers of these signals with one that only records the first
signal (a later one is ignored, so nothing interrupts the checkpoint being written). After the step under way, every
rank learns that a stop was asked for, ``last.ckpt`` is written as a periodic checkpoint is (Lightning's
``save_checkpoint``: the ranks gather the carried state, rank 0 writes the file atomically), one line says the step
and the command that resumes it, and ``TrainingStopped`` ends the fit; ``train`` closes the loggers and exits with
128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

On a cluster the requeue signal goes the same way, and the job is requeued once the checkpoint is written:
Lightning's SLURM requeue (``SLURMEnvironment(auto_requeue=True)``, its ``requeue_signal``, SIGUSR1 by default) runs
``scontrol requeue``, and a handler that a submitit job installed for its preemption signal (SIGUSR2, or
``$SUBMITIT_PREEMPT_SIGNAL``) is called after the write.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

log = logging.getLogger("lmtrain")

Handler = Callable[[int, FrameType | None], Any] | int | None


class TrainingStopped(BaseException):
    """Ends a fit stopped by a signal, after ``last.ckpt`` was written; ``status`` is the process's exit status."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step

    @property
    def status(self) -> int:
        return 128 + self.signum


def requeue_signals(trainer: L.Trainer) -> dict[int, Callable[[], str]]:
    """The cluster signals that stop the run and then requeue it, each with what requeues it (run after the write,
    on rank 0; it returns a line for the log)."""
    found: dict[int, Callable[[], str]] = {}
    environment = getattr(trainer._accelerator_connector, "cluster_environment", None)  # not public in Lightning
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        found[int(environment.requeue_signal or signal.SIGUSR1)] = scontrol_requeue
    submitit = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    previous = signal.getsignal(submitit) if submitit is not None else None
    if callable(previous) and submitit not in found:  # submitit's handler requeues the job (and exits)
        found[int(submitit)] = lambda: call_previous(previous, int(submitit))
    return found


def scontrol_requeue() -> str:
    """Requeue this SLURM job (an array task by its array id), as Lightning's auto-requeue does."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:  # no scontrol here, or no answer
        return f"requeuing SLURM job {job} failed ({exc})"
    if result.returncode != 0:
        return f"requeuing SLURM job {job} failed ({(result.stderr or result.stdout).strip()})"
    return f"SLURM job {job} requeued: with ckpt_path=auto in its command it goes on from last.ckpt"


def call_previous(handler: Callable[[int, FrameType | None], Any], signum: int) -> str:
    """Run the handler the job had before training (submitit's requeue, which exits)."""
    handler(signum, None)
    return f"the job's own {signal.Signals(signum).name} handler ran"


class GracefulStop(L.Callback):
    """Turns SIGINT, SIGTERM and a cluster's requeue signal during training into a checkpoint at the step reached
    (see the module docstring). ``checkpoint``: the last.ckpt to write; ``resume``: the command that resumes it."""

    def __init__(self, checkpoint: Path, resume: str) -> None:
        self.checkpoint, self.resume = Path(checkpoint), resume
        self.received: int | None = None
        self.requeue: dict[int, Callable[[], str]] = {}
        self.previous: dict[int, Handler] = {}

    # Lightning sets its own SIGTERM handler just before the fit loop starts: take over after it
    def on_sanity_check_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.install(trainer)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.install(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        self.stop_if_asked(trainer)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.stop_if_asked(trainer)  # a signal during the last validation
        self.restore()

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        self.restore()

    def install(self, trainer: L.Trainer) -> None:
        if self.previous or threading.current_thread() is not threading.main_thread():
            return
        self.requeue = requeue_signals(trainer)
        for signum in (signal.SIGINT, signal.SIGTERM, *self.requeue):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self.record)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def record(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: remember the first signal; the training loop acts on it after the step."""
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = signum
            note = f"lmtrain: {name}: stopping after this step, once last.ckpt is written\n"
        else:  # never interrupt the write: the first signal decides
            note = f"lmtrain: {name} ignored: already stopping; last.ckpt is being written\n"
        os.write(2, note.encode())  # not logging: a handler may run while the logging lock is held

    def stop_if_asked(self, trainer: L.Trainer) -> None:
        """Every rank at the same step: write last.ckpt, say so, requeue on a cluster, end the fit."""
        signum = self.received or 0
        if trainer.world_size > 1:  # the signal may reach one rank only: the largest number decides
            asked = torch.tensor(signum, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(asked, reduce_op="max"))
        if not signum:
            return
        self.received = signum  # also on the ranks that got no signal; ignore any from now on
        with trainer.lightning_module.off_schedule():  # the run goes on as if never stopped (exact resume)
            trainer.save_checkpoint(self.checkpoint, weights_only=False)  # all ranks take part, rank 0 writes
        step = trainer.global_step
        if trainer.is_global_zero:
            name = signal.Signals(signum).name
            saved = self.checkpoint
            log.warning("stopped by %s at step %d, saved in %s; resume with: %s", name, step, saved, self.resume)
            if signum in self.requeue:  # after the line: submitit's handler exits
                log.warning("%s", self.requeue[signum]())
        raise TrainingStopped(signum, step)
