"""Strategies at equal training time: validation perplexity against the training seconds of each run (the
``train/seconds`` that every validation logs), as a table at given budgets and as a PNG."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmtrain.tools.figures import pyplot, save_figure
from lmtrain.tools.run_records import (
    RunRecord,
    compose_labels,
    find_runs,
    natural_key,
    read_json_lines,
    run_labels,
)

TITLE = "validation perplexity against training time"  # the curves' title


@dataclass
class TimedRun:
    """One run's validations against training time, with what the table shows beside them."""

    label: str
    curve: list[tuple[float, float]]  # (training seconds, exact val ppl) at each validation, in order
    steps: int  # optimizer steps done
    tokens_per_step: int
    best_possible: float | None  # the source's optimum, for generated corpora

    @property
    def seconds(self) -> float:
        return self.curve[-1][0] if self.curve else 0.0

    @property
    def tokens_per_sec(self) -> float | None:
        return self.steps * self.tokens_per_step / self.seconds if self.seconds else None

    def ppl_at(self, budget: float) -> float | None:
        """The best val ppl among the validations within ``budget`` training seconds (the best checkpoint lmtrain
        keeps by then). A validation counts for a budget when the step before it started within the budget: runs
        validate at the first step that ends past a time (``val_check_interval``, ``max_train_seconds``)."""
        within = [ppl for t, ppl in self.curve if t - self.step_seconds <= budget]
        return min(within) if within else None

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0


def timed_run(run: RunRecord, label: str) -> TimedRun:
    """The validations of ``run`` with the training seconds logged beside them (same step)."""
    seconds = {step: value for step, _, value in run.series.get("train/seconds", [])}
    curve = [(seconds[step], ppl) for step, _, ppl in run.series.get("val/ppl", []) if step in seconds]
    losses = run.series.get("train/loss", [])
    config_file = run.path / "config.yaml"
    data = (yaml.safe_load(config_file.read_text()) or {}).get("data", {}) if config_file.is_file() else {}
    best = run.info.get("best_possible_ppl")
    return TimedRun(
        label=label,
        curve=curve,
        steps=losses[-1][0] + 1 if losses else 0,
        tokens_per_step=int(data.get("batch_size", 0)) * int(data.get("bptt", 0)),
        best_possible=float(best) if isinstance(best, int | float) else None,
    )


def timed_runs(runs: list[RunRecord]) -> list[TimedRun]:
    return [timed_run(run, label) for run, label in zip(runs, run_labels(runs), strict=True)]


def recorded_runs(records: list[dict[str, Any]]) -> list[TimedRun]:
    """The same from a study's records (``records.jsonl``, committed), not its run folders: each validation's
    training seconds and perplexity, the steps up to the last one, the batch shape of the record's config. In the
    order of the run folders; labelled by the cell values and seed that differ between the records."""
    records = sorted(records, key=lambda r: natural_key(Path(str(r.get("config", {}).get("run_dir", r["key"])))))
    items = [[*(f"{k}={v}" for k, v in r["cell"].items()), f"seed={r['seed']}"] for r in records]
    labels = compose_labels([r["cell"].get("output") for r in records], items)  # as run_labels labels the folders
    runs = []
    for record, label in zip(records, labels, strict=True):
        validations = [v for v in record["validations"] if v["train_seconds"] is not None]
        data = record.get("config", {}).get("data", {})
        best = record.get("best_possible_ppl")
        runs.append(
            TimedRun(
                label=label or str(record["key"]),
                curve=[(v["train_seconds"], v["ppl"]) for v in validations],
                steps=validations[-1]["step"] + 1 if validations else 0,
                tokens_per_step=int(data.get("batch_size", 0)) * int(data.get("bptt", 0)),
                best_possible=float(best) if isinstance(best, int | float) else None,
            )
        )
    return runs


def summary_table(runs: list[TimedRun], minutes: list[float]) -> str:
    """summary.md's text: ``budget_table`` at budgets given in minutes."""
    return budget_table(runs, [60 * m for m in minutes])


def write_summary(runs: list[TimedRun], budgets: list[float], out: Path, title: str) -> list[Path]:
    """summary.md (the table at ``budgets``, minutes) and ppl_vs_time.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(summary_table(runs, budgets))
    return [out / "summary.md", plot_ppl_vs_time(runs, out / "ppl_vs_time.png", title)]


def best_possible(runs: list[TimedRun]) -> float | None:
    """The source's optimum, where the corpus is generated (the same for every run of one corpus)."""
    return next((run.best_possible for run in runs if run.best_possible is not None), None)


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "" if value is None else format(value, spec)


def budget_table(runs: list[TimedRun], budgets: list[float]) -> str:
    """Markdown: one row per run, the best val ppl reached within each budget (minutes), steps and tokens/s."""
    header = ["run", *(f"best val ppl by {b / 60:g} min" for b in budgets), "steps", "tokens/s", "training min"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ranked = sorted(runs, key=lambda r: (r.ppl_at(budgets[-1]) is None, r.ppl_at(budgets[-1]) or 0.0))
    for run in ranked:
        cells = [run.label, *(_fmt(run.ppl_at(b)) for b in budgets)]
        cells += [f"{run.steps:,}", _fmt(run.tokens_per_sec, ",.0f"), _fmt(run.seconds / 60, ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    best = best_possible(runs)
    if best is not None:
        lines.append(f"\nBest possible perplexity of the source (its exact entropy rate): {best:,.1f}.")
    return "\n".join(lines) + "\n"


def plot_ppl_vs_time(runs: list[TimedRun], path: str | Path, title: str) -> Path:
    """Validation perplexity (log) against training minutes, one line per run, one colour and legend entry per
    group of runs that differ only by their seed; the source's optimum if known."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = [run for run in runs if run.curve]
    groups = [" ".join(w for w in run.label.split() if not w.startswith("seed=")) or run.label for run in drawn]
    order = list(dict.fromkeys(groups))  # in the order of each group's first run
    labelled: set[str] = set()
    for run, group in zip(drawn, groups, strict=True):
        size = groups.count(group)
        label = "_nolegend_" if group in labelled else (group if size == 1 else f"{group} ({size} runs)")
        labelled.add(group)
        minutes = [t / 60 for t, _ in run.curve]
        colour = f"C{order.index(group) % 10}"
        ax.plot(minutes, [p for _, p in run.curve], marker="o", ms=3, color=colour, label=label)
    best = best_possible(runs)
    if best is not None:
        ax.axhline(best, color="k", ls=":", lw=1, label=f"best possible ({best:,.0f})")
    ax.set(xlabel="training time (minutes, validation left out)", ylabel="validation perplexity (exact)", title=title)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save_figure(fig, path, plt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="strategies at equal training time: table and PNG")
    parser.add_argument("runs", type=Path, help="a folder of lmtrain run folders, or a study's records.jsonl")
    parser.add_argument("--budgets", default="1,2,4,7", help="training minutes, comma list")
    parser.add_argument("--out", type=Path, default=None, help="where to write summary.md and ppl_vs_time.png")
    parser.add_argument("--title", default=TITLE)
    args = parser.parse_args(argv)
    if args.runs.is_file():  # a study's records: the runs' folders need not be there
        runs = recorded_runs(read_json_lines(args.runs))
        out = args.out or args.runs.parent
    else:
        found = find_runs(args.runs)
        runs, out = timed_runs(found), args.out or args.runs
    if not runs:
        print(f"time_budget: no run folders (with metrics.csv) or records in {args.runs}", file=sys.stderr)
        return 2
    written = write_summary(runs, [float(b) for b in args.budgets.split(",")], out, args.title)
    print(written[0].read_text())
    print(f"wrote {written[0]} and {written[1]}")
    return 0
