"""A scoring study's table (``table.md``) and plot (``plot.png``), rendered from its records alone.

One row per source cell (a strategy), in the source study's order: per mode the perplexity (mean ± sd over seeds)
and, for every mode but the baseline (the first declared), its gain: each seed's perplexity with the mode relative to
the same run's baseline perplexity, in percent, mean ± sd over seeds. The last column compares each row's gains with
the reference cell's by the project's rule (``lmtrain.study.stats.verdict``): 'larger' or 'smaller' only where the
mean gains differ by more than twice the pooled sd of the two cells' seed gains, else 'tied'. A mode that the study
declares another's computation in a cell (``same``) shows that mode's numbers there, marked "(= OTHER)"; a mode it
leaves out of a cell (``skip``) shows "not run" there, with the reason under the table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lmtrain.study.records import read_records
from lmtrain.study.render import format_stats, runs_line, short_label, varying_keys
from lmtrain.study.scores import records_file
from lmtrain.study.scores_spec import ScoreSpec
from lmtrain.study.spec import Cell, StudyError
from lmtrain.study.stats import CellStats, verdict

WORDS = {"beats": "larger", "behind": "smaller", "tied": "tied", "": "too few seeds"}  # lower (more negative) gains win


def _label(cell: dict[str, str]) -> str:
    return Cell(tuple(cell.items())).label


def row_cells(spec: ScoreSpec, records: list[dict[str, Any]]) -> list[Cell]:
    """The source cells that have records, in the source study's grid order (cells it no longer declares after)."""
    held = {_label(r["cell"]): Cell(tuple(r["cell"].items())) for r in records}
    try:
        order = [c.label for c in spec.source_spec().cells]
    except StudyError:  # the source study's declaration is gone: the records' order
        order = []
    return sorted(held.values(), key=lambda c: order.index(c.label) if c.label in order else len(order))


def mode_stats(records: list[dict[str, Any]], label: str, mode: str, key: str = "ppl") -> CellStats:
    """A cell's ``key`` (ppl, seconds_per_1k_tokens) under a mode, over its seeds (failed scorings counted apart)."""
    found = [r for r in records if _label(r["cell"]) == label and r["mode"] == mode]
    values = [float(r[key]) for r in found if r["status"] == "ok" and _finite(r.get(key))]
    failed = sum(r["status"] != "ok" for r in found)
    return CellStats(label, tuple(values), failed=failed)


def gain_stats(records: list[dict[str, Any]], label: str, mode: str, baseline: str) -> CellStats:
    """A cell's gain under a mode: per seed 100 (ppl_mode / ppl_baseline - 1) of the same run, over its seeds."""
    by_seed: dict[str, dict[int, float]] = {mode: {}, baseline: {}}
    for r in records:
        if _label(r["cell"]) == label and r["mode"] in by_seed and r["status"] == "ok" and _finite(r.get("ppl")):
            by_seed[r["mode"]][int(r["seed"])] = float(r["ppl"])
    seeds = sorted(set(by_seed[mode]) & set(by_seed[baseline]))
    return CellStats(label, tuple(100.0 * (by_seed[mode][s] / by_seed[baseline][s] - 1.0) for s in seeds))


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _gain(s: CellStats) -> str:
    if s.n == 0:
        return "—"
    return f"{s.mean:+.1f} ± {s.sd:.1f}%" if s.n >= 2 else f"{s.mean:+.1f}%"


def _with_failed(text: str, s: CellStats) -> str:
    return f"{text} ({s.failed} failed)" if s.failed else text


def render_scores_table(spec: ScoreSpec, records: list[dict[str, Any]]) -> str:
    """The markdown of the scoring study's table (see the module docstring)."""
    cells = row_cells(spec, records)
    keys = varying_keys(cells)
    name = {c.label: short_label(",".join(f"{k}={c.get(k)}" for k in keys if c.get(k) is not None)) for c in cells}
    modes, baseline = list(spec.modes), spec.baseline
    reference = spec.reference if spec.reference in name else None
    header = ["strategy", "seeds"]
    for mode in modes:
        header += [f"{mode} ppl", *([f"{mode} s / 1k tokens"] if spec.speed else [])]
        header += [] if mode == baseline else [f"{mode} gain"]
    header += [f"gain vs {name[reference]}'s"] if reference and len(modes) > 1 else []
    shown_modes = ", ".join(f"{m} ({' '.join(a) or 'no additions'})" for m, a in spec.modes.items())
    scored = " ".join(["python -m lmtrain.score ckpt_path=RUN file=TEST", *spec.overrides, "MODE"])
    globs = " or ".join(f"`{c}`" for c in spec.cells)
    recorded = runs_line(records).replace(" runs on", " scorings on")
    lines = [
        f"<!-- rendered by `python -m lmtrain.study {spec.name} --render` from records.jsonl: do not edit -->",
        f"**{spec.name}**: {spec.description}",
        "",
        f"Each (run, mode): `{scored}` over the test text of the runs of study `{spec.study}` whose cell matches"
        f" {globs}; modes: {shown_modes}.",
        f"Recorded: {recorded}." if records else "Recorded: nothing yet.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for cell in cells:
        label = cell.label
        seeds = {int(r["seed"]) for r in records if _label(r["cell"]) == label}
        row = [name[label], str(len(seeds))]
        words = []
        for mode in modes:
            if spec.skipped(label, mode):  # not scored here: the reason is under the table
                row += ["not run", *(["—"] if spec.speed else []), *([] if mode == baseline else ["—"])]
                continue
            own = spec.scored_as(label, mode)  # the mode whose records stand for this one here
            ppl = mode_stats(records, label, own)
            row.append(_with_failed(format_stats(ppl), ppl) + ("" if own == mode else f" (= {own})"))
            if spec.speed:
                row.append(_speed(mode_stats(records, label, own, "seconds_per_1k_tokens")))
            if mode != baseline:
                gain = gain_stats(records, label, own, baseline)
                row.append(_gain(gain))
                if reference and label != reference:
                    theirs = gain_stats(records, reference, spec.scored_as(reference, mode), baseline)
                    words.append(f"{mode} {WORDS[verdict(gain, theirs)]}")
        if reference and len(modes) > 1:
            row.append("reference" if label == reference else ", ".join(words))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Gain: each seed's perplexity with the mode relative to the same run's {baseline} perplexity, mean ± sd over"
        " seeds (negative: the mode helps). 'larger' / 'smaller': the mean gains differ by more than twice the pooled"
        " sd of the two cells' seed gains; else 'tied'. The settings each scoring chose (cache θ and λ, dynamic"
        " evaluation's lr, searched on the validation split; the other options) are in the records.",
    ]
    if spec.speed:
        lines += [
            "s / 1k tokens: the scoring pass alone (searches and gradient statistics aside), wall seconds as the study"
            " ran it; jobs that shared the machine slow each other, so speeds are compared side by side in one process"
            " by `scripts/bench_dynamic.py`."
        ]
    lines += [
        f"Not run: {name[c.label]} {mode}: {why}"
        for c in cells
        for mode in modes
        if (why := spec.skipped(c.label, mode))
    ]
    lines += list(spec.notes)
    return "\n".join(lines) + "\n"


def _speed(s: CellStats) -> str:
    if s.n == 0:
        return "—"
    return f"{s.mean:.2f} ± {s.sd:.2f}" if s.n >= 2 else f"{s.mean:.2f}"  # 5.00, not 5


def render_scores_plot(spec: ScoreSpec, records: list[dict[str, Any]], path: Path) -> Path:
    """Each cell's gain per mode (bars: mean, whiskers: sd, dots: seeds)."""
    from lmtrain.tools.figures import pyplot, save_figure

    plt = pyplot()
    cells = row_cells(spec, records)
    keys = varying_keys(cells)
    modes = [m for m in spec.modes if m != spec.baseline]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(cells) * max(1, len(modes))), 4.8))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        gains = [gain_stats(records, c.label, spec.scored_as(c.label, mode), spec.baseline) for c in cells]
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(cells))]
        means = [g.mean if g.n else 0.0 for g in gains]
        sds = [0.0 if math.isnan(g.sd) else g.sd for g in gains]
        ax.bar(xs, means, width, yerr=sds, capsize=2, label=mode, alpha=0.75)
        for x, g in zip(xs, gains, strict=True):
            ax.scatter([x] * g.n, g.values, s=8, color="black", zorder=3)
    labels = [short_label(",".join(f"{k}={c.get(k)}" for k in keys if c.get(k) is not None)) for c in cells]
    ax.set_xticks(range(len(cells)), labels, rotation=35, ha="right", fontsize=8)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set(ylabel=f"perplexity vs {spec.baseline} (%, mean ± sd over seeds)", title=spec.name)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, plt)


def render_scores(spec: ScoreSpec, root: Path) -> list[Path]:
    """Write the study's table.md and plot.png from its records; returns the files written."""
    records = read_records(records_file(spec, root))
    folder = root / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(render_scores_table(spec, records))
    written = [folder / "table.md"]
    if records:
        written.append(render_scores_plot(spec, records, folder / "plot.png"))
    return written


def check_scores(spec: ScoreSpec, root: Path) -> str | None:
    """None when the committed table.md equals its rendering from the records (or the study has none yet)."""
    path = records_file(spec, root)
    if not path.is_file():
        return None
    table = root / spec.name / "table.md"
    if not table.is_file() or table.read_text() != render_scores_table(spec, read_records(path)):
        return f"{table} is missing or differs from its rendering: run python -m lmtrain.study {spec.name} --render"
    return None
