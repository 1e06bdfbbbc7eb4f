"""How many compute threads a training process uses, so that parallel jobs on one machine, and other processes
that hold cores, don't fight."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("lmtrain")

JOBS_ENV = "LMTRAIN_CONCURRENT_JOBS"  # how many lmtrain processes share this machine's cores (set it by hand)


def allowed_cpus() -> set[int]:
    """The ids of the cores this process may run on (its CPU affinity, e.g. under taskset or a container's
    cpuset); every core where the system has no affinity."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (``allowed_cpus``)."""
    return max(1, len(allowed_cpus()))


def concurrent_jobs() -> int:
    """Processes sharing the cores: ``LMTRAIN_CONCURRENT_JOBS``, else the joblib launcher's ``n_jobs`` in a Hydra
    multirun, times the local ranks of a multi-process (DDP) run; 1 when nothing says otherwise."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if os.environ.get(JOBS_ENV):
        return max(1, int(os.environ[JOBS_ENV])) * ranks
    return max(1, _launcher_jobs()) * ranks


@contextmanager
def jobs_sharing_cores(jobs: int) -> Iterator[None]:
    """Within: ``LMTRAIN_CONCURRENT_JOBS`` says ``jobs`` processes share the cores (``threads=auto`` of this process
    and of every child started meanwhile reads it); the previous value after."""
    previous = os.environ.get(JOBS_ENV)
    os.environ[JOBS_ENV] = str(jobs)
    try:
        yield
    finally:
        if previous is None:
            del os.environ[JOBS_ENV]
        else:
            os.environ[JOBS_ENV] = previous


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


SAMPLE_SECONDS = 0.25  # how long the cores' use is watched before threads=auto chooses
FREE_SHARE = 0.75  # a core counts as free when about this share of it was idle: a thread on a half-busy core stalls


def cpu_times(cpus: set[int]) -> tuple[int, int] | None:
    """(idle, total) time of the ``cpus`` since boot, in clock ticks (Linux's /proc/stat; None elsewhere)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    idle = total = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle, total = idle + ticks[3] + ticks[4], total + sum(ticks)
    return (idle, total) if total else None


def busy_cores(seconds: float | None = None) -> float | None:
    """How many of this process's usable cores other processes keep busy: the cores' use over ``seconds`` (from
    /proc/stat; default ``SAMPLE_SECONDS``) less this process's own, or else the 1-minute load average; None when
    neither can be read."""
    seconds = SAMPLE_SECONDS if seconds is None else seconds
    cpus = allowed_cpus()
    before, own, start = cpu_times(cpus), time.process_time(), time.monotonic()
    if before is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    time.sleep(seconds)
    after, own, elapsed = cpu_times(cpus), time.process_time() - own, time.monotonic() - start
    if after is None or after[1] <= before[1]:
        return None
    used = len(cpus) * (1 - (after[0] - before[0]) / (after[1] - before[1]))  # cores in use, this process's too
    return max(0.0, used - own / max(elapsed, 1e-9))


def fit_to_machine(share: int) -> int:
    """``share`` threads, or fewer when other processes hold cores: the cores they leave free (at least 1), and a
    line that says so."""
    if share <= 1:
        return 1
    busy = busy_cores()
    if busy is None:
        return share
    cores = usable_cores()
    free = max(1, math.floor(cores - busy + 1 - FREE_SHARE))
    if free >= share:
        return share
    log.info(
        "threads=auto: the machine is busy (other processes use %.1f of its %d cores), so this run uses %d "
        "thread%s instead of %d (threads=N sets the count)",
        busy,
        cores,
        free,
        "" if free == 1 else "s",
        share,
    )
    return free


def resolve_threads(setting: int | str, measure: bool = True) -> int:
    """``threads=auto`` -> ``OMP_NUM_THREADS`` when the environment sets it, else the usable cores divided among
    the concurrent jobs, fewer when other processes keep cores busy (``fit_to_machine``; not with ``measure``
    False), at least 1; a number -> itself."""
    if setting == "auto":
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            return max(1, int(os.environ["OMP_NUM_THREADS"]))
        share = max(1, usable_cores() // concurrent_jobs())
        return fit_to_machine(share) if measure else share
    threads = int(setting)
    if threads < 1:
        raise ValueError(f"threads must be a positive number or 'auto', got {setting!r}")
    return threads


def apply_threads(setting: int | str) -> int:
    """Set torch's intra-op threads from ``setting`` (see ``resolve_threads``); returns the number used."""
    threads = resolve_threads(setting)
    torch.set_num_threads(threads)
    return threads
