"""python -m lmtrain.time_budget: validation perplexity against training seconds, the table at budgets, the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmtrain.tools import time_budget
from lmtrain.tools.run_records import load_run
from lmtrain.tools.time_budget import timed_run


def fake_timed_run(folder: Path, name: str, points: list[tuple[int, float, float]], best: float | None = None) -> Path:
    """A run folder whose validations at (step, training seconds, val ppl) follow a loss row at every step."""
    folder.mkdir(parents=True)
    rows = ["epoch,step,train/loss,train/seconds,val/ppl"]
    last = points[-1][0]
    validations = {step: (seconds, ppl) for step, seconds, ppl in points}
    for step in range(last + 1):
        seconds, ppl = validations.get(step, ("", ""))
        rows.append(f"0,{step},5.0,{seconds},{ppl}")
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "config.yaml").write_text("data:\n  batch_size: 20\n  bptt: 35\n")
    info = {"name": name, **({"best_possible_ppl": best} if best else {})}
    (folder / "run.json").write_text(json.dumps(info))
    return folder


def test_the_table_ranks_runs_at_the_last_budget_and_the_png_is_written(tmp_path):
    # slow: 10 steps (12.5 s each) in 125 s, validated at 50 s, 112.5 s (worse) and past a 120 s budget at 125 s;
    # fast: 100 steps, validated just after each minute
    points = [(3, 50.0, 900.0), (8, 112.5, 950.0), (9, 125.0, 700.0)]
    fake_timed_run(tmp_path / "runs" / "slow", "slow", points, best=100.0)
    fake_timed_run(tmp_path / "runs" / "fast", "fast", [(49, 60.5, 400.0), (99, 120.5, 300.0)])
    slow = timed_run(load_run(tmp_path / "runs" / "slow"), "slow")
    assert slow.steps == 10 and slow.tokens_per_sec == pytest.approx(10 * 700 / 125.0)
    assert slow.ppl_at(30.0) is None  # nothing validated yet
    assert slow.ppl_at(100.0) == 900.0  # the best so far, not the last (950)
    assert slow.ppl_at(120.0) == 700.0  # the validation closing the budget (one step past it) counts
    assert timed_run(load_run(tmp_path / "runs" / "fast"), "fast").ppl_at(60.0) == 400.0
    out = tmp_path / "out"
    assert time_budget.main([str(tmp_path / "runs"), "--budgets", "1,2", "--out", str(out)]) == 0
    table = (out / "summary.md").read_text().splitlines()
    assert table[0].startswith("| run | best val ppl by 1 min | best val ppl by 2 min | steps | tokens/s")
    assert table[2].startswith("| fast | 400.0 | 300.0 | 100 |")
    assert table[3].startswith("| slow | 900.0 | 700.0 | 10 |")
    assert "Best possible perplexity of the source (its exact entropy rate): 100.0" in (out / "summary.md").read_text()
    png = out / "ppl_vs_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_folder_without_runs_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert time_budget.main([str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err
