"""A throughput benchmark's record (``scripts/bench_train.py --json``) rendered as a table: tokens/s per strategy,
the median of interleaved rounds, and the ratio to the full softmax measured in the same run. A GPU benchmark's
record (``scripts/bench_gpu.py``) has its own layout (``lmtrain.study.gpu_bench``)."""

from __future__ import annotations

import json
from pathlib import Path

from lmtrain.study.gpu_bench import KIND, render_gpu


def render_bench(path: Path) -> str:
    """The markdown table of one bench_train JSON record (every corpus it measured), or of a bench_gpu record."""
    record = json.loads(path.read_text())
    if "budgets" in record and "rows" in record:  # a scripts/bench_launches.py record
        from lmtrain.tools.launches import launches_table

        return launches_table(record)
    if record.get("kind") == KIND:
        return render_gpu(path.name, record)
    if record.get("kind") == "bench_traffic":  # a scripts/bench_traffic.py record
        from lmtrain.tools.traffic import traffic_table

        return traffic_table(record)
    isolated = ", each cell in its own process" if "child" in str(record.get("peak_memory", "")) else ""
    lines = [
        f"<!-- rendered by `python -m lmtrain.study --bench docs/bench/{path.name}` from that record: do not edit -->",
        f"Training throughput, `scripts/bench_train.py` ({path.name}): {record['rounds']} interleaved rounds of "
        f"{record['steps']} steps, {record['threads']} thread(s), device {record['device'] or 'auto'}, experiment "
        f"`{record['experiment']}`{isolated}; median of the rounds.",
        "",
    ]
    corpora = record.get("corpora") or {record.get("data") or "default data": record}  # one corpus: a flat record
    for corpus, data in corpora.items():
        lines += [f"| {corpus}: output | tokens/s (median) | rounds | x full (same run) |", "|---|---|---|---|"]
        for name, speed in data["tokens_per_sec"].items():
            ratio = data["ratio_to_full"].get(name)
            shown = "—" if ratio is None else f"{ratio:.2f}"
            lines.append(f"| {name} | {speed:,.0f} | {len(data['samples'][name])} | {shown} |")
        lines.append("")
    return "\n".join(lines)


def write_bench(path: Path) -> Path:
    """Write the table beside the record (NAME.json -> NAME.md)."""
    out = path.with_suffix(".md")
    out.write_text(render_bench(path))
    return out
