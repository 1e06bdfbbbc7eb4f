"""threads=auto divides the usable cores among the jobs that run at once, and leaves out those other processes
keep busy."""

from __future__ import annotations

import logging
import os
import re

import pytest
import torch

from lmtrain.process import threads


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)  # an idle machine
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(threads.JOBS_ENV, raising=False)


def test_auto_uses_every_core_for_one_job(four_cores):
    assert threads.resolve_threads("auto") == 4


def test_auto_divides_cores_among_concurrent_jobs(four_cores, monkeypatch):
    monkeypatch.setenv(threads.JOBS_ENV, "2")
    assert threads.resolve_threads("auto") == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two DDP ranks per job
    assert threads.resolve_threads("auto") == 1
    monkeypatch.setenv(threads.JOBS_ENV, "8")
    assert threads.resolve_threads("auto") == 1  # never below one


def test_auto_reads_the_joblib_launchers_n_jobs(four_cores, monkeypatch):
    monkeypatch.setattr(threads, "_launcher_jobs", lambda: 2)
    assert threads.resolve_threads("auto") == 2


def test_explicit_settings_win(four_cores, monkeypatch):
    assert threads.resolve_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.resolve_threads("auto") == 1
    with pytest.raises(ValueError, match="threads"):
        threads.resolve_threads(0)


def test_apply_sets_torch_threads(four_cores):
    before = torch.get_num_threads()
    try:
        assert threads.apply_threads(1) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def four_cpus_reading(monkeypatch):
    """Four usable CPUs whose /proc/stat readings the test gives: (idle, total) ticks before and after the sample."""
    monkeypatch.setattr(threads, "allowed_cpus", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads, "SAMPLE_SECONDS", 0.01)
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", threads.JOBS_ENV):
        monkeypatch.delenv(name, raising=False)

    def reading(idle_share: float) -> None:
        snapshots = iter([(1000, 4000), (1000 + int(400 * idle_share), 4400)])  # 100 ticks per CPU in between
        monkeypatch.setattr(threads, "cpu_times", lambda cpus: next(snapshots))

    return reading


@pytest.mark.parametrize(("idle_share", "expected"), [(1.0, 4), (0.75, 3), (0.5, 2), (0.3, 1), (0.0, 1)])
def test_auto_leaves_out_the_cores_other_processes_keep_busy(four_cpus_reading, caplog, idle_share, expected):
    four_cpus_reading(idle_share)
    with caplog.at_level(logging.INFO, logger="lmtrain"):
        assert threads.resolve_threads("auto") == expected
    lines = [r.getMessage() for r in caplog.records if "threads=auto" in r.getMessage()]
    if expected == 4:
        assert not lines  # an idle machine: nothing to say
    else:
        [line] = lines
        busy = float(re.search(r"use ([\d.]+) of its 4 cores", line).group(1))
        assert busy == pytest.approx(4 * (1 - idle_share), abs=0.15)  # less this process's own use while it watched
        assert f"uses {expected} thread" in line and "instead of 4" in line


def test_a_half_busy_core_is_not_counted_free(four_cpus_reading):
    four_cpus_reading(0.875)  # 3.5 cores idle: a fourth thread would wait on the half-busy core
    assert threads.resolve_threads("auto") == 3


def test_the_reading_is_taken_only_when_there_is_a_choice(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda: pytest.fail("measured without a choice to make"))
    for name in ("OMP_NUM_THREADS", threads.JOBS_ENV):  # no thread count given, no other job declared
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    assert threads.resolve_threads("auto") == 1
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    assert threads.resolve_threads("auto", measure=False) == 4


def test_busy_cores_reads_this_machine():
    busy = threads.busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= threads.usable_cores() + 0.5


def test_jobs_sharing_cores_declares_the_jobs_and_puts_back_what_was_there(monkeypatch):
    """A study's runs and a scoring study's calls read the jobs from the variable; after the block (an exception
    included) the caller's own value, or none, is back: a study must not leave its process declaring jobs."""
    monkeypatch.delenv(threads.JOBS_ENV, raising=False)
    with threads.jobs_sharing_cores(3):
        assert os.environ[threads.JOBS_ENV] == "3" and threads.concurrent_jobs() == 3
    assert threads.JOBS_ENV not in os.environ
    monkeypatch.setenv(threads.JOBS_ENV, "2")
    with pytest.raises(RuntimeError), threads.jobs_sharing_cores(5):
        assert threads.concurrent_jobs() == 5
        raise RuntimeError("a failed run")
    assert os.environ[threads.JOBS_ENV] == "2"
