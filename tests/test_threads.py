"""threads=auto divides the usable cores among the jobs that run at once."""

from __future__ import annotations

import pytest
import torch

from lmtrain.training import threads


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
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
