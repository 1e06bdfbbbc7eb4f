"""The survey table of a study (``survey:`` in its YAML, ``survey.md`` beside its table): one row per approach, the
survey's own ratings beside what lmtrain measured, and whether each rating held.

The declaration::

    survey:
      train: {ptb: docs/bench/survey_train_ptb.json, ...}   # scripts/bench_train.py records, by corpus
      test: {ptb: docs/bench/survey_score_ptb.json, ...}    # scripts/bench_scoring.py records, by corpus
      rows:
        - {approach: softmax, cell: output=full, bench: full, rating: [1x, "-", very good, very poor, 100%]}

``cell`` is a grid cell without the study's ``within`` key (the corpus), ``bench`` the label of the approach in the
speed records, ``rating`` the survey's five ratings: training speed-up, test speed-up, quality at a small and at a
large vocabulary, share of parameters (a row without one is lmtrain's own). Quality is the study's metric against
its reference on the same corpus by the project's rule (``lmtrain.study.stats``); a rating of "good" or better
holds when the approach is tied with or beats the reference, "bad" or worse when it is behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmtrain.study.records import speed_tables
from lmtrain.study.render import cell_stats, table_head, table_row
from lmtrain.study.spec import Cell, StudySpec
from lmtrain.study.stats import CellStats, verdict

RATING_COLUMNS = ("training", "test", "small vocabulary", "large vocabulary", "parameters")
GOOD, BAD = ("good", "very good"), ("bad", "very bad", "poor", "very poor")
SMALL, LARGE = "ptb", "wikitext2"  # the corpora of the quality columns


def _bench(path: str | None, root: Path) -> dict[str, Any] | None:
    """A speed record's table for its one corpus (``corpora``' only entry, or the record itself), None if absent."""
    if path is None or not (root / path).is_file():
        return None
    return next(iter(speed_tables(json.loads((root / path).read_text())).values()))


def _ratio(table: dict[str, Any] | None, label: str, key: str = "ratio_to_full") -> str:
    value = None if table is None else table.get(key, {}).get(label)
    return "–" if value is None else f"{value:.2f}x"


def _rated(measured: str, rating: str) -> str:
    """A measured cell with the survey's rating beside it (none for lmtrain's own rows)."""
    return f"{measured} [{rating}]" if rating else measured


def _paths(survey: dict[str, Any]) -> list[str]:
    return [*(survey.get("train") or {}).values(), *(survey.get("test") or {}).values()]


def _cell(spec: StudySpec, row: dict[str, Any], corpus: str) -> Cell | None:
    wanted = dict(pair.split("=", 1) for pair in str(row["cell"]).split(","))
    wanted[spec.within or "data"] = corpus
    return next((c for c in spec.cells if {k.lstrip("+"): v for k, v in c.values} == wanted), None)


def _quality(stats: dict[str, CellStats], spec: StudySpec, cell: Cell | None) -> tuple[str, str]:
    """The cell's metric (mean ± sd) and its verdict against the reference on the same corpus."""
    if cell is None or not stats[cell.label].n:
        return "–", ""
    s = stats[cell.label]
    shown = f"{s.mean:,.1f} ± {s.sd:,.1f}" if s.n >= 2 else f"{s.mean:,.1f} (1 seed)"
    reference = spec.reference_of(cell)
    if reference is None or reference == cell:
        return shown, "reference"
    return shown, verdict(s, stats[reference.label]) or "too few seeds"


def _held(rating: str, measured: str) -> str:
    """Whether a quality rating held: good or better against tied / beats, bad or worse against behind."""
    if rating in ("", "-") or measured in ("", "too few seeds", "reference"):
        return ""
    good = any(rating.endswith(word) for word in GOOD) and not any(rating.endswith(word) for word in BAD)
    if " - " in rating:  # a range ("bad - good"): any verdict is inside it
        return "held"
    return "held" if (measured in ("tied", "beats")) == good else "did not hold"


def _unjudged(row: dict[str, Any], rating: list[str], small: str, large: str) -> str:
    """The last column where no rating was judged: the reference's ratings (each cell compared with itself), a row
    the survey does not rate, a row whose quality it does not rate, or a rating whose cells lack seeds."""
    if small == large == "reference":
        return "reference (its ratings are not checked against itself)"
    if not row.get("rating"):
        return "not rated"
    return "no quality rating" if all(r in ("", "-") for r in rating[2:4]) else "no verdict yet"


def render_survey(spec: StudySpec, records: list[dict[str, Any]], root: Path = Path(".")) -> str:
    """The markdown of the survey table from the study's records and the speed records it names."""
    survey = spec.survey or {}
    stats = cell_stats(spec, records, spec.metric)
    train = {corpus: _bench(path, root) for corpus, path in (survey.get("train") or {}).items()}
    test = {corpus: _bench(path, root) for corpus, path in (survey.get("test") or {}).items()}
    corpora_train, corpora_test = " / ".join(train), " / ".join(test)
    header = ["approach", f"training x full ({corpora_train})", f"test x full ({corpora_test})"]
    header += [f"test ppl, {SMALL}", f"test ppl, {LARGE}", "parameters x full", "survey's rating held?"]
    commands = [f"`{json.loads((root / p).read_text())['command']}`" for p in _paths(survey) if (root / p).is_file()]
    lines = [
        f"<!-- rendered by `python -m lmtrain.study {spec.name} --render` from records.jsonl and the speed records:"
        " do not edit -->",
        f"**{spec.name}**, the survey's table measured: {spec.description}. Speeds are side by side in one process,"
        " one thread, each approach against `full` on the same corpus; test speed is the output layer's scoring of"
        " the same hidden states (its cheapest honest form); parameters are the output layer's. The survey's own"
        " rating follows each measured cell in brackets; – is not measured yet.",
        "",
        *table_head(header),
    ]
    params = next((t for t in test.values() if t is not None), None)
    for row in survey.get("rows", []):
        label = str(row["bench"])
        rating = [str(r) for r in row.get("rating") or []] or [""] * len(RATING_COLUMNS)
        small = _quality(stats, spec, _cell(spec, row, SMALL))
        large = _quality(stats, spec, _cell(spec, row, LARGE))
        held = [
            f"{size}: {h}"
            for size, h in (("small", _held(rating[2], small[1])), ("large", _held(rating[3], large[1])))
            if h
        ]
        cells = [
            str(row["approach"]),
            _rated(" / ".join(_ratio(table, label) for table in train.values()), rating[0]),
            _rated(" / ".join(_ratio(table, label) for table in test.values()), rating[1]),
            _rated(f"{small[0]}, {small[1]}".strip(", "), rating[2]),
            _rated(f"{large[0]}, {large[1]}".strip(", "), rating[3]),
            _rated(_ratio(params, label, "parameters_to_full"), rating[4]),
            "; ".join(held) or _unjudged(row, rating, small[1], large[1]),
        ]
        lines.append(table_row(cells))
    lines += ["", "Quality verdicts by the project's rule: 'beats' / 'behind' when the means differ by more than twice"]
    lines += [
        "the pooled sd of 3 seeds, else 'tied'. Commands of the speed records: " + (", ".join(commands) or "none")
    ]
    return "\n".join(lines) + "\n"
