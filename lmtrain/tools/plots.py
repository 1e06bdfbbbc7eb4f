"""Sweep plots: perplexity against m, validation curves per m; matplotlib on the Agg backend (runs compared:
``curve_plot.py``)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from lmtrain.tools.curves import validations
from lmtrain.tools.report import SummaryRow


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ppl_vs_samples(rows: list[SummaryRow], path: str | Path, metric: str = "test") -> Path:
    """Test perplexity (``metric="val"``: best validation perplexity; best val where a run has no test) against m,
    one line per sampler, log x.

    Strategies without samples (full softmax) are drawn as horizontal reference lines, as in Blanc & Rendle Fig. 2.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    use_test = metric == "test" and any(r.test_ppl is not None for r in rows)
    score = [(r, r.test_ppl if use_test else r.best_val_ppl) for r in rows]
    score = [(r, s) for r, s in score if r.finished and s is not None and math.isfinite(s)]  # final values only
    for label in sorted({r.label for r, _ in score if r.num_samples is not None}):
        points = [(r.num_samples, s) for r, s in score if r.label == label and r.num_samples is not None]
        sizes = sorted({m for m, _ in points})
        means = [statistics.mean(s for m, s in points if m == size) for size in sizes]  # repeated runs (seeds)
        (line,) = ax.plot(sizes, means, marker="o", label=label)
        if len(points) > len(sizes):
            ax.scatter([m for m, _ in points], [s for _, s in points], s=12, color=line.get_color(), alpha=0.5)
    references = [(r, s) for r, s in score if r.num_samples is None]
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]  # several references (full, hsm, adaptive) must stay apart
    for i, (r, s) in enumerate(references):
        shade = str(0.15 + 0.45 * i / max(len(references) - 1, 1))  # dark to mid gray
        ax.axhline(s, ls=styles[i % len(styles)], lw=1.2, color=shade, label=f"{r.label} (no m): {s:,.1f}")
    ax.set(xscale="log", yscale="log", xlabel="number of samples m", title="perplexity against sample size")
    sizes = sorted({r.num_samples for r, _ in score if r.num_samples is not None})
    if sizes:  # label the m values of the sweep, not powers of ten
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_ylabel("test perplexity" if use_test else "best validation perplexity")
    plain_log_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    return save_figure(fig, path, plt)


def plot_val_curves(rows: list[SummaryRow], path: str | Path) -> Path:
    """Validation perplexity against optimizer steps (each validation at the step it followed), one line per
    strategy, one panel per m (RF-softmax, Fig. 3)."""
    plt = pyplot()
    curves = [r for r in rows if r.run.series.get("val/ppl")]
    sizes = sorted({r.num_samples for r in curves if r.num_samples is not None}) or [None]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False)
    for ax, m in zip(axes[0], sizes, strict=True):
        drawn = [row for row in curves if row.num_samples in (m, None)]
        xs = []
        for row in drawn:
            ls = "--" if row.num_samples is None else "-"
            points = sorted(validations(row.run, "steps", None).values())  # (steps done, ppl)
            ax.plot(*zip(*points, strict=True), ls=ls, marker="o", ms=7 if len(points) == 1 else 5, label=row.label)
            xs += [x for x, _ in points] if len(points) == 1 else [math.nan]
        ax.set(xlabel="optimizer steps", ylabel="validation perplexity (exact)", yscale="log")
        references = any(row.num_samples is None for row in drawn)
        ax.set_title("all runs" if m is None else f"m = {m}" + ("; dashed: strategies without m" if references else ""))
        plain_log_ticks(ax)
        if xs and not any(math.isnan(x) for x in xs):
            single_points_ticks(ax, xs)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    return save_figure(fig, path, plt)


def plain_number(value: float, _position: Any = None) -> str:
    """A tick label without powers of ten: 849, 1,000, 88.5, 0.35."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plain_log_ticks(ax: Any) -> None:
    """Plain labels (849, not 8.49×10²) on a log y axis, about five of them over the drawn range: 1, 2, 5 x 10^k
    over a decade or more, evenly spaced round numbers over less, so every part of the axis is labelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

    low, high = ax.get_ylim()
    if ax.get_yscale() != "log" or low <= 0:
        return
    if high / low >= 10:
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    else:
        ticks = [t for t in MaxNLocator(nbins=5).tick_values(low, high) if low <= t <= high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(low, high)


def single_points_ticks(ax: Any, xs: list[float]) -> None:
    """Where every line of ``ax`` is one point (a short sweep's single validations): ticks at those x values only,
    not a span of 96-104 around one point."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs))))
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))


def save_figure(fig: Any, path: str | Path, plt: Any) -> Path:
    """Lay out, write (creating the folder) and close ``fig``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # with a legend placed outside the axes
    plt.close(fig)
    return out
