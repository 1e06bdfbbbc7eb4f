"""Scoring studies (lmtrain.study.scores): score's modes over another study's trained runs, one record per (run,
mode), resumed, and the table of means and gains rendered from the records alone."""

from __future__ import annotations

import fnmatch
import re
import statistics

import pytest
import yaml

from lmtrain.output.cache import LAMBDAS, THETAS
from lmtrain.study.__main__ import main as study_main
from lmtrain.study.records import append_record, build_record, read_records
from lmtrain.study.runner import training_folder
from lmtrain.study.scores_render import render_scores_table
from lmtrain.study.scores_spec import find_scores, load_scores, package_scores, parse_scores
from lmtrain.study.spec import StudyError, find_spec, load_spec
from tests.conftest import TINY, make_config

SMALL = ["data.train_tokens=6000", "data.valid_tokens=600", "data.test_tokens=600", "data.eval_batch_size=1"]
SOURCE = {  # the training study whose runs are scored: one cell, seeds 1 and 2 trained, seed 3 recorded without folder
    "description": "tiny",
    "overrides": [*[o for o in TINY if not o.startswith("data.")], *SMALL, "trainer.max_steps=8"],
    "grid": [{"output": ["full"]}],
    "seeds": [1, 2, 3],
}
MODES = {
    "plain": [],
    "cache": ["cache=true", "cache.window=20"],
    "dynamic": ["dynamic=true", "dynamic.stat_batches=2", "dynamic.stat_batch=4"],
    "both": ["cache=true", "cache.window=20", "dynamic=true", "dynamic.stat_batches=2", "dynamic.stat_batch=4"],
}


def table_rows(table: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows by their first cell, each a mapping header -> cell."""
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def mean_sd(values: list[float]) -> list[float]:
    """The mean and sd over seeds, written out."""
    return [statistics.fmean(values), statistics.stdev(values)]


def numbers(cell: str) -> list[float]:
    """'1,234.5 ± 6.7' -> [1234.5, 6.7]; '-3.2 ± 0.4%' -> [-3.2, 0.4]."""
    return [float(n.replace(",", "")) for n in re.findall(r"[-+]?\d[\d,]*\.?\d*", cell)]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny source study: its YAML, records (seeds 1 and 2 trained in-process, seed 3 without a folder), runs."""
    from lmtrain.run.run import train

    base = tmp_path_factory.mktemp("scores")
    path = base / "src.yaml"
    path.write_text(yaml.safe_dump(SOURCE))
    spec, root, runs = load_spec(path), base / "docs", base / "runs"
    for run in spec.runs():
        folder = training_folder(spec, run, runs)
        if run.seed < 3:
            train(make_config([*spec.overrides, *run.cell.overrides(), f"seed={run.seed}", f"run_dir={folder}"]))
            record = build_record(spec.name, run, folder, 1, 1.0, None, {"commit": "abc1234", "dirty": False})
        else:  # recorded, but its folder is gone: reported with its training command, not scored
            record = {"key": run.key, "status": "ok", "config": {"run_dir": str(folder)}}
        append_record(root / spec.name / "records.jsonl", record)
    return path, root, runs


def test_a_scoring_study_records_each_run_and_mode_once_and_resumes(source, tmp_path, capsys):
    path, root, runs = source
    study = tmp_path / "extras.yaml"
    declared = {"study": str(path), "cells": "output=*", "modes": MODES, "overrides": ["device=cpu", "threads=1"]}
    scores = {**declared, "reference": "output=full"}
    study.write_text(yaml.safe_dump({"description": "tiny extras", "scores": scores}, sort_keys=False))  # in order
    args = [str(study), "--root", str(root), "--runs", str(runs)]
    assert study_main(args) == 0
    out = capsys.readouterr().out
    assert "output=full,seed=3: no run folder" in out and "train it: python -m lmtrain" in out and "seed=3" in out
    records = read_records(root / "extras" / "records.jsonl")
    assert sorted(r["key"] for r in records) == sorted(f"output=full,seed={s},mode={m}" for s in (1, 2) for m in MODES)
    by = {(r["seed"], r["mode"]): r for r in records}
    for seed in (1, 2):
        plain = by[seed, "plain"]
        # the test split of the run's own checkpoint: its test (eval_batch_size=1) is the same stream and number
        assert plain["status"] == "ok" and plain["ppl"] == pytest.approx(plain["trained_test_ppl"], rel=1e-5)
        assert plain["tokens"] == 599 and plain["settings"] == {"cache": None, "dynamic": None}
        cache = by[seed, "cache"]["settings"]["cache"]
        assert cache["window"] == 20 and cache["theta"] in THETAS and cache["lam"] in LAMBDAS
        assert sorted(cache["searched"]) == ["lambda", "theta"]
        assert by[seed, "dynamic"]["settings"]["dynamic"]["stat_batches"] == 2
        assert by[seed, "both"]["settings"]["cache"] is not None and by[seed, "both"]["settings"]["dynamic"]
        assert by[seed, "dynamic"]["seconds_per_1k_tokens"] > 0 and by[seed, "plain"]["seconds_per_1k_tokens"] is None
        assert len({by[seed, m]["ppl"] for m in MODES}) == 4  # every mode changes the number
        assert by[seed, "both"]["overrides"] == ["device=cpu", "threads=1", *MODES["both"]]
        assert by[seed, "plain"]["cell"] == {"output": "full"} and by[seed, "plain"]["source"]["key"][-1] == str(seed)

    # resumed: nothing left; a record lost (a kill while it was written) is the one scored again
    assert study_main(args) == 0 and "0 (run, mode) pairs to score" in capsys.readouterr().out
    lines = (root / "extras" / "records.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"output=full,seed=2,mode=cache"' not in line]
    (root / "extras" / "records.jsonl").write_text("\n".join(kept) + "\n")
    assert study_main(args) == 0 and "1 (run, mode) pairs to score" in capsys.readouterr().out
    assert len(read_records(root / "extras" / "records.jsonl")) == 8
    # --cells narrows the folder-less runs reported too, not only the scorings
    assert study_main([*args, "--dry-run", "--cells", "output=f*"]) == 0
    assert "output=full,seed=3: no run folder" in capsys.readouterr().out
    assert study_main([*args, "--cells", "output=rff"]) == 0
    assert "no run folder" not in capsys.readouterr().out

    # the table: each mode's mean ± sd over the two seeds, each gain the mean of the seeds' own gains
    records = read_records(root / "extras" / "records.jsonl")
    by = {(r["seed"], r["mode"]): r for r in records}
    row = table_rows((root / "extras" / "table.md").read_text())["full"]
    assert row["seeds"] == "2" and row["gain vs full's"] == "reference"
    for mode in MODES:
        ppls = [by[s, mode]["ppl"] for s in (1, 2)]
        assert numbers(row[f"{mode} ppl"]) == pytest.approx(mean_sd(ppls), abs=0.051)
    for mode in ("cache", "dynamic", "both"):
        gains = [100 * (by[s, mode]["ppl"] / by[s, "plain"]["ppl"] - 1) for s in (1, 2)]
        assert numbers(row[f"{mode} gain"]) == pytest.approx(mean_sd(gains), abs=0.051)
    assert (root / "extras" / "plot.png").stat().st_size > 0


@pytest.mark.slow
def test_parallel_jobs_give_the_records_one_process_gives(source, tmp_path, capsys):
    """--jobs 2 scores each (run, mode) in a fresh process: every pair recorded once, with the numbers the in-process
    path gives (plain: the run's own test perplexity; the deterministic modes: the same perplexity as --jobs 1)."""
    path, root, runs = source
    declared = {"study": str(path), "cells": "output=*", "modes": MODES, "overrides": ["device=cpu", "threads=1"]}
    by_jobs = {}
    for jobs in (1, 2):
        study = tmp_path / f"extras_jobs{jobs}.yaml"
        study.write_text(yaml.safe_dump({"description": "tiny extras", "scores": declared}, sort_keys=False))
        assert study_main([str(study), "--root", str(root), "--runs", str(runs), "--jobs", str(jobs)]) == 0
        records = read_records(root / study.stem / "records.jsonl")
        assert sorted(r["key"] for r in records) == sorted(
            f"output=full,seed={s},mode={m}" for s in (1, 2) for m in MODES
        )
        by_jobs[jobs] = {r["key"]: r for r in records}
    capsys.readouterr()
    for key, record in by_jobs[2].items():
        assert record["status"] == "ok" and record["ppl"] == pytest.approx(by_jobs[1][key]["ppl"], rel=1e-5)
        if record["mode"] == "plain":
            assert record["ppl"] == pytest.approx(record["trained_test_ppl"], rel=1e-5)


def test_train_missing_retrains_gone_folders_through_a_side_folder_and_checks_them_against_their_records(
    source, tmp_path, capsys
):
    """--train-missing: a run whose folder is gone is trained again with its recorded command (a subprocess, as a
    study trains) and scored; the retrained model is the recorded one (same val and test perplexity), a run whose
    record holds no numbers says so, and nothing is left in the side folder. A training study refuses the flag."""
    import shutil

    path, root, runs = source
    copied = shutil.copytree(runs, tmp_path / "runs")
    records = (root / "src" / "records.jsonl").read_text().replace(str(runs), str(copied))  # run_dir: the copies
    root, runs = shutil.copytree(root, tmp_path / "docs"), copied
    (root / "src" / "records.jsonl").write_text(records)
    spec = load_spec(path)
    gone = training_folder(spec, next(r for r in spec.runs() if r.seed == 1), runs)
    shutil.rmtree(gone)
    died = gone.with_name(f"{gone.name}.retraining")  # an attempt killed before its first checkpoint: kept aside
    died.mkdir()
    (died / "note.txt").write_text("kept")
    study = tmp_path / "extras.yaml"
    declared = {"study": str(path), "cells": "output=*", "modes": {"plain": []}, "overrides": ["device=cpu"]}
    study.write_text(yaml.safe_dump({"description": "tiny extras", "scores": declared}, sort_keys=False))
    assert study_main([str(study), "--root", str(root), "--runs", str(runs), "--train-missing"]) == 0
    out = capsys.readouterr().out
    assert "2 source runs of src to retrain" in out
    assert re.search(r"output=full,seed=1: retrained into \S+; reproduces its record: val ppl [\d.]+ \(recorded", out)
    assert "output=full,seed=3: retrained into" in out and "its record holds no perplexity to compare" in out
    assert (gone / "checkpoints" / "last.ckpt").is_file() and not died.exists()
    assert [p.read_text() for p in gone.parent.glob(f"{died.name}.stale-*/note.txt")] == ["kept"]
    recorded = {r["key"]: r for r in read_records(root / "src" / "records.jsonl")}
    plain = {r["seed"]: r for r in read_records(root / "extras" / "records.jsonl")}
    assert sorted(plain) == [1, 2, 3]  # the retrained runs are scored in the same call
    assert plain[1]["trained_test_ppl"] == pytest.approx(recorded["output=full,seed=1"]["test"]["ppl"], rel=1e-5)
    assert study_main([str(path), "--root", str(root), "--train-missing"]) == 2
    assert "trains its own" in capsys.readouterr().err


def test_a_retrained_run_that_differs_from_its_record_is_named_so():
    from lmtrain.study.retrain import comparison

    assert comparison({"val": 100.0, "test": 90.0}, {"val": 100.001, "test": 90.0}).startswith("reproduces")
    assert comparison({"val": 100.0, "test": 90.0}, {"val": 100.0, "test": 90.5}).startswith("DIFFERS")
    assert comparison({"val": 100.0}, {"test": 90.0}) == "its record holds no perplexity to compare"


def fake(cell: str, seed: int, mode: str, ppl: float | None) -> dict:
    return {
        "key": f"output={cell},seed={seed},mode={mode}",
        "cell": {"output": cell},
        "seed": seed,
        "mode": mode,
        "status": "ok" if ppl is not None else "failed",
        "ppl": ppl,
        "seconds_per_1k_tokens": None if mode == "plain" else 2.0 + seed,
        "device": "cpu",
        "threads": 1,
        "commit": "abc1234",
    }


def test_the_table_is_the_seed_means_and_gains_with_the_rule_against_the_reference(tmp_path):
    """Written-out numbers: the means and sds over seeds, gains per seed averaged (not the ratio of the means), and
    'larger' / 'tied' by twice the pooled sd of the seed gains; rows in the source study's order."""
    source = tmp_path / "src.yaml"
    source.write_text(yaml.safe_dump({"grid": [{"output": ["full", "rff", "nce", "hsm"]}], "seeds": [1, 2, 3]}))
    spec = parse_scores("x", {"scores": {"study": str(source), "modes": {"plain": [], "cache": ["cache=true"]},
                                         "reference": "output=full", "speed": True}})  # fmt: skip
    plain = {"full": [100.0, 200.0, 300.0], "rff": [100.0, 120.0, 140.0], "nce": [50.0, 60.0, 700.0]}
    cache = {"full": [90.0, 180.0, 270.0], "rff": [80.0, 96.0, 112.0], "nce": [45.5, 54.0, 630.0]}
    records = [fake(c, s + 1, "plain", plain[c][s]) for c in plain for s in range(3)]
    records += [fake(c, s + 1, "cache", cache[c][s]) for c in cache for s in range(3)]
    records += [fake("hsm", 1, "plain", 400.0), fake("hsm", 1, "cache", None)]
    rows = table_rows(render_scores_table(spec, list(reversed(records))))
    assert list(rows) == ["full", "rff", "nce", "hsm"]
    for cell in plain:
        assert numbers(rows[cell]["plain ppl"]) == pytest.approx(mean_sd(plain[cell]), abs=0.051)
        gains = [100 * (c / p - 1) for p, c in zip(plain[cell], cache[cell], strict=True)]
        assert numbers(rows[cell]["cache gain"]) == pytest.approx(mean_sd(gains), abs=0.051)
    assert numbers(rows["rff"]["cache s / 1k tokens"]) == pytest.approx([4.0, 1.0]) and rows["rff"]["seeds"] == "3"
    assert rows["rff"]["plain s / 1k tokens"] == "—"
    # full: -10% +- 0 at every seed; rff: -20% +- 0 (larger); nce: -9%, -10%, -10% (within twice the pooled sd)
    assert rows["full"]["gain vs full's"] == "reference"
    assert rows["rff"]["gain vs full's"] == "cache larger" and rows["nce"]["gain vs full's"] == "cache tied"
    assert rows["hsm"]["cache ppl"] == "— (1 failed)" and rows["hsm"]["gain vs full's"] == "cache too few seeds"


def test_a_mode_declared_another_modes_computation_is_not_scored_and_shows_that_modes_numbers(source, tmp_path):
    """``same``: full's training objective is its exact one, so (full, train) has no job and its cells show exact's
    numbers, marked; the other cells' train gains are compared with full's exact gains."""
    from lmtrain.study.scores import pending_jobs

    path, root, runs = source
    modes = {"plain": [], "exact": ["dynamic=true"], "train": ["dynamic=true", "dynamic.objective=train"]}
    same = {"output=full": {"train": "exact"}}
    spec = parse_scores("x", {"scores": {"study": str(path), "modes": modes, "same": same}})
    assert spec.scored_as("output=full", "train") == "exact" and spec.scored_as("output=rff", "train") == "train"
    assert [job.mode for job in pending_jobs(spec, root, runs)] == ["plain", "exact"] * 2  # two seeds with folders
    source_yaml = tmp_path / "src.yaml"
    source_yaml.write_text(yaml.safe_dump({"grid": [{"output": ["full", "rff"]}], "seeds": [1, 2, 3]}))
    spec = parse_scores("x", {"scores": {"study": str(source_yaml), "modes": modes, "same": same,
                                         "reference": "output=full"}})  # fmt: skip
    plain, exact, train = [100.0, 200.0, 300.0], [90.0, 180.0, 270.0], [80.0, 160.0, 240.0]
    records = [fake("full", s + 1, m, v[s]) for m, v in (("plain", plain), ("exact", exact)) for s in range(3)]
    records += [fake("rff", s + 1, m, v[s]) for m, v in (("plain", plain), ("exact", exact), ("train", train))
                for s in range(3)]  # fmt: skip
    rows = table_rows(render_scores_table(spec, records))
    assert rows["full"]["train ppl"] == rows["full"]["exact ppl"] + " (= exact)"
    assert rows["full"]["train gain"] == rows["full"]["exact gain"] and "-10.0" in rows["full"]["train gain"]
    assert rows["rff"]["gain vs full's"] == "exact tied, train larger"  # -20% against full's -10% (as exact)
    with pytest.raises(StudyError, match="must name two different modes"):
        parse_scores("x", {"scores": {"study": "survey", "modes": modes, "same": {"output=full": {"train": "x"}}}})


def test_a_skipped_mode_is_not_scored_and_its_reason_stands_under_the_table(source, tmp_path):
    """``skip``: a skipped (cell, mode) gets no job; its cells read "not run", the other cells keep their numbers and
    the reason is printed under the table; a skip without a reason is refused."""
    from lmtrain.study.scores import pending_jobs

    path, root, runs = source
    modes = {"plain": [], "dynamic": ["dynamic=true"]}
    skip = {"output=full": {"dynamic": "each step recomputes every class vector"}}
    spec = parse_scores("x", {"scores": {"study": str(path), "modes": modes, "skip": skip}})
    assert spec.skipped("output=full", "dynamic") and not spec.skipped("output=rff", "dynamic")
    assert [job.mode for job in pending_jobs(spec, root, runs)] == ["plain"] * 2  # two seeds with folders
    skip = {"output=rff": {"dynamic": "each step recomputes every class vector"}}
    source_yaml = tmp_path / "src.yaml"
    source_yaml.write_text(yaml.safe_dump({"grid": [{"output": ["full", "rff"]}], "seeds": [1, 2]}))
    spec = parse_scores("x", {"scores": {"study": str(source_yaml), "modes": modes, "skip": skip}})
    records = [fake(o, s, m, 100.0 - 10 * (m == "dynamic") + s) for o in ("full", "rff") for s in (1, 2) for m in modes]
    table = render_scores_table(spec, records)
    rows = table_rows(table)
    assert rows["rff"]["dynamic ppl"] == "not run" and rows["rff"]["dynamic gain"] == "—"
    assert rows["full"]["dynamic ppl"].startswith("91.5") and rows["rff"]["plain ppl"].startswith("101.5")
    assert "Not run: rff dynamic: each step recomputes every class vector" in table
    with pytest.raises(StudyError, match="say why"):
        parse_scores("x", {"scores": {"study": "survey", "modes": modes, "skip": {"output=rff": {"dynamic": ""}}}})


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ({"modes": {"plain": []}}, "scores.study names the training study"),
        ({"study": "survey", "modes": {"plain": []}, "cell": "x"}, "unknown key scores.cell"),
        ({"study": "survey", "modes": {"a": ["file=x.txt"]}}, "sets 'file=x.txt'"),
        ({"study": "survey", "modes": {"a": ["cache"]}}, "KEY=VALUE"),
        ({"study": "survey"}, "scores.modes maps"),
    ],
)
def test_bad_declarations_name_the_key(scores, message):
    with pytest.raises(StudyError, match=message):
        parse_scores("bad", {"scores": scores})


def test_the_package_scoring_studies_score_runs_of_their_source_study():
    """extras_ptb, extras_wt2 and extras_rf_ptb parse, each glob names cells of its source study, the reference is one
    of them; and they stay out of the training studies (python -m lmtrain.study list, --check)."""
    from lmtrain.study.spec import package_studies

    names = ("extras_ptb", "extras_wt2", "extras_rf_ptb")
    assert set(names) <= set(package_scores()) and not set(package_scores()) & set(package_studies())
    for name in names:
        spec = load_scores(package_scores()[name])
        assert find_scores(name) == spec
        labels = [cell.label for cell in spec.source_spec().cells]
        assert all(any(fnmatch.fnmatchcase(label, glob) for label in labels) for glob in spec.cells)
        assert spec.reference in labels and spec.matches(spec.reference)
    assert find_scores("survey") is None and find_spec("survey").runs()
