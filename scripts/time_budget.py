"""Strategies at equal training time: a table and a PNG of validation perplexity against training minutes.

    python scripts/time_budget.py RUNS_DIR [--budgets 1,2,4,7] [--out DIR] [--title TEXT]

RUNS_DIR holds run folders (a Hydra multirun, or any folder of them, searched recursively), each trained with
``max_train_seconds`` (or any run whose validations log ``train/seconds``). Writes DIR/summary.md (per run: the
exact val ppl of the last validation within each budget, in minutes of training with validation left out, the
steps, tokens/s and training minutes) and DIR/ppl_vs_time.png. DIR defaults to RUNS_DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmtrain.tools.report import find_runs
from lmtrain.tools.time_budget import budget_table, plot_ppl_vs_time, timed_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
