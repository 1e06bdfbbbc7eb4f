"""Turning known failures into one readable line (and a failed W&B run in sweeps) instead of a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from hydra.errors import InstantiationException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

log = logging.getLogger("lmtrain")


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


def run_guarded(train: Callable[[DictConfig], dict[str, float]], cfg: DictConfig) -> dict[str, float] | None:
    """Run `train`; a failure marks the W&B run failed. A known failure prints one line (single run: exit 2);
    in a sweep every failure ends only its job (logged, with the traceback for unknown ones) and the sweep goes on."""
    from lmtrain.module import NonFiniteLossError

    try:
        return train(cfg)
    except Exception as exc:
        mark_wandb_failed()
        cause = root_cause(exc)
        known = isinstance(cause, (ValueError, NonFiniteLossError, OmegaConfBaseException, FileNotFoundError))
        message = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if isinstance(cause, NonFiniteLossError):
            message += f"; the last good checkpoint is kept in {cfg.run_dir}/checkpoints"
        if in_multirun():
            log.error("job failed: %s", message, exc_info=None if known else exc)
            return None
        if not known:
            raise
        fail(message)
    return None


def mark_wandb_failed() -> None:
    try:
        from lmtrain.run import finish_wandb

        finish_wandb(exit_code=1)
    except Exception:  # W&B bookkeeping must never hide the real error
        pass
