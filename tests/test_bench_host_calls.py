"""scripts/bench_host_calls.py: calls per step are the calls that grow with the steps, setup and warm-up left out."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_host_calls(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module("bench_host_calls")


def step_work() -> None:
    pass


def setup_work() -> None:
    pass


def test_per_step_counts_only_what_each_step_calls(bench_host_calls):
    first_run = []

    def loop(steps: int) -> None:
        setup_work()  # once per run: cancels out
        if not first_run:  # once per process (imports, caches): absorbed by the warm-up run
            first_run.append(True)
            for _ in range(50):
                setup_work()
        for _ in range(steps):
            step_work()
            step_work()

    counts = bench_host_calls.per_step(loop, 3, 13)
    by_name = {key.split(" ", 1)[1]: value for (_, key), value in counts.items()}
    assert by_name["step_work"] == 2.0
    assert by_name["setup_work"] == 0.0
    assert {owner for owner, _ in counts} <= {"builtins", "lightning", "lmtrain", "torch", "python"}


def test_package_names_whose_code_runs(bench_host_calls):
    package = bench_host_calls.package
    assert package("~") == "builtins"
    assert package("/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py") == "lightning"
    assert package("/venv/lib/python3.11/site-packages/lightning_utilities/core/enums.py") == "lightning"
    assert package("/work/main/lmtrain/run/host_time.py") == "lmtrain"
    assert package("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py") == "torch"
    assert package("/usr/lib/python3.11/contextlib.py") == "python"
