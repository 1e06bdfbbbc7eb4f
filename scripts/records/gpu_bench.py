"""The record of ``scripts/bench_gpu.py`` (``"kind": "bench_gpu"``): its goals checked and its tables rendered.

A record holds one cell per strategy x corpus x precision, each with its tokens/s per round (the median is the
figure), its peak GPU memory and a status (``ok``, ``oom``, ``error``, ``skipped``, with the reason), the
result of the CUDA tests and the device it ran on. ``checks`` states the goals on those cells; ``render_gpu`` is
the markdown table that ``python scripts/render_docs.py`` writes beside the record (and ``--check`` compares).
"""

from __future__ import annotations

import statistics
from typing import Any

from lmtrain.study.render import table_head, table_row

KIND = "bench_gpu"
PLAIN = "plain loop"  # the hand-written PyTorch loop's cells
PLAIN_READ = "plain loop, loss read"  # the same loop reading each step's loss on the host, as lmtrain's step does
# (what is compared, numerator, denominator, goal, the corpora it is about: None for all, else their number of
# classes, so a record of one corpus is held only to that corpus's goals)
GOALS = (
    ("lmtrain full / plain PyTorch loop", "full", PLAIN, 0.9, None),
    ("per-position rff / full", "rff", "full", 0.5, 10**4),
    ("per-position rff / full", "rff", "full", 5.0, 10**6),
)
PRECISION_NAMES = {"32-true": "float32", "bf16-mixed": "bf16-mixed"}


def median(cell: dict[str, Any]) -> float | None:
    """The cell's tokens/s: the median over its rounds (None when it has none)."""
    samples = cell.get("tokens_per_sec") or []
    return statistics.median(samples) if samples else None


def lookup(record: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The cells by (corpus, precision, strategy)."""
    return {(c["corpus"], c["precision"], c["strategy"]): c for c in record["cells"]}


def checks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal at each corpus and precision it is about: the measured ratio and PASS, FAIL or n/a (a cell not
    measured)."""
    cells, corpora, classes = lookup(record), record["settings"]["corpora"], record["settings"]["classes"]
    found = []
    for goal, top, bottom, threshold, size in GOALS:
        for corpus in (c for c in corpora if size is None or classes.get(c) == size):
            for precision in record["settings"]["precisions"]:
                a, b = (median(cells.get((corpus, precision, key), {})) for key in (top, bottom))
                value = a / b if a and b else None
                verdict = "n/a" if value is None else "PASS" if value >= threshold else "FAIL"
                found.append(
                    {"goal": f"{goal} >= {threshold:g}", "corpus": corpus, "precision": precision}
                    | {"value": value, "verdict": verdict}
                )
    return found


def _cell_columns(cell: dict[str, Any] | None, full: float | None, rounds: int) -> list[str]:
    """tokens/s (with its number of rounds when fewer than ``rounds``), x full and peak GiB of one cell, or its
    status and the reason."""
    if cell is None:
        return ["—", "", ""]
    speed = median(cell)
    if cell["status"] != "ok" or speed is None:
        return [f"{cell['status']}: {cell.get('reason') or ''}".strip(": "), "", ""]
    ratio = f"{speed / full:.2f}" if full else "—"
    peak = "—" if cell.get("peak_gib") is None else f"{cell['peak_gib']:.2f}"
    samples = cell["tokens_per_sec"]
    half_range = spread_percent(samples) if len(samples) > 1 else None
    spread = "" if half_range is None else f" ±{half_range:.0f}%" if half_range >= 1 else " ±<1%"
    done = len(samples)
    return [f"{speed:,.0f}{spread}" + (f" ({done} of {rounds} rounds)" if done < rounds else ""), ratio, peak]


def spread_percent(samples: list[float]) -> float:
    """Half the range of a cell's rounds, in percent of their median: how far one round may sit from the figure."""
    return 50 * (max(samples) - min(samples)) / statistics.median(samples)


def render_gpu(name: str, record: dict[str, Any]) -> str:
    """The markdown of a bench_gpu record: settings, the CUDA tests, one table per corpus (rows: strategies;
    columns: tokens/s, x full and peak GiB per precision) and the goals."""
    env, settings, tests = record["environment"], record["settings"], record["tests"]
    cells, precisions = lookup(record), settings["precisions"]
    kind = " **Smoke run (`--quick`): not a measurement.**" if record.get("quick") else ""
    lines = [
        f"<!-- rendered by `python scripts/render_docs.py --bench docs/bench/{name}` from that record: do not edit -->",
        f"GPU benchmark, `scripts/bench_gpu.py` ({name}) on {env['device']} (torch {env['torch']}, CUDA "
        f"{env.get('cuda') or '—'}), commit {record['commit']}: {settings['rounds']} interleaved round(s) of at most "
        f"{settings['steps']} steps ({settings['warmup']} warm-up), each cell at most {settings['cell_seconds']:g} s "
        f"of training, one job at a time on the device; tokens/s is the median of the rounds (± half their range, "
        f"in % of the median, where a cell has several), x full the ratio of the medians to `full` on the same "
        f"corpus and precision, peak GiB torch's peak allocated GPU memory.{kind}",
        "",
        f"CUDA tests (`{' '.join(tests.get('command') or ['not run'])}`): " + tests_line(tests),
        "",
    ]
    read = any(c["strategy"] == PLAIN_READ for c in record["cells"])  # records before it lack the cell
    strategies = [*settings["strategies"], PLAIN, *([PLAIN_READ] if read else [])]
    for corpus in settings["corpora"]:
        classes = settings.get("classes", {}).get(corpus)
        title = f"{corpus} ({classes:,} types)" if classes else corpus
        head = [f"{title}: strategy"]
        for precision in precisions:
            shown = PRECISION_NAMES.get(precision, precision)
            head += [f"{shown} tokens/s", "x full", "peak GiB"]
        lines += table_head(head)
        for strategy in strategies:
            row = [strategy]
            for precision in precisions:
                full = median(cells.get((corpus, precision, "full"), {"tokens_per_sec": []}))
                row += _cell_columns(cells.get((corpus, precision, strategy)), full, settings["rounds"])
            lines.append(table_row(row))
        lines.append("")
    lines += ["Goals:", ""]
    for check in checks(record):  # from the cells, by today's goals (a record's own "checks" are as it was written)
        value = "not measured" if check["value"] is None else f"{check['value']:.2f}"
        shown = PRECISION_NAMES.get(check["precision"], check["precision"])
        lines.append(f"- {check['verdict']}: {check['goal']} on {check['corpus']}, {shown}: {value}")
    lines.append("")
    return "\n".join(lines)


def tests_line(tests: dict[str, Any]) -> str:
    """The CUDA tests' counts in words."""
    if tests.get("status") != "ran":
        return f"{tests.get('status', 'not run')}" + (f" ({tests['reason']})" if tests.get("reason") else "")
    counts = ", ".join(f"{tests.get(k, 0)} {k}" for k in ("passed", "failed", "errors", "skipped"))
    return f"{counts} in {tests.get('seconds', 0):.0f} s"
