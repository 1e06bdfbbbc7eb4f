"""A study's table (``table.md``) and plot (``plot.png``), rendered from its records alone."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmtrain.study.records import read_records
from lmtrain.study.spec import Cell, StudySpec
from lmtrain.study.stats import CellStats, metric_value, relative, verdict
from lmtrain.tools.time_budget import TITLE, recorded_runs, summary_table, write_summary

METRIC_NAMES = {"test/ppl": "test ppl", "val/ppl": "best val ppl"}


def table_row(cells: Iterable[str]) -> str:
    """One row of a markdown table."""
    return "| " + " | ".join(cells) + " |"


def table_head(header: list[str]) -> list[str]:
    """A markdown table's header row and the rule under it."""
    return [table_row(header), "|" + "---|" * len(header)]


def cell_stats(spec: StudySpec, records: list[dict[str, Any]], metric: str) -> dict[str, CellStats]:
    """Each cell's metric over its seeds, for the seeds the study declares (records of other seeds are left out)."""
    by_key = {record["key"]: record for record in records}
    stats = {}
    for cell in spec.cells:
        keys = [f"{cell.label},seed={seed}" for seed in spec.seeds_of(cell)]
        found = [by_key[key] for key in keys if key in by_key]
        values = [v for v in (metric_value(r, metric) for r in found) if v is not None]
        stats[cell.label] = CellStats(cell.label, tuple(values), failed=len(found) - len(values))
    return stats


def varying_keys(cells: list[Cell]) -> list[str]:
    """The config keys whose value differs between ``cells`` (all their keys when none does): a table's columns."""
    keys: list[str] = []
    for cell in cells:
        keys += [k.lstrip("+") for k, _ in cell.values if k.lstrip("+") not in keys]
    return [k for k in keys if len({c.get(k) for c in cells}) > 1] or keys


def format_stats(s: CellStats) -> str:
    """'mean ± sd' over a cell's seeds ('mean' for one seed, '—' for none)."""
    if s.n == 0:
        return "—"
    return f"{s.mean:,.1f} ± {s.sd:,.1f}" if s.n >= 2 else f"{s.mean:,.1f}"


def _compare(s: CellStats, ref: CellStats | None, itself: str) -> str:
    if ref is None or s.n == 0 or ref.n == 0:
        return "—"
    if s.label == ref.label:
        return itself
    word = verdict(s, ref)
    return f"{relative(s, ref):+.1f}%" + (f" {word}" if word else "")


def _reference_for(spec: StudySpec, cell: Cell, stats: dict[str, CellStats]) -> CellStats | None:
    """The cell a row is compared with: the declared reference, its twin with the ``pair`` value, else (with an x
    axis) the best cell at its x."""
    if spec.reference:
        reference = spec.reference_of(cell)
        return None if reference is None else stats[reference.label]
    if spec.pair:
        key, value = spec.pair.split("=", 1)
        twin = tuple((k, value if k.lstrip("+") == key else v) for k, v in cell.values)
        return next((stats[c.label] for c in spec.cells if c.values == twin), None)
    if spec.x and cell.get(spec.x) is not None:
        same_x = [stats[c.label] for c in spec.cells if c.get(spec.x) == cell.get(spec.x) and stats[c.label].n]
        return min(same_x, key=lambda s: s.mean, default=None)
    return None


def runs_line(records: list[dict[str, Any]]) -> str:
    """Where the records were measured: 'N runs on DEVICE (count); threads per run: [...]; code: COMMITS'."""
    devices = Counter(r.get("device", "?") for r in records)
    threads = sorted({r.get("threads") for r in records if r.get("threads") is not None})
    commits = sorted({(r.get("commit") or "?")[:7] + ("+dirty" if r.get("dirty") else "") for r in records})
    shown_devices = ", ".join(f"{d} ({n})" for d, n in devices.items())
    return f"{len(records)} runs on {shown_devices}; threads per run: {threads}; code: {', '.join(commits)}"


def render_table(spec: StudySpec, records: list[dict[str, Any]]) -> str:
    """The markdown of the study's table: one row per cell, mean ± sd over seeds, and its comparison."""
    stats = cell_stats(spec, records, spec.metric)
    other = "val/ppl" if spec.metric == "test/ppl" else "test/ppl"
    second = cell_stats(spec, records, other)
    keys = varying_keys(spec.cells)
    against = f"vs {spec.reference or spec.pair}" if spec.reference or spec.pair else ""
    against += f" (same {spec.within})" if spec.within else ""
    against = against or (f"vs best at same {spec.x}" if spec.x else "")
    header = [*keys, "seeds", f"{METRIC_NAMES[spec.metric]} (mean ± sd)", METRIC_NAMES[other]]
    header += [against] if against else []
    lines = [
        f"<!-- rendered by `python -m lmtrain.study {spec.name} --render` from records.jsonl: do not edit -->",
        f"**{spec.name}**: {spec.description}",
        "",
        f"Each run: `python -m lmtrain {' '.join(spec.overrides)} CELL seed=S` with S in {spec.seeds}"
        + (" (other seeds where a cell says so)." if spec.cell_seeds else "."),
        f"Recorded: {runs_line(records)}." if records else "Recorded: no runs yet.",
        "",
        *table_head(header),
    ]
    for cell in spec.cells:
        s = stats[cell.label]
        seeds = f"{s.n}" + (f" ({s.failed} failed)" if s.failed else "")
        row = [cell.get(k) or "" for k in keys]
        row += [seeds, format_stats(s), format_stats(second[cell.label])]
        itself = "best" if against.startswith("vs best") else "reference"
        row += [_compare(s, _reference_for(spec, cell, stats), itself)] if against else []
        lines.append(table_row(row))
    lines += ["", "'beats' / 'behind': the means differ by more than twice the pooled sd of the seeds; else 'tied'."]
    lines += ["Throughput is in the records (tokens_per_sec) but not compared here: runs shared machines and devices."]
    lines += [f"{note}" for note in spec.notes]
    return "\n".join(lines) + "\n"


def render_plot(spec: StudySpec, records: list[dict[str, Any]], path: Path) -> Path:
    """The metric per cell with its seed spread: lines over the x key (log axis) if the study has one, else bars."""
    from lmtrain.tools.figures import plain_log_ticks, pyplot, save_figure

    plt = pyplot()
    stats = cell_stats(spec, records, spec.metric)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    if spec.x:
        series: dict[str, list[tuple[float, CellStats]]] = {}
        for cell in spec.cells:
            # the cell's other keys name its line; a grid of the x key alone is one line, named by the study
            rest = ",".join(f"{k}={v}" for k, v in cell.values if k.lstrip("+") != spec.x) or spec.name
            if cell.get(spec.x) is None or not stats[cell.label].n:
                continue
            series.setdefault(rest, []).append((float(cell.get(spec.x) or 0), stats[cell.label]))
        for label, points in series.items():
            points.sort(key=lambda p: p[0])
            xs, ss = [p[0] for p in points], [p[1] for p in points]
            sds = [0.0 if math.isnan(s.sd) else s.sd for s in ss]
            ax.errorbar(xs, [s.mean for s in ss], yerr=sds, marker="o", capsize=3, label=label)
        for i, cell in enumerate(c for c in spec.cells if c.get(spec.x) is None and stats[c.label].n):
            ref = stats[cell.label]  # a cell without the x key (the full softmax): a level with its seed band
            line = ax.axhline(ref.mean, ls="--", color=str(0.2 + 0.2 * i), label=f"{cell.label} (no {spec.x})")
            if ref.n >= 2:
                ax.axhspan(ref.mean - ref.sd, ref.mean + ref.sd, color=line.get_color(), alpha=0.15)
        sizes = sorted({float(c.get(spec.x) or 0) for c in spec.cells if c.get(spec.x) is not None})
        ax.set(xscale="log", xlabel=spec.x)
        ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    else:
        shown = [stats[c.label] for c in spec.cells if stats[c.label].n]
        positions = range(len(shown))
        sds = [0.0 if math.isnan(s.sd) else s.sd for s in shown]
        ax.bar(positions, [s.mean for s in shown], yerr=sds, capsize=3, color="tab:blue", alpha=0.7)
        for i, s in enumerate(shown):  # every seed as a dot
            ax.scatter([i] * s.n, s.values, s=10, color="black", zorder=3)
        ax.set_xticks(list(positions), [short_label(s.label) for s in shown], rotation=35, ha="right", fontsize=8)
    ax.set(yscale="log", ylabel=f"{METRIC_NAMES[spec.metric]} (mean ± sd over seeds)", title=spec.name)
    plain_log_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    if spec.x and ax.lines:
        ax.legend(fontsize=7)
    return save_figure(fig, path, plt)


def short_label(label: str) -> str:
    """'output=rff,output.shared_negatives=true' -> 'rff, shared_negatives=true' (for crowded axis labels)."""
    parts = [p.split("=", 1) for p in label.split(",")]
    return ", ".join(v if k == "output" else f"{k.rsplit('.', 1)[-1]}={v}" for k, v in parts)


def render(spec: StudySpec, root: Path) -> list[Path]:
    """Write the study's table.md and plot.png from its records, and for a study with ``budgets`` its equal-time
    summary.md and ppl_vs_time.png; returns the files written."""
    folder = root / spec.name
    records = read_records(folder / "records.jsonl")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(render_table(spec, records))
    written = [folder / "table.md", render_plot(spec, records, folder / "plot.png")]
    if spec.survey:
        from lmtrain.study.survey import render_survey  # survey.py reads render's cell statistics

        (folder / "survey.md").write_text(render_survey(spec, records, root.parent.parent))
        written.append(folder / "survey.md")
    if spec.budgets:
        written += write_summary(recorded_runs(records), spec.budgets, folder, TITLE)
    return written


def check(spec: StudySpec, root: Path) -> str | None:
    """None when the committed table.md equals its rendering from the records, else what differs."""
    folder = root / spec.name
    if not (folder / "records.jsonl").is_file():
        return None  # a study that has not run yet has nothing to check
    records = read_records(folder / "records.jsonl")
    expected = render_table(spec, records)
    table = folder / "table.md"
    if not table.is_file():
        return f"{table} is missing: run python -m lmtrain.study {spec.name} --render"
    if table.read_text() != expected:
        return f"{table} differs from its rendering: run python -m lmtrain.study {spec.name} --render"
    if spec.survey:
        from lmtrain.study.survey import render_survey

        survey = folder / "survey.md"
        if not survey.is_file() or survey.read_text() != render_survey(spec, records, root.parent.parent):
            return (
                f"{survey} differs from its rendering (or is missing): run python -m lmtrain.study {spec.name} --render"
            )
    summary = folder / "summary.md"
    if spec.budgets and (
        not summary.is_file() or summary.read_text() != summary_table(recorded_runs(records), spec.budgets)
    ):
        return f"{summary} is missing or differs from its rendering: run python -m lmtrain.study {spec.name} --render"
    return None
