"""Strategies at equal training time: validation perplexity against the training seconds of each run (the
``train/seconds`` that every validation logs), as a table at given budgets and as a PNG."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from lmtrain.tools.figures import pyplot, save_figure
from lmtrain.tools.run_records import RunRecord, find_runs, run_labels


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
    """Validation perplexity (log) against training minutes, one line per run; the source's optimum if known."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for number, run in enumerate(runs):
        if run.curve:
            minutes = [t / 60 for t, _ in run.curve]
            ax.plot(minutes, [p for _, p in run.curve], marker="o", ms=3, color=f"C{number % 10}", label=run.label)
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
    parser.add_argument("runs", type=Path, help="a folder of lmtrain run folders")
    parser.add_argument("--budgets", default="1,2,4,7", help="training minutes, comma list")
    parser.add_argument("--out", type=Path, default=None, help="where to write summary.md and ppl_vs_time.png")
    parser.add_argument("--title", default="validation perplexity against training time")
    args = parser.parse_args(argv)
    found = find_runs(args.runs)
    if not found:
        print(f"time_budget: no run folders (with metrics.csv) under {args.runs}", file=sys.stderr)
        return 2
    runs = timed_runs(found)
    out = args.out or args.runs
    out.mkdir(parents=True, exist_ok=True)
    budgets = [float(b) * 60 for b in args.budgets.split(",")]
    (out / "summary.md").write_text(budget_table(runs, budgets))
    plot_ppl_vs_time(runs, out / "ppl_vs_time.png", args.title)
    print((out / "summary.md").read_text())
    print(f"wrote {out / 'summary.md'} and {out / 'ppl_vs_time.png'}")
    return 0
