"""The survey table: a reference per corpus (``within``), the rendered table from records and speed records, the
survey ratings' verdicts, and the scoring benchmark that feeds its test-time column."""

from __future__ import annotations

import json

import pytest
import torch
from bench_train import labelled

from lmtrain.study.render import check, render
from lmtrain.study.spec import StudyError, find_spec, parse_spec
from lmtrain.study.survey import render_survey
from tests.test_study import fake_record

GRID = {
    "description": "two corpora",
    "grid": [{"data": ["ptb", "wikitext2"], "output": ["full", "hsm", "nce"]}],
    "seeds": [1, 2, 3],
    "reference": "output=full",
    "within": "data",
}
ROWS = [
    {"approach": "softmax", "cell": "output=full", "bench": "full", "rating": ["1x", "-", "very good", "poor", "100%"]},
    {"approach": "hsm", "cell": "output=hsm", "bench": "hsm", "rating": ["25x", "-", "very poor", "very good", "100%"]},
    {"approach": "nce", "cell": "output=nce", "bench": "nce", "rating": ["8x", "-", "very bad", "bad - good", "100%"]},
]
PPL = {  # (corpus, output) -> three seeds
    ("ptb", "full"): [100.0, 101.0, 102.0],
    ("ptb", "hsm"): [130.0, 131.0, 132.0],  # behind full: "very poor" held
    ("ptb", "nce"): [100.5, 101.5, 99.5],  # tied with full: "very bad" did not hold
    ("wikitext2", "full"): [200.0, 201.0, 202.0],
    ("wikitext2", "hsm"): [250.0, 251.0, 252.0],  # behind: "very good" did not hold (a wrong per-corpus
    # reference, ptb's full, would make it "beats" nothing: 250 > 101, still behind, so the nce row checks that)
    ("wikitext2", "nce"): [201.0, 200.0, 202.0],  # tied with wikitext2's full; behind ptb's: a range holds anyway
}


def test_the_reference_is_taken_within_each_corpus():
    spec = parse_spec("s", GRID)
    for cell in spec.cells:
        assert spec.reference_of(cell).label == f"data={cell.get('data')},output=full"
    with pytest.raises(StudyError, match="within"):
        parse_spec("s", {**GRID, "reference": None})
    with pytest.raises(StudyError, match="reference"):
        parse_spec("s", {**GRID, "reference": "output=adaptive"})


def write_records(tmp_path, spec) -> list[dict]:
    records = [
        fake_record("s", f"data={data},output={out},seed={i + 1}", value)
        for (data, out), values in PPL.items()
        for i, value in enumerate(values)
    ]
    folder = tmp_path / "docs" / "study" / "s"
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_the_survey_table_reads_records_and_speed_records_and_says_which_ratings_held(tmp_path):
    bench = tmp_path / "docs" / "bench"
    bench.mkdir(parents=True)
    train = {"command": "python scripts/bench_train.py --data ptb", "corpora": {"ptb": {"ratio_to_full": {"hsm": 2.5}}}}
    (bench / "train.json").write_text(json.dumps(train))
    score = {"command": "python scripts/bench_scoring.py", "corpora": {"ptb": {"ratio_to_full": {"hsm": 0.8}}}}
    score["corpora"]["ptb"]["parameters_to_full"] = {"full": 1.0, "hsm": 0.99}
    (bench / "score.json").write_text(json.dumps(score))
    survey = {"train": {"ptb": "docs/bench/train.json", "wikitext2": "docs/bench/absent.json"}}
    survey |= {"test": {"ptb": "docs/bench/score.json"}, "rows": ROWS}
    spec = parse_spec("s", {**GRID, "survey": survey})
    records = write_records(tmp_path, spec)
    table = render_survey(spec, records, tmp_path)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "2.50x / – [25x]" in rows["hsm"] and "0.80x [-]" in rows["hsm"] and "0.99x [100%]" in rows["hsm"]
    assert "131.0 ± 1.0, behind [very poor]" in rows["hsm"] and "small: held; large: did not hold" in rows["hsm"]
    assert "tied [very bad]" in rows["nce"] and "small: did not hold; large: held" in rows["nce"]
    assert "101.0 ± 1.0, reference" in rows["softmax"] and rows["softmax"].endswith("not checked against itself) |")
    assert "`python scripts/bench_train.py --data ptb`" in table
    # rendered beside the study's table and checked like it
    render(spec, tmp_path / "docs" / "study")
    assert check(spec, tmp_path / "docs" / "study") is None
    (tmp_path / "docs" / "study" / "s" / "survey.md").write_text("stale\n")
    assert "survey.md" in check(spec, tmp_path / "docs" / "study")


def test_a_row_without_a_quality_rating_or_without_seeds_says_which(tmp_path):
    """The last column tells a row the survey rates only for speed from a rated row whose cells lack seeds."""
    rows = [ROWS[0], ROWS[1], {**ROWS[2], "rating": ["8x", "-", "-", "-", "100%"]}]
    spec = parse_spec("s", {**GRID, "survey": {"rows": rows}})
    records = [r for r in write_records(tmp_path, spec) if not r["key"].startswith("data=wikitext2,output=hsm,seed=3")]
    table = render_survey(spec, records, tmp_path)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert lines["nce"].endswith("| no quality rating |")  # measured, tied, but the survey rates no quality
    assert "too few seeds [very good]" in lines["hsm"] and lines["hsm"].endswith("| small: held |")
    rows[1] = {**ROWS[1], "rating": ["25x", "-", "-", "very good", "100%"]}  # only the seedless cell is rated
    table = render_survey(parse_spec("s", {**GRID, "survey": {"rows": rows}}), records, tmp_path)
    assert "| hsm |" in table and table.split("| hsm |")[1].splitlines()[0].endswith("| no verdict yet |")


def test_the_package_survey_names_a_cell_of_its_grid_for_every_row():
    spec = find_spec("survey")
    labels = {",".join(p for p in c.label.split(",") if not p.startswith("data=")) for c in spec.cells}
    assert all(row["cell"] in labels for row in spec.survey["rows"])
    assert sum(1 for row in spec.survey["rows"] if row.get("rating")) == 11  # the survey's eleven approaches


def test_a_bench_entry_may_carry_a_label():
    assert labelled("full") == ("full", "full")
    entry = "uniform:++output.shared_negatives=false"  # no label: the whole entry names its cell, as before
    assert labelled(entry) == (entry, entry)
    assert labelled("target=sampled:sampler=target") == ("target", "sampled:sampler=target")


def test_the_scoring_bench_times_every_layer_and_counts_its_parameters(tmp_path, monkeypatch):
    import bench_scoring

    out = tmp_path / "score.json"
    small = ["model.emb_dim=16", "model.hidden_dim=16", "data.train_tokens=5000", "data.test_tokens=600"]
    argv = ["--data", "synthetic:50", "--experiment", "none", "--outputs", "full,hsm,u=uniform", "--positions", "300"]
    argv += ["--rounds", "1", "--min-seconds", "0", "--threads", "1", "--json", str(out)]
    record = bench_scoring.main([*argv, *(f"--override={o}" for o in small)])
    table = record["corpora"]["synthetic:50"]
    assert set(table["positions_per_sec"]) == {"full", "hsm", "u"} and table["positions"] == 300
    assert table["ratio_to_full"]["full"] == 1.0 and table["parameters"]["full"] == 50 * 16 + 50
    assert table["parameters"]["u"] == table["parameters"]["full"]  # uniform samples: the same class matrix
    assert json.loads(out.read_text()) == record
    assert table["evaluations"]["full"] == [1]  # --min-seconds 0 below: one evaluation per round


def test_a_scoring_round_repeats_whole_evaluations_until_it_lasts_its_minimum():
    """A layer that scores in no time is evaluated again and again (each time switched to evaluation afresh) until
    the round's minimum, and its rate counts every evaluation's positions."""
    import bench_scoring

    class Instant(torch.nn.Module):
        calls, evaluations = 0, 0

        def eval(self):
            self.evaluations += 1
            return super().eval()

        def log_prob(self, hidden, target):
            self.calls += 1
            return torch.zeros(hidden.shape[0])

    layer, hidden, targets = Instant(), torch.zeros(10, 2), torch.zeros(10, dtype=torch.long)
    rate, evaluations = bench_scoring.score_round(layer, hidden, targets, 4, False, min_seconds=0.02)
    assert evaluations > 1 and layer.evaluations == evaluations and layer.calls == 3 * evaluations  # windows 4, 4, 2
    assert rate >= 10 * evaluations / (2 * 0.02)  # every evaluation's positions over about min_seconds, not one's
