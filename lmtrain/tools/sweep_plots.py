"""A sweep's plots (``python -m lmtrain.summarize``): perplexity against the number of samples m, and validation
curves with one panel per m."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from lmtrain.tools.curve_data import validations
from lmtrain.tools.figures import plain_log_ticks, pyplot, save_figure, single_points_ticks
from lmtrain.tools.sweep_table import SummaryRow


def plot_ppl_vs_samples(rows: list[SummaryRow], path: str | Path, metric: str = "test") -> Path | None:
    """Test perplexity (``metric="val"``: best validation perplexity; best val where a run has no test) against m,
    one line per sampler, log x; None, writing nothing, where no finished job has one.

    Strategies without samples (full softmax) are drawn as horizontal reference lines, as in Blanc & Rendle Fig. 2.
    """
    use_test = metric == "test" and any(r.test_ppl is not None for r in rows)
    score = [(r, r.test_ppl if use_test else r.best_val_ppl) for r in rows]
    score = [(r, s) for r, s in score if r.finished and s is not None and math.isfinite(s)]  # final values only
    if not score:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
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


def plot_val_curves(rows: list[SummaryRow], path: str | Path) -> Path | None:
    """Validation perplexity against optimizer steps (each validation at the step it followed), one line per
    strategy, one panel per m (RF-softmax, Fig. 3); None, writing nothing, where no job has validated yet."""
    curves = [r for r in rows if r.run.series.get("val/ppl")]
    if not curves:
        return None
    plt = pyplot()
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
