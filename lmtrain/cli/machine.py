"""What a config asks of this machine, checked before Hydra creates a folder and before Lightning starts a process:
an accelerator it has, as many devices as it has (on a CPU: a core per process), a precision that device runs as
asked, a global batch that the processes split into equal blocks of rows, and an output folder this user can write.
Lightning then builds a Trainer from ``trainer`` alone (no loggers, callbacks or files), so whatever else it refuses
while it builds one is refused here too, in one line (``ConfigError``)."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lmtrain.common.precision import PRECISION_ALIASES
from lmtrain.config.validate import ConfigError

# the accelerator names Lightning takes for a GPU, and the kind of device each one needs (``machine_has``)
GPU_NAMES = {"gpu": "GPU", "cuda": "CUDA GPU", "mps": "MPS (Apple silicon) GPU", "tpu": "TPU"}
DEVICE_NAMES = {"CPUAccelerator": "the CPU", "CUDAAccelerator": "a CUDA GPU", "MPSAccelerator": "an MPS GPU"}


# where a process of a multi-process run finds its rank: Lightning's launcher, torchrun, SLURM's srun
RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")
WORLD_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS")


def ddp_child() -> bool:
    """Whether this process is a rank other than 0 of a multi-process run (rank 0 makes the checks and speaks)."""
    return any(number_in(name) > 0 for name in RANK_VARIABLES)


def several_processes() -> bool:
    """Whether this process is one of several of a run (set once Lightning's launcher or SLURM started them)."""
    return any(number_in(name) > 1 for name in WORLD_VARIABLES)


def number_in(variable: str) -> int:
    """The environment variable ``variable`` as a number; 0 when it is unset or not a number."""
    text = os.environ.get(variable, "").strip()
    return int(text) if text.isdigit() else 0


def check_machine(cfg: DictConfig) -> None:
    """Raise ConfigError with the first thing ``cfg`` asks that this machine cannot give (one line)."""
    problem = next(machine_problems(cfg), None)
    if problem is not None:
        raise ConfigError(problem)


def check_output_folder(folder: str, key: str) -> None:
    """Raise ConfigError when ``folder`` (the value of ``key``, e.g. hydra.run.dir) cannot be created or written."""
    path = Path(folder).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{key}={folder} cannot be created: {existing} is a file; choose another {key}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it is" if existing == path else f"{existing} is"
        raise ConfigError(f"{key}={folder} cannot be written: {where} not writable by this user; choose another {key}")
    if existing != path:  # os.access speaks for the user, not the file system (root, /proc, a read-only mount): try
        probe = existing / path.relative_to(existing).parts[0]
        try:
            probe.mkdir()
        except FileExistsError:  # made meanwhile (another job of a sweep): there it is
            return
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            message = f"{key}={folder} cannot be created in {existing} ({reason}); choose another {key}"
            raise ConfigError(message) from None
        with contextlib.suppress(OSError):  # not empty: another job of a sweep writes into it now
            probe.rmdir()  # nothing is left behind: Hydra creates the folder once every check passed


def machine_problems(cfg: DictConfig) -> Iterator[str]:
    trainer_cfg = cfg.get("trainer")
    if trainer_cfg is None or ddp_child():
        return
    accelerator = str(trainer_cfg.get("accelerator", "auto")).lower()
    devices = trainer_cfg.get("devices", "auto")
    if accelerator in GPU_NAMES:
        count = machine_has(accelerator)
        kind = GPU_NAMES[accelerator]
        if count == 0:
            yield (
                f"trainer.accelerator={accelerator}: this machine has no {kind}; use trainer.accelerator=cpu or "
                "auto (the GPU when there is one)"
            )
            return
        wanted = device_count(devices)
        if wanted is not None and wanted > count:
            has = f"{count} {kind}{'s' if count > 1 else ''}"
            yield f"trainer.devices={devices}: this machine has {has}; use trainer.devices={count} or fewer"
            return
    elif accelerator == "cpu" or (accelerator == "auto" and machine_has("gpu") == 0):  # a process per CPU device
        wanted, cores = device_count(devices), cpu_cores()
        if wanted is not None and wanted > cores:
            yield (
                f"trainer.devices={devices}: this machine has {cores} CPU core{'s' if cores > 1 else ''} for its "
                f"processes (one per device); use trainer.devices={cores} or fewer"
            )
            return
    try:
        trainer = trial_trainer(trainer_cfg)
    except Exception as exc:  # anything Lightning refuses while building a Trainer, in its own words
        from lmtrain.config.explain import innermost, one_line

        given = settings(trainer_cfg)
        yield f"trainer{f' ({given})' if given else ''}: {one_line(innermost(exc))}"
        return
    yield from precision_problems(str(trainer_cfg.get("precision")), trainer)
    world = int(trainer.world_size)
    for key in ("batch_size", "eval_batch_size"):
        rows = (cfg.get("data") or {}).get(key)
        if isinstance(rows, int) and rows % world:
            yield (
                f"data.{key}={rows} is not divisible by the {world} processes ({settings(trainer_cfg)}): set "
                f"data.{key} to a multiple of {world} (it is the global batch, split into equal blocks of rows)"
            )


def precision_problems(asked: str, trainer: Any) -> Iterator[str]:
    """A precision that Lightning swapped for another on this device (it warns and goes on): refused."""
    wanted = PRECISION_ALIASES.get(asked, asked)
    chosen = str(trainer.precision)
    if chosen != wanted:
        device = DEVICE_NAMES.get(type(trainer.accelerator).__name__, type(trainer.accelerator).__name__)
        yield (
            f"trainer.precision={asked}: {device} does not run it (Lightning would train in {chosen}); use "
            f"trainer.precision={chosen} or 32-true"
        )


def machine_has(accelerator: str) -> int:
    """How many devices of the kind ``accelerator`` names this machine has (0: none)."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator, XLAAccelerator

    if accelerator == "tpu":
        return XLAAccelerator.auto_device_count() if XLAAccelerator.is_available() else 0
    cuda = CUDAAccelerator.auto_device_count() if accelerator != "mps" and CUDAAccelerator.is_available() else 0
    mps = 1 if accelerator != "cuda" and MPSAccelerator.is_available() else 0
    return cuda or mps


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it, else every core)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def device_count(devices: Any) -> int | None:
    """How many devices ``trainer.devices`` asks for: a number, a list of ids or "0,1"; None for auto and -1 (all)."""
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            return len([d for d in text.split(",") if d.strip()])
        devices = int(text) if text.lstrip("-").isdigit() else None
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__"):
        return len(devices)
    return devices if isinstance(devices, int) and devices > 0 else None


def settings(trainer_cfg: DictConfig) -> str:
    """'accelerator=cpu, devices=4' as the config sets them."""
    keys = ("accelerator", "devices", "num_nodes", "strategy")
    return ", ".join(f"trainer.{k}={trainer_cfg.get(k)}" for k in keys if trainer_cfg.get(k) not in (None, 1, "auto"))


def trial_trainer(trainer_cfg: DictConfig) -> Any:
    """A Lightning Trainer built from ``trainer_cfg`` as lmtrain builds the run's, without loggers, callbacks,
    checkpoints or a progress bar: it writes nothing and starts no process; its messages are not shown."""
    from hydra.utils import instantiate

    with quiet_lightning():
        return instantiate(
            trainer_cfg,
            logger=False,
            callbacks=[],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            _convert_="all",
        )


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's device summary and warnings (its own Trainer prints them to the run's log) left out here."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
