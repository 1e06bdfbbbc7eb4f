"""Studies as code: declarations, the comparison rule, rendering from records alone, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmtrain.study.__main__ import main as study_main
from lmtrain.study.records import append_record, read_records
from lmtrain.study.render import check, render, render_table
from lmtrain.study.runner import outcome, pending_runs, run_study
from lmtrain.study.spec import StudyError, find_spec, load_spec, package_studies, parse_spec
from lmtrain.study.stats import CellStats, verdict

SPEC = {
    "description": "two strategies",
    "overrides": ["data=synthetic"],
    "grid": [{"output": ["full", "unigram"]}, {"output": ["unigram"], "output.num_samples": [10, 30]}],
    "seeds": [1, 2, 3],
    "reference": "output=full",
}


def fake_record(spec_name: str, key: str, test_ppl: float | None, status: str = "ok") -> dict:
    cell = dict(part.split("=", 1) for part in key.split(",")[:-1])
    return {
        "study": spec_name,
        "key": key,
        "cell": cell,
        "seed": int(key.rsplit("=", 1)[1]),
        "status": status,
        "test": None if test_ppl is None else {"ppl": test_ppl, "loss": 0.0},
        "best_val_ppl": None if test_ppl is None else test_ppl + 1,
        "device": "cpu",
        "threads": 1,
        "commit": "abc1234def",
        "dirty": False,
    }


def test_grid_blocks_are_cartesian_products_joined_without_duplicates():
    spec = parse_spec("s", SPEC)
    assert [c.label for c in spec.cells] == [
        "output=full",
        "output=unigram",
        "output=unigram,output.num_samples=10",
        "output=unigram,output.num_samples=30",
    ]
    assert len(spec.runs()) == 12 and spec.runs()[1].key == "output=full,seed=2"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grdi": []}, "unknown key 'grdi'"),
        ({"metric": "val/loss"}, "metric must be one of"),
        ({"reference": "output=hsm"}, "not a cell of the grid"),
        ({"grid": [{"output": []}]}, "non-empty lists"),
        ({"seeds": ["a"]}, "list of integers"),
    ],
)
def test_a_malformed_declaration_names_the_study_and_the_key(change, message):
    with pytest.raises(StudyError, match=message):
        parse_spec("mine", {**SPEC, **change})


def test_every_package_study_parses_and_an_unknown_one_is_a_clear_error():
    assert {"ptb_m100", "m_grid", "negatives", "bias_init"} <= set(package_studies())
    for path in package_studies().values():
        assert load_spec(path).runs()
    with pytest.raises(StudyError, match="unknown study 'nope'"):
        find_spec("nope")


def test_beats_only_beyond_twice_the_pooled_sd():
    a = CellStats("a", (100.0, 102.0, 104.0))  # sd 2
    assert verdict(a, CellStats("b", (103.0, 105.0, 107.0))) == "tied"  # 3 apart < 2 * 2
    assert verdict(a, CellStats("b", (106.0, 108.0, 110.0))) == "beats"  # 6 apart > 4
    assert verdict(CellStats("b", (106.0, 108.0, 110.0)), a) == "behind"
    assert verdict(CellStats("one", (90.0,)), a) == ""  # one seed: no spread, no verdict
    assert verdict(CellStats("two", (50.0, 51.0)), a) == ""  # two seeds: still no verdict (the rule is >= 3)


def test_table_is_mean_and_sd_over_seeds_with_failed_runs_counted_apart(tmp_path):
    spec = parse_spec("s", SPEC)
    records = [fake_record("s", f"output=full,seed={s}", v) for s, v in zip((1, 2, 3), (100, 102, 104), strict=True)]
    records += [fake_record("s", f"output=unigram,seed={s}", v) for s, v in ((1, 120.0), (2, 122.0))]
    records += [fake_record("s", "output=unigram,seed=3", None, status="failed")]
    records += [fake_record("s", "output=full,seed=9", 1.0)]  # a seed the study does not declare: left out
    table = render_table(spec, records)
    assert "| full |  | 3 | 102.0 ± 2.0 | 103.0 ± 2.0 | reference |" in table
    assert "| unigram |  | 2 (1 failed) | 121.0 ± 1.4 | 122.0 ± 1.4 | +18.6% |" in table  # 2 seeds: no verdict
    assert "| unigram | 10 | 0 | — | — | — |" in table


def test_render_and_check_use_the_records_alone(tmp_path):
    spec = parse_spec("s", SPEC)
    for s, v in ((1, 100.0), (2, 101.0)):
        append_record(tmp_path / "s" / "records.jsonl", fake_record("s", f"output=full,seed={s}", v))
    table, plot = render(spec, tmp_path)
    assert plot.stat().st_size > 0 and check(spec, tmp_path) is None
    table.write_text(table.read_text().replace("100.5", "99.0"))  # a hand-edited number
    assert "differs from its rendering" in check(spec, tmp_path)


def test_a_truncated_last_record_is_ignored_and_its_run_stays_pending(tmp_path):
    spec = parse_spec("s", SPEC)
    path = tmp_path / "s" / "records.jsonl"
    append_record(path, fake_record("s", "output=full,seed=1", 100.0))
    with open(path, "a") as f:
        f.write('{"key": "output=full,seed=2", "te')  # killed while writing
    assert [r["key"] for r in read_records(path)] == ["output=full,seed=1"]
    assert [r.key for r in pending_runs(spec, tmp_path, cells="output=full")] == [
        "output=full,seed=2",
        "output=full,seed=3",
    ]


def test_a_user_study_runs_records_every_validation_and_resumes(tmp_path, monkeypatch):
    """End to end through `python -m lmtrain`: one run of a user's YAML; a second call finds nothing to do."""
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "mine.yaml"
    study.write_text(
        "description: tiny\n"
        "overrides: [data=synthetic, data.train_tokens=20000, trainer.max_steps=4, trainer.val_check_interval=2,"
        " trainer.limit_val_batches=2, trainer.limit_test_batches=2]\n"
        "grid:\n  - output: [full]\nseeds: [7]\n"
    )
    assert study_main([str(study), "--root", "docs"]) == 0
    (record,) = read_records(tmp_path / "docs" / "mine" / "records.jsonl")
    assert record["status"] == "ok" and record["seed"] == 7 and record["config"]["seed"] == 7
    assert [v["step"] for v in record["validations"]] == [1, 3]
    assert record["test"]["ppl"] > 1 and record["tokens_per_sec"] > 0 and record["threads"] >= 1
    assert json.loads(json.dumps(record))["config"]["output"]["_target_"].endswith("FullSoftmax")
    assert run_study(load_spec(study), Path("docs"), Path("runs/study")) == 0  # resumed: nothing left to run
    assert (tmp_path / "docs" / "mine" / "table.md").is_file()


def test_a_run_another_study_measured_on_the_same_device_kind_reuses_its_record(tmp_path, monkeypatch):
    """Same resolved config (paths and study name aside), same device kind: a copy naming its origin, no training.
    Another value, another device, or an older record lacking an option set away from its default: trained. An
    older record's dropped key (``execution: null``) is left out."""
    import lmtrain.study.runner as runner
    from lmtrain.study.records import device_name
    from lmtrain.study.reuse import resolved_config

    measured = parse_spec("a", {"overrides": ["data=synthetic"], "grid": [{"output": ["full"]}], "seeds": [1]})
    (run,) = measured.runs()
    config = resolved_config(runner.run_overrides(measured, run))
    config.update(run_dir="/elsewhere/runs/study/a/output-full__seed-1", data={**config["data"], "root": "/x"})
    del config["trainer"]["num_nodes"]  # an option the older record predates, at its default today
    del config["step_forms"]  # another
    config["execution"] = None  # a key dropped since, at the value under which it trained as today's code does
    here = device_name(config)  # this machine's device kind
    record = {**fake_record("a", run.key, 99.5), "config": config, "device": here}
    append_record(tmp_path / "a" / "records.jsonl", record)
    wanted = parse_spec(
        "b",
        {
            "overrides": ["data=synthetic"],
            "grid": [{"output": ["full"], "output.bias_init": ["zero", "log_unigram"]}, {"output": ["unigram"]}],
            "seeds": [1],
        },
    )
    trained = []
    monkeypatch.setattr(runner, "execute", lambda spec, run, *args: trained.append(run.key) or run.key)
    assert runner.run_study(wanted, tmp_path, tmp_path / "runs") == 2  # log_unigram and unigram, not zero
    assert trained == ["output=full,output.bias_init=log_unigram,seed=1", "output=unigram,seed=1"]
    (copy,) = read_records(tmp_path / "b" / "records.jsonl")
    assert copy["key"] == "output=full,output.bias_init=zero,seed=1" and copy["study"] == "b"
    assert copy["reused_from"] == {"study": "a", "key": "output=full,seed=1"} and copy["test"]["ppl"] == 99.5
    assert "| full | zero | 1 | 99.5 |" in render_table(wanted, read_records(tmp_path / "b" / "records.jsonl"))
    same = parse_spec("c", {"overrides": ["data=synthetic"], "grid": [{"output": ["full"]}], "seeds": [1]})
    assert runner.reusable(same, same.runs(), tmp_path, lambda r: runner.run_overrides(same, r))
    gpu = runner.reusable(same, same.runs(), tmp_path, lambda r: runner.run_overrides(same, r), "NVIDIA H100")
    assert gpu == {}  # measured on another device kind
    steps = parse_spec("d", {"overrides": ["data=synthetic", "trainer.num_nodes=2"], "grid": [{"output": ["full"]}]})
    assert runner.reusable(steps, steps.runs()[:1], tmp_path, lambda r: runner.run_overrides(steps, r)) == {}


def test_a_run_without_a_test_shows_its_val_ppl_not_a_failure():
    # runs at equal training time have no test: their summary line used to read "failed: None"
    assert outcome({"test": {"ppl": 101.234}, "best_val_ppl": 99.0}, None) == "test ppl 101.23"
    assert outcome({"test": None, "best_val_ppl": 539.154}, None) == "best val ppl 539.15"
    assert outcome({"best_val_ppl": 12.0}, "lmtrain: error: training loss became nan") == (
        "failed: lmtrain: error: training loss became nan"
    )
