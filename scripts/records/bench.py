"""A throughput benchmark's record (``scripts/bench_train.py --json``) rendered as a table: tokens/s per strategy,
the median of interleaved rounds, and the ratio to the full softmax measured in the same run. A GPU benchmark's
record (``scripts/bench_gpu.py``) has its own layout (``records.gpu_bench``); the counts of
``scripts/bench_launches.py`` and ``scripts/bench_traffic.py`` (measured by ``scripts/lab/``) and the passes of
``scripts/bench_dynamic.py`` are rendered here too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmtrain.study.records import speed_tables
from lmtrain.study.render import table_head, table_row
from records.gpu_bench import KIND, render_gpu


def render_bench(path: Path) -> str:
    """The markdown table of one bench_train JSON record (every corpus it measured), or of a bench_gpu record."""
    record = json.loads(path.read_text())
    if "budgets" in record and "rows" in record:  # a scripts/bench_launches.py record
        return launches_table(record)
    if record.get("kind") == KIND:
        return render_gpu(path.name, record)
    if record.get("kind") == "bench_traffic":  # a scripts/bench_traffic.py record
        return traffic_table(record)
    if record.get("kind") == "bench_dynamic":  # a scripts/bench_dynamic.py record
        return dynamic_table(record)
    isolated = ", each cell in its own process" if "child" in str(record.get("peak_memory", "")) else ""
    lines = [
        f"<!-- rendered by `python scripts/render_docs.py --bench docs/bench/{path.name}` from that record:"
        " do not edit -->",
        f"Training throughput, `scripts/bench_train.py` ({path.name}): {record['rounds']} interleaved rounds of "
        f"{record['steps']} steps, {record['threads']} thread(s), device {record['device'] or 'auto'}, experiment "
        f"`{record['experiment']}`{isolated}; median of the rounds.",
        "",
    ]
    for corpus, data in speed_tables(record).items():
        lines += table_head([f"{corpus}: output", "tokens/s (median)", "rounds", "x full (same run)"])
        for name, speed in data["tokens_per_sec"].items():
            ratio = data["ratio_to_full"].get(name)
            shown = "—" if ratio is None else f"{ratio:.2f}"
            lines.append(table_row([name, f"{speed:,.0f}", str(len(data["samples"][name])), shown]))
        lines.append("")
    return "\n".join(lines)


def write_bench(path: Path) -> Path:
    """Write the table beside the record (NAME.json -> NAME.md)."""
    out = path.with_suffix(".md")
    out.write_text(render_bench(path))
    return out


def launches_table(record: dict[str, Any]) -> str:
    """A ``scripts/bench_launches.py`` record as markdown: per strategy and size, operators / syncs on the CPU and
    the GPU paths."""
    rows = record["rows"]
    cells = {(r["output"], r["n"], r["execution"]): _launches_cell(r) for r in rows}
    sizes = sorted({r["n"] for r in rows})
    outputs = list(dict.fromkeys(r["output"] for r in rows))
    head = ["output", *(f"n = {n:,} {path}" for n in sizes for path in ("cpu", "gpu"))]
    lines = [
        f"<!-- written by `{record['command']}`: do not edit -->",
        "Operators that launch work / host syncs of one `train_step` (default model, batch 20 x 35, m = 100), "
        "in a CPU's step forms (`step_forms=cpu`: the kernel tree's walk, torch's adaptive module) and a GPU's "
        "(`step_forms=gpu`: the fixed backend, adaptive's fixed shapes; counted on the CPU); in brackets the "
        "operators of the sampler's draw alone, part of the step's.",
        "",
        *table_head(head),
    ]
    for output in outputs:
        values = [cells.get((output, n, path), "") for n in sizes for path in ("cpu", "gpu")]
        lines.append(table_row([output, *values]))
    return "\n".join([*lines, "", *(f"- {line}" for line in record["budgets"])]) + "\n"


def _launches_cell(row: dict[str, Any]) -> str:
    """A row of the record as its table cell: operators / syncs, and (draw k) where the draw was counted."""
    draw = row.get("draw_launches")
    return f"{row['launches']:,} / {row['syncs']}" + (f" (draw {draw})" if draw else "")


def traffic_table(record: dict[str, Any]) -> str:
    """Markdown: GiB / G multiply-adds / operators / syncs per strategy (rows) and size (columns), then each
    cell's top sites."""
    sizes = record["sizes"]
    lines = [
        f"<!-- written by `{record['command']}`: do not edit -->",
        f"Modelled memory traffic of one `train_step` (default model, batch {record['batch']}, m = 100), GPU paths "
        "(`step_forms=gpu`): GiB read and written at least / G multiply-adds of the products / operators that launch "
        "work / host syncs "
        "(`scripts/lab/traffic.py`).",
        "",
        *table_head(["output", *(f"n = {n:,}" for n in sizes)]),
    ]
    cells = {(r["output"], r["n"]): r for r in record["rows"]}
    for output in record["outputs"]:
        row = [output]
        for n in sizes:
            r = cells.get((output, n))
            row.append("" if r is None else _traffic_cell(r))
        lines.append(table_row(row))
    lines.append("")
    for r in record["rows"]:
        sites = ", ".join(f"{s['op']} at {s['where']} {s['bytes'] / 2**30:.2f}" for s in r["top"])
        lines.append(f"- {r['output']} at n = {r['n']:,}: {sites}")
    lines.append("")
    return "\n".join(lines)


def _traffic_cell(row: dict[str, Any]) -> str:
    """One table cell: GiB / G multiply-adds / operators / syncs."""
    return f"{row['bytes'] / 2**30:.2f} / {row['macs'] / 1e9:.1f} / {row['launches']} / {row['syncs']}"


def dynamic_table(record: dict[str, Any]) -> str:
    """A ``scripts/bench_dynamic.py`` record as markdown: per run and mode, the median seconds per 1,000 tokens,
    the ratio to the exact objective's pass on the same run and the pass's perplexity."""
    lines = [
        f"<!-- written by `{record['command']}`: do not edit -->",
        f"Dynamic evaluation's passes, `scripts/bench_dynamic.py`: {record['rounds']} interleaved rounds over the "
        f"first {record['tokens']:,} test tokens of each run, {record['threads']} thread(s), method rms at lr "
        f"{record['lr']:g}, one process; median seconds per 1,000 tokens. Modes: `exact` (dynamic.objective=exact), "
        "`train:PROPOSAL[:RECENT]` (dynamic.objective=train, dynamic.proposal=PROPOSAL, dynamic.recent=RECENT where "
        "given, else its default).",
        "",
        *table_head(["run", "classes", "mode", "s / 1k tokens (median)", "x exact (same run)", "ppl"]),
    ]
    for label, run in record["runs"].items():
        for mode, seconds in run["seconds_per_1k_tokens"].items():
            ratio = run["ratio_to_exact"].get(mode)
            shown = "—" if ratio is None else f"{ratio:.2f}"
            row = [label, f"{run['num_classes']:,}", f"`{mode}`", f"{seconds:.2f}", shown, f"{run['ppl'][mode]:.1f}"]
            lines.append(table_row(row))
    return "\n".join([*lines, ""])
