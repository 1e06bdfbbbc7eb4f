"""scripts/bench_gpu.py on its CPU smoke path (``--quick --device cpu``): every cell of the plan runs or is recorded
with its reason, and the record, its goals and its rendered table have their shape. No timing is asserted."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest
from lab.provenance import junit_counts
from lab.step_clock import clock_throughput
from omegaconf import OmegaConf
from records.bench import render_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The script as a module (it imports scripts/bench_train.py beside it)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    return importlib.import_module("bench_gpu")


def test_the_quick_cpu_run_writes_every_cell_the_goals_and_the_table(bench_gpu, tmp_path, one_thread):
    out = tmp_path / "gpu_smoke.json"
    outputs = "full,rff,broken=rff:output.num_samples=0"  # a cell that fails: recorded, the others go on
    record = bench_gpu.main(["--quick", "--device", "cpu", "--outputs", outputs, "--tests", "none", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    assert record["kind"] == "bench_gpu" and record["quick"] and record["environment"]["device_type"] == "cpu"
    assert record["settings"]["classes"] == {"synthetic:300": 300}
    cells = {(c["precision"], c["strategy"]): c for c in record["cells"]}
    strategies = ("full", "full chunked", "full dense", "rff", "broken", "plain loop", "plain loop, loss read")
    assert set(cells) == {(p, s) for p in ("32-true", "bf16-mixed") for s in strategies}
    for (precision, strategy), cell in cells.items():
        if strategy == "broken":
            assert cell["status"] == "error" and "num_samples" in cell["reason"] and not cell["tokens_per_sec"]
            continue
        assert cell["status"] == "ok" and len(cell["tokens_per_sec"]) == 1 and cell["tokens_per_sec"][0] > 0
        assert f"trainer.precision={precision}" in cell["overrides"]
        if not strategy.startswith("plain loop"):
            assert cell["steps_timed"] == [4]  # 6 steps, 2 of warm-up
            assert "+callbacks.clock.path=RUN_DIR/clock.json" in cell["overrides"]
    goals = [(c["goal"], c["precision"]) for c in record["checks"]]
    # 300 classes: only the goal about every corpus (the rff goals are about 10^4 and 10^6 classes)
    assert len(goals) == 2 and all(c["verdict"] in ("PASS", "FAIL") for c in record["checks"])
    assert ("lmtrain full / plain PyTorch loop >= 0.9", "bf16-mixed") in goals
    table = out.with_suffix(".md").read_text()
    assert table == render_bench(out)  # what `python scripts/render_docs.py --check` compares
    assert (
        "| synthetic:300 (300 types): strategy | float32 tokens/s | x full | peak GiB | bf16-mixed tokens/s |" in table
    )
    assert "| full | " in table and "| plain loop | " in table and "| broken | error: " in table
    assert "| plain loop, loss read | " in table
    assert "Smoke run" in table and "CUDA tests (`not run`): not run (--tests none)" in table


def test_cells_that_cannot_run_in_time_or_without_their_corpus_are_skipped_with_the_reason(
    bench_gpu, tmp_path, monkeypatch
):
    monkeypatch.setenv("LMTRAIN_DATA_DIR", str(tmp_path / "no-data"))
    args = ["--quick", "--device", "cpu", "--outputs", "full", "--corpora", "ptb,synthetic:300", "--tests", "none"]
    record = bench_gpu.main([*args, "--minutes", "0.01", "--precisions", "32-true"])
    reasons = {(c["corpus"], c["strategy"]): (c["status"], c["reason"]) for c in record["cells"]}
    assert reasons[("ptb", "full")] == ("skipped", f"no {tmp_path}/no-data/ptb/train.txt: set LMTRAIN_DATA_DIR")
    assert reasons[("synthetic:300", "plain loop")] == ("skipped", "time budget (--minutes 0.01)")
    assert {c["verdict"] for c in record["checks"]} == {"n/a"}


def test_the_chunked_and_the_dense_full_softmax_are_measured_where_full_has_both(bench_gpu, monkeypatch):
    args = bench_gpu.parse_args(["--device", "cpu", "--outputs", "full,rff shared=rff:++output.shared_negatives=true"])
    monkeypatch.setattr(bench_gpu, "compose_config", lambda _: OmegaConf.create({"output": {}}))  # no such option
    assert bench_gpu.strategies(args) == {"full": "full", "rff shared": "rff:++output.shared_negatives=true"}
    monkeypatch.setattr(bench_gpu, "compose_config", lambda _: OmegaConf.create({"output": {"train_chunk": None}}))
    assert list(bench_gpu.strategies(args).items()) == [
        ("full", "full"),
        ("full chunked", "full:output.train_chunk=4096"),
        ("full dense", "full:output.train_chunk=0"),
        ("rff shared", "rff:++output.shared_negatives=true"),
    ]
    # a preset whose output is not full (experiment=awd_lstm_mos_ptb cannot compose output=full): no full variants
    assert bench_gpu.strategies(bench_gpu.parse_args(["--device", "cpu", "--outputs", "mos"])) == {"mos": "mos"}


def test_a_round_runs_the_goals_cells_first_in_each_corpus_and_precision(bench_gpu):
    """A round cut short by the time budget keeps full, the plain loop and rff side by side."""
    names = ["full", "full chunked", "uniform", "rff", bench_gpu.PLAIN, bench_gpu.PLAIN_READ]
    groups = [(c, p) for c in ("ptb", "zipf:1e6") for p in ("32-true", "bf16-mixed")]
    cells = [{"corpus": c, "precision": p, "strategy": s} for c, p in groups for s in names]
    order = [(cells[i]["corpus"], cells[i]["precision"], cells[i]["strategy"]) for i in bench_gpu.run_order(cells)]
    expected = ["full", bench_gpu.PLAIN, bench_gpu.PLAIN_READ, "rff", "full chunked", "uniform"]
    assert order == [(c, p, s) for c, p in groups for s in expected]


def test_the_cuda_tests_are_counted_from_pytests_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10" time="1.0">'
        "</testsuite></testsuites>"
    )
    assert junit_counts(report) == {"passed": 4, "failed": 2, "errors": 1, "skipped": 3}


def test_the_clock_times_the_steps_after_the_warmup(tmp_path):
    clock = tmp_path / "clock.json"
    clock.write_text(json.dumps({"warmup": 1, "seconds": [1.0, 2.0, 3.0, 5.0], "tokens": [10, 10, 10, 10]}))
    assert clock_throughput(clock, 1) == (30 / 4.0, 3)  # steps 2-4: 30 tokens from t = 1 to t = 5
    assert clock_throughput(clock, 3) == (30 / 4.0, 3)  # too few steps for 3 of warm-up: the first third, one
    with pytest.raises(ValueError, match="at least 2"):
        clock.write_text(json.dumps({"warmup": 1, "seconds": [1.0], "tokens": [10]}))
        clock_throughput(clock, 1)


def test_a_cell_shows_its_median_and_how_far_its_rounds_spread():
    """Which bug: a table that hides how much the rounds of one cell disagree (on an H200 they moved by up to 15%)."""
    from records.gpu_bench import _cell_columns

    def cell(*samples: float) -> dict:
        return {"status": "ok", "tokens_per_sec": list(samples), "peak_gib": 1.0}

    assert _cell_columns(cell(100.0, 120.0, 110.0), 220.0, 3) == ["110 ±9%", "0.50", "1.00"]
    assert _cell_columns(cell(1000.0, 1001.0), 1000.5, 3)[0] == "1,000 ±<1% (2 of 3 rounds)"
    assert _cell_columns(cell(500.0), None, 1) == ["500", "—", "1.00"]


def test_the_plain_loop_with_its_loss_read_waits_once_more_a_step(bench_gpu, one_thread):
    """Which bug: a "loss read" cell that does not read (then it cannot tell the sync's cost from the rest)."""
    import argparse

    from lab.launches import DispatchCounter

    bench = argparse.Namespace(
        experiment="none", device="cpu", threads=None, default_malloc=False, steps=5, warmup=1,
        override=[*bench_gpu.QUICK, "trainer.precision=32-true"],
    )  # fmt: skip
    syncs = {}
    for read in (False, True):
        with DispatchCounter() as counter:
            assert bench_gpu.plain_round(bench, "synthetic:300", read_loss=read) > 0
        syncs[read] = counter.counts.sync_ops.get("_local_scalar_dense", 0)
    assert syncs[True] - syncs[False] == 5  # one read a step (the data's setup reads a few values either way)


def test_each_goal_holds_only_at_its_own_number_of_classes():
    """The 10^4 goal is not read at 10^6 (nor the 10^6 goal at 10^5) when a record covers other corpora than the
    default three: goals follow the corpora's sizes, not their order."""
    from records.gpu_bench import checks

    speeds = {"full": 100.0, "rff": 300.0, "plain loop": 100.0}
    for corpora in (["zipf:1000000"], ["ptb", "zipf:100000"], ["ptb", "zipf:100000", "zipf:1000000"]):
        classes = {"ptb": 10**4, "zipf:100000": 10**5, "zipf:1000000": 10**6}
        cells = [
            {"corpus": c, "precision": "32-true", "strategy": s, "status": "ok", "tokens_per_sec": [v]}
            for c in corpora
            for s, v in speeds.items()
        ]
        record = {"cells": cells, "settings": {"corpora": corpora, "precisions": ["32-true"], "classes": classes}}
        held = {(c["corpus"], c["goal"]) for c in checks(record)}
        rff = {corpus for corpus, goal in held if goal.startswith("per-position rff / full >= 0.5")}
        rff_scale = {corpus for corpus, goal in held if goal.startswith("per-position rff / full >= 5")}
        assert rff == ({"ptb"} & set(corpora)) and rff_scale == ({"zipf:1000000"} & set(corpora))
        assert {corpus for corpus, goal in held if "plain" in goal} == set(corpora)
