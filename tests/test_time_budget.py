"""python -m lmtrain.time_budget: validation perplexity against training seconds, the table at budgets, the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmtrain.study.records import append_record, build_record, read_records
from lmtrain.study.render import check, render
from lmtrain.study.spec import Cell, Run, StudyError, parse_spec
from lmtrain.tools import time_budget
from lmtrain.tools.run_records import find_runs, load_run
from lmtrain.tools.time_budget import budget_table, recorded_runs, timed_run, timed_runs


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


def test_the_seeds_of_a_strategy_share_its_colour_and_one_legend_entry(tmp_path, monkeypatch):
    """Runs that differ only by their seed are one group: one colour, one legend entry naming how many runs; each
    group its own colour (with 18 runs, one colour each cycled through 10 and strategies shared colours)."""
    runs = [
        time_budget.TimedRun(f"output={output} seed={seed}", [(60.0 * seed, 100.0 + seed)], 1, 1, None)
        for output in ("full", "rff", "hsm")
        for seed in (1, 2, 3)
    ]
    figures = []
    monkeypatch.setattr(time_budget, "save_figure", lambda fig, path, plt: figures.append(fig) or Path(path))
    time_budget.plot_ppl_vs_time(runs, tmp_path / "p.png", "t")
    lines = figures[0].axes[0].get_lines()
    colours = {line.get_label(): line.get_color() for line in lines if not line.get_label().startswith("_")}
    assert list(colours) == ["output=full (3 runs)", "output=rff (3 runs)", "output=hsm (3 runs)"]
    assert len(set(colours.values())) == 3
    assert [line.get_color() for line in lines] == [colour for colour in colours.values() for _ in range(3)]


def test_a_folder_without_runs_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert time_budget.main([str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err


def two_recorded_runs(tmp_path: Path) -> tuple[Path, Path]:
    """The slow and fast runs above as run folders of a study ``t`` (output=full and output=hsm, seed 1) and as
    that study's records."""
    runs, records = tmp_path / "runs", tmp_path / "docs" / "t" / "records.jsonl"
    for output, points, best in (("full", SLOW, 100.0), ("hsm", FAST, None)):
        folder = fake_timed_run(runs / f"output-{output}__seed-1", output, points, best=best)
        run = Run(Cell((("output", output),)), 1)
        append_record(records, build_record("t", run, folder, 1, 1.0, None, {"commit": "abc", "dirty": False}))
    return runs, records


SLOW = [(3, 50.0, 900.0), (8, 112.5, 950.0), (9, 125.0, 700.0)]
FAST = [(49, 60.5, 400.0), (99, 120.5, 300.0)]


def test_the_records_give_the_curves_and_the_table_the_run_folders_give(tmp_path):
    """Which bug: a summary that only the (uncommitted) run folders can regenerate, or that reads the records
    differently (steps, tokens per step, the source's optimum)."""
    runs, records = two_recorded_runs(tmp_path)
    from_folders, from_records = timed_runs(find_runs(runs)), recorded_runs(read_records(records))
    assert [r.label for r in from_records] == ["full", "hsm"]  # what differs between the records
    for folder_run, record_run in zip(from_folders, from_records, strict=True):
        assert (record_run.curve, record_run.steps, record_run.tokens_per_step, record_run.best_possible) == (
            folder_run.curve, folder_run.steps, folder_run.tokens_per_step, folder_run.best_possible
        )  # fmt: skip
    out = tmp_path / "out"
    assert time_budget.main([str(records), "--budgets", "1,2", "--out", str(out)]) == 0  # a records file
    assert (out / "summary.md").read_text() == budget_table(from_records, [60.0, 120.0])
    assert "| hsm | 400.0 | 300.0 | 100 |" in (out / "summary.md").read_text()


def test_a_study_with_budgets_renders_and_checks_its_summary_from_the_records(tmp_path):
    _, records = two_recorded_runs(tmp_path)
    data = {"grid": [{"output": ["full", "hsm"]}], "seeds": [1], "metric": "val/ppl", "budgets": [1, 2]}
    spec = parse_spec("t", data)
    written = render(spec, tmp_path / "docs")
    assert [p.name for p in written] == ["table.md", "plot.png", "summary.md", "ppl_vs_time.png"]
    assert check(spec, tmp_path / "docs") is None
    summary = records.parent / "summary.md"
    summary.write_text(summary.read_text().replace("300.0", "299.0"))  # a hand-edited number
    assert "summary.md is missing or differs" in check(spec, tmp_path / "docs")
    with pytest.raises(StudyError, match="budgets"):
        parse_spec("t", {**data, "budgets": [0]})
