"""``python -m lmtrain.plot RUN_OR_SWEEP... [--x steps|tokens|seconds|all] [--out FILE.png]``: curves that compare
runs, drawn from the panels of ``curve_data.py``.

Validation perplexity (exact for every strategy) against optimizer steps, training tokens or training seconds
(``--x all``: a panel each), then the training panels: exact training perplexity for the strategies whose loss is
the exact NLL, training loss in nats for the others, each in a panel of its own. Runs that differ only by their
seed are one line, the mean over the seeds, with a band from their min to their max. One color per group in every
panel; each panel's legend names its lines by what differs between the groups. Without validations yet, the
validation panels are left out and the command says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lmtrain.tools.curve_data import AXES, Panel, curve_panels, group_by_seed
from lmtrain.tools.figures import plain_log_ticks, pyplot, save_figure, single_points_ticks
from lmtrain.tools.run_records import load_runs


def draw(panels: list[Panel], title: str) -> Any:
    """A matplotlib figure of ``panels`` (Agg backend): the validation panels in the first row, the training panels
    in the second; the caller saves or inspects and closes it."""
    plt = pyplot()
    rows = [[p for p in panels if p.title.startswith("validation")], [p for p in panels if p.title.startswith("train")]]
    rows = [row for row in rows if row]
    columns = max(len(row) for row in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(5.2 * columns, 4.0 * len(rows)), squeeze=False)
    for row, row_axes in zip(rows, axes, strict=True):
        for ax in row_axes[len(row) :]:
            ax.set_visible(False)
        for ax, panel in zip(row_axes, row, strict=False):
            for line in panel.lines:
                color = f"C{line.group % 10}"
                single = len(line.x) == 1  # one validation: a marker big enough to see, its seeds' range as a bar
                marker = "o" if single or panel.title.startswith("validation") else None
                ax.plot(line.x, line.y, color=color, marker=marker, ms=7 if single else 3, lw=1.3, label=line.label)
                if line.low is not None and line.high is not None:
                    if single:
                        ax.vlines(line.x, line.low, line.high, color=color, lw=2.5, alpha=0.4)
                    else:
                        ax.fill_between(line.x, line.low, line.high, color=color, alpha=0.2, lw=0)
            ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel, yscale=panel.yscale)
            plain_log_ticks(ax)
            if all(len(line.x) == 1 for line in panel.lines):
                single_points_ticks(ax, [line.x[0] for line in panel.lines])
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)  # each panel names its own lines: not every group has every metric
    banded = any(line.low is not None for panel in panels for line in panel.lines)
    fig.suptitle(title + ("  (line: mean over seeds, band or bar: min to max)" if banded else ""))
    return fig


def plot_runs(paths: list[str | Path], x: str = "all", out: str | Path = "curves.png", title: str = "") -> list[Panel]:
    """Write the comparison figure of the runs (or sweeps) in ``paths`` to ``out``; returns the plotted panels."""
    groups = group_by_seed(load_runs(paths))
    panels = [p for p in curve_panels(groups, x) if p.lines]
    if not panels:
        raise ValueError(f"nothing to plot: no validation or training rows in {', '.join(map(str, paths))}")
    save_figure(draw(panels, title or "lmtrain: runs compared"), out, pyplot())
    return panels


def main(argv: list[str] | None = None) -> Path:
    """The command line; returns the PNG written."""
    parser = argparse.ArgumentParser(prog="python -m lmtrain.plot", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders (holding metrics.csv) or sweep folders")
    parser.add_argument("--x", default="all", choices=[*AXES, "all"], help="validation x axis (default: all three)")
    parser.add_argument("--out", default="curves.png", help="PNG path to write")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    panels = plot_runs(args.runs, args.x, args.out, args.title)
    if not any(p.title.startswith("validation") for p in panels):
        print(f"no validations in {', '.join(args.runs)} yet: {args.out} shows the training curves only")
    print(f"wrote {args.out}")
    return Path(args.out)
