"""Plot train/validation perplexity curves of one or more lmtrain runs into a PNG.

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] [--out curves.png] [--title TEXT]

Validation perplexity (exact, every strategy) against the epochs trained on the left; on the right the training
perplexity per step for strategies whose training loss is the exact NLL (full, hsm, adaptive), else the training
loss (dashed: a sampled loss is not a perplexity). One color per run in both panels; the legend, outside the
panels, names each run by its name, else the overrides that tell the runs apart, else its output strategy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmtrain.tools.plots import pyplot, save_figure, val_curve, validated_within_epochs
from lmtrain.tools.results import load_run, run_labels


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders (each holds metrics.csv)")
    parser.add_argument("--out", default="curves.png", help="PNG path to write")
    parser.add_argument("--title", default="lmtrain perplexity curves")
    args = parser.parse_args(argv)

    runs = [load_run(r) for r in args.runs]
    labels = run_labels(runs)
    plt = pyplot()
    by_step = validated_within_epochs(runs)
    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(12, 4.5))
    for number, (run, label) in enumerate(zip(runs, labels, strict=True)):
        color = f"C{number % 10}"
        if run.series.get("val/ppl"):
            ax_val.plot(*val_curve(run, by_step), marker="o", color=color, label=label)
        ppl = run.series.get("train/ppl") or run.series.get("train/ppl_step")  # the latter: older metrics.csv
        loss = run.series.get("train/loss") or run.series.get("train/loss_step")
        rows, style = (ppl, "-") if ppl else (loss, "--")
        if rows:
            ax_train.plot([s for s, _, _ in rows], [v for _, _, v in rows], ls=style, lw=1, color=color, label=label)
    ax_val.set(
        xlabel="optimizer step" if by_step else "epochs trained",
        ylabel="validation perplexity (exact)",
        yscale="log",
        title="validation",
    )
    ax_train.set(
        xlabel="step",
        ylabel="train perplexity (solid) or training loss in nats (dashed)",
        yscale="log",
        title="training",
    )
    ax_val.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    for ax in (ax_val, ax_train):
        ax.grid(True, which="both", alpha=0.3)
    handles: dict[str, object] = {}
    for line in ax_val.lines + ax_train.lines:  # one entry per run, its validation line where it has one
        handles.setdefault(str(line.get_label()), line)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(args.title)
    out = save_figure(fig, args.out, plt)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
