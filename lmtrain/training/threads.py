"""How many compute threads a training process uses, so that parallel jobs on one machine don't fight."""

from __future__ import annotations

import os

import torch

JOBS_ENV = "LMTRAIN_CONCURRENT_JOBS"  # how many lmtrain processes share this machine's cores (set it by hand)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def concurrent_jobs() -> int:
    """Processes sharing the cores: ``LMTRAIN_CONCURRENT_JOBS``, else the joblib launcher's ``n_jobs`` in a Hydra
    multirun, times the local ranks of a multi-process (DDP) run; 1 when nothing says otherwise."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if os.environ.get(JOBS_ENV):
        return max(1, int(os.environ[JOBS_ENV])) * ranks
    return max(1, _launcher_jobs()) * ranks


def _launcher_jobs() -> int:
    """The joblib launcher's parallel jobs (n_jobs; -1 or null = one per core), or 1 outside such a sweep."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return 1
    launcher = HydraConfig.get().get("launcher") or {}
    if "n_jobs" not in launcher:
        return 1
    n_jobs = launcher.get("n_jobs")
    return usable_cores() if n_jobs in (None, -1) else int(n_jobs)


def resolve_threads(setting: int | str) -> int:
    """``threads=auto`` -> ``OMP_NUM_THREADS`` when the environment sets it, else the usable cores divided among
    the concurrent jobs (at least 1); a number -> itself."""
    if setting == "auto":
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            return max(1, int(os.environ["OMP_NUM_THREADS"]))
        return max(1, usable_cores() // concurrent_jobs())
    threads = int(setting)
    if threads < 1:
        raise ValueError(f"threads must be a positive number or 'auto', got {setting!r}")
    return threads


def apply_threads(setting: int | str) -> int:
    """Set torch's intra-op threads from ``setting`` (see ``resolve_threads``); returns the number used."""
    threads = resolve_threads(setting)
    torch.set_num_threads(threads)
    return threads
