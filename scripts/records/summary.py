"""The answer table that opens docs/results.md, rendered like every other table: from the studies' records and one
side-by-side benchmark record, never typed.

One row per output strategy (the cells of ``ptb_m100``); each quality column is one study's cell of that strategy,
compared with the full softmax's cell of the same start and recipe (a column may take cells from two studies) by the
rule of ``lmtrain.study.stats``; the speed column is the benchmark's tokens/s ratio to the full softmax, measured
in the same run at the studies' batch shape (20 x 20). The block ``<!-- summary:answer -->`` of a page holds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmtrain.study.records import read_records, speed_tables
from lmtrain.study.render import cell_stats, table_head, table_row
from lmtrain.study.spec import find_spec
from lmtrain.study.stats import CellStats, relative, verdict


@dataclass(frozen=True)
class Column:
    """One quality column: the cells that may stand for strategy S (``{s}`` stands for S), tried in order; a cell
    counts only where its runs started their output biases at ``start`` (a strategy without biases: at zero)."""

    header: str
    start: str
    sources: tuple[tuple[str, str], ...]  # (study, cell label)


COLUMNS = (
    Column(
        "biases at zero (`bias_init`, `ptb_m100`)",
        "zero",
        (("bias_init", "output={s},output.bias_init=zero"), ("ptb_m100", "output={s}")),
    ),
    Column(
        "biases at zero, CPU float32 (`precision`)", "zero", (("precision", "output={s},trainer.precision=32-true"),)
    ),
    Column(
        "biases at log unigram (`bias_init`)",
        "log_unigram",
        (("bias_init", "output={s},output.bias_init=log_unigram"),),
    ),
)
ROWS_FROM = "ptb_m100"  # the strategies, in the order of this study's cells
SPEED = "precision_cpu.json"  # docs/bench/: every strategy side by side at batch 20 x 20, one thread


def _start(records: list[dict[str, Any]]) -> str | None:
    """The output-bias start of a cell's runs ('zero' where the strategy has no such option), None if they differ."""
    starts = {((r.get("config") or {}).get("output") or {}).get("bias_init", "zero") for r in records}
    return starts.pop() if len(starts) == 1 else None


def _pick(
    column: Column, s: str, studies: dict[str, tuple[dict[str, CellStats], list[dict[str, Any]]]]
) -> CellStats | None:
    """The first cell of the column's sources that holds runs of strategy ``s`` from the column's start."""
    for study, template in column.sources:
        stats, records = studies[study]
        label = template.format(s=s)
        mine = [r for r in records if r.get("key", "").rsplit(",seed=", 1)[0] == label]
        if label in stats and stats[label].n and _start(mine) == column.start:
            return stats[label]
    return None


def _cell(s: CellStats | None, full: CellStats | None) -> str:
    """'274.4 ± 3.2 (+3.2%, tied)': the mean ± sd over seeds and how it compares with the full softmax's cell."""
    if s is None or s.n == 0:
        return "—"
    shown = f"{s.mean:,.1f} ± {s.sd:,.1f}" if s.n >= 2 else f"{s.mean:,.1f} (1 seed)"
    if full is None or full.n == 0 or s is full:
        return shown + (" (reference)" if s is full else "")
    word = verdict(s, full)
    return f"{shown} ({relative(s, full):+.1f}%{', ' + word if word else ''})"


def render_summary(root: Path) -> str:
    """The markdown of the answer table (root: docs/study; the benchmark record is in root's sibling bench/)."""
    strategies = [cell.get("output") or "" for cell in find_spec(ROWS_FROM).cells]
    names = {study for column in COLUMNS for study, _ in column.sources}
    studies = {}
    for name in sorted(names):
        records = read_records(root / name / "records.jsonl")
        studies[name] = (cell_stats(find_spec(name), records, "test/ppl"), records)
    speed_file = root.parent / "bench" / SPEED
    speed = speed_tables(json.loads(speed_file.read_text()))["ptb"]["ratio_to_full"] if speed_file.is_file() else {}
    header = ["output", *(c.header for c in COLUMNS), "tokens/s x full, 20 x 20, CPU (`precision_cpu`)"]
    lines = table_head(header)
    for s in strategies:
        row = [s]
        for column in COLUMNS:
            row.append(_cell(_pick(column, s, studies), _pick(column, "full", studies)))
        row.append(f"{speed[s]:.2f}" if s in speed else "—")
        lines.append(table_row(row))
    lines += [
        "",
        "Test perplexity after 1,000 PTB steps, mean ± sd over 3 seeds; in brackets: against the full softmax's cell"
        " of the same column (the same start), 'tied' unless the means differ by more than twice the pooled"
        " sd. Each column holds only runs that started their output biases as its header says (nce and negative"
        " start at the log unigram by default). '—': no such runs (rff has no output biases, hsm and adaptive no"
        " `bias_init` option, quadratic's log-unigram start is advised against and not measured). exp's runs ran"
        " on the CPU, the other runs of the first and third columns on an H100.",
    ]
    return "\n".join(lines) + "\n"
