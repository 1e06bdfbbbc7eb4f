"""Turning known failures into one readable line (and a failed W&B run in sweeps) instead of a traceback."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import InstantiationException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

log = logging.getLogger("lmtrain")
RANK_0_GRACE_S = 20.0  # how long a failed rank waits for rank 0 to end (and say the error) before it speaks itself


@dataclass
class RunFolder:
    """What a failed single run may clean up: its run folder when ``own`` (created by this call, which
    ``started`` then), and up to ``parents`` of its parent folders that this leaves empty."""

    started: float
    own: bool
    parents: int = 0


class SweepStopped(BaseException):  # noqa: N818 (it travels like SystemExit)
    """A sweep job's failure that stops the sweep: Hydra's launchers catch a job's ``Exception`` and go on to the
    next job, so it travels as a BaseException up to lmtrain's entry (``lmtrain.cli.app``), which prints ``line``
    and exits with ``code`` (2: a mistake in the job's input, 1: an unexpected error, logged with its traceback)."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line, self.code = line, code


def this_job() -> str:
    """'job N (its overrides)' of the running sweep job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():  # called outside Hydra's app (a test)
        return "a sweep job"
    job = HydraConfig.get()
    return f"job {job.job.num} ({' '.join(job.overrides.task)})"


def fail(message: str) -> None:
    print(f"lmtrain: error: {message}", file=sys.stderr)
    sys.exit(2)


def root_cause(exc: BaseException) -> BaseException:
    """Hydra wraps constructor errors; the user wants the inner ValueError's sentence."""
    while isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_guarded(
    train: Callable[[DictConfig], dict[str, float]], cfg: DictConfig, folder: RunFolder | None = None
) -> dict[str, float] | None:
    """Run `train`; a failure marks the W&B run failed. A known failure prints one line (single run: exit 2). In a
    sweep a NaN loss ends only its job (logged) and the sweep goes on; any other failure stops the sweep
    (``SweepStopped``: one line naming the job, exit 2, or exit 1 after the traceback for an unexpected one).
    A run or job that failed before it wrote anything of value removes its folder (see ``RunFolder``). Under DDP
    only rank 0 prints the line, and no rank removes the folder the others write into."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lmtrain.cli.machine import ddp_child, several_processes
    from lmtrain.training.step import NonFiniteLossError

    launcher = os.getppid()  # rank 0, for a rank that Lightning's launcher started
    try:
        return train(cfg)
    except Exception as exc:
        offline_wandb = mark_wandb_failed()
        cause = root_cause(exc)
        known = isinstance(
            cause,
            (ValueError, NonFiniteLossError, OmegaConfBaseException, FileNotFoundError, MisconfigurationException),
        )
        message = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        run_dir = Path(str(cfg.run_dir))
        if isinstance(cause, NonFiniteLossError):
            last = run_dir / "checkpoints" / "last.ckpt"
            kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint had been written yet"
            message += f"; {kept}"
        if in_multirun():
            if isinstance(cause, NonFiniteLossError):  # a result of training, not a mistake: the sweep goes on
                log.error("job failed: %s", message)
                return None
            if not known:
                log.error("job failed: %s", message, exc_info=exc)
            if folder is not None:  # a job folder created by this call, with nothing of value
                discard_run_folder(run_dir, RunFolder(folder.started, own=True))
            raise SweepStopped(f"{this_job()} failed, so the sweep stops: {message}", 2 if known else 1) from exc
        if ddp_child():
            end_rank(message, known, launcher)
        alone = not several_processes()  # else the other ranks may still write into the folder
        removed = folder is not None and folder.own and alone and discard_run_folder(run_dir, folder)
        if offline_wandb is not None and not removed:
            from lmtrain.run.loggers.wandb_run import sync_line

            print(sync_line(offline_wandb), flush=True)
        if not known:
            raise
        fail(message)
    return None


def end_rank(message: str, known: bool, launcher: int) -> None:
    """A rank other than 0 failed; its log file keeps the message. When rank 0 ends within a few seconds (every rank
    met the same error, and rank 0 says it in one line; or rank 0 failed first and this error followed), this rank
    exits quietly. Otherwise the error is this rank's alone, and it says it: one line, or (returning) the
    traceback."""
    log.error("this rank failed: %s", message)
    deadline = time.monotonic() + RANK_0_GRACE_S
    while os.getppid() == launcher and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.getppid() != launcher:  # rank 0 has ended
        sys.exit(2)
    if known:
        fail(f"process {os.environ.get('LOCAL_RANK', '?')} of the run: {message}")


def discard_run_folder(run_dir: Path, folder: RunFolder) -> bool:
    """Remove ``run_dir`` if it holds nothing of value: no checkpoint, no metrics row, and no file older than
    this call (so an existing folder, e.g. one being resumed, is never touched). True if it was removed."""
    if not run_dir.is_dir():
        return False
    files = [p for p in run_dir.rglob("*") if not p.is_dir() or p.is_symlink()]
    if any(p.lstat().st_mtime < folder.started or p.suffix == ".ckpt" for p in files):
        return False
    metrics = run_dir / "metrics.csv"
    if metrics.is_file() and len(metrics.read_text().splitlines()) > 1:  # a header and some rows
        return False
    shutil.rmtree(run_dir)
    parent = run_dir.parent
    for _ in range(folder.parents):  # outputs/DATE and outputs, when this left them empty
        try:
            parent.rmdir()
        except OSError:  # not empty
            break
        parent = parent.parent
    return True


def mark_wandb_failed() -> Path | None:
    """Finish this process's W&B run as failed; its folder when it was an offline run."""
    try:
        from lmtrain.run.loggers.wandb_run import finish_wandb

        return finish_wandb(exit_code=1)
    except Exception:  # W&B bookkeeping must never hide the real error
        return None
