"""Plot train/validation perplexity curves of one or more lmtrain runs into a PNG.

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] [--out curves.png] [--title TEXT]

Validation perplexity (exact, every strategy) per epoch on the left; on the right the training perplexity
per step for strategies whose training loss is the exact NLL (full, hsm, adaptive), else the training loss,
labelled as such (a sampled loss is not a perplexity). Lines are labelled by output strategy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmtrain.report import pyplot, save_figure, val_curve, validated_within_epochs
from lmtrain.results import load_run


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders (each holds metrics.csv)")
    parser.add_argument("--out", default="curves.png", help="PNG path to write")
    parser.add_argument("--title", default="lmtrain perplexity curves")
    args = parser.parse_args(argv)

    runs = [load_run(r) for r in args.runs]
    strategies = [str(run.info.get("output") or run.name) for run in runs]
    labels = [s if strategies.count(s) == 1 else f"{s} ({run.name})" for s, run in zip(strategies, runs, strict=True)]
    plt = pyplot()
    by_step = validated_within_epochs(runs)
    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run, label in zip(runs, labels, strict=True):
        if run.series.get("val/ppl"):
            ax_val.plot(*val_curve(run, by_step), marker="o", label=label)
        if run.series.get("train/ppl_step") or run.series.get("train/ppl"):
            rows = run.series.get("train/ppl_step") or run.series["train/ppl"]
            ax_train.plot([s for s, _, _ in rows], [v for _, _, v in rows], label=f"{label} (train ppl)", lw=1)
        elif run.series.get("train/loss_step"):
            rows = run.series["train/loss_step"]
            ax_train.plot(
                [s for s, _, _ in rows],
                [v for _, _, v in rows],
                ls="--",
                lw=1,
                label=f"{run.name} (surrogate loss)",
            )
    ax_val.set(
        xlabel="optimizer step" if by_step else "epoch",
        ylabel="validation perplexity (exact)",
        yscale="log",
        title="validation",
    )
    ax_train.set(xlabel="step", ylabel="train perplexity, or training loss (nats)", yscale="log", title="training")
    for ax in (ax_val, ax_train):
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(args.title)
    out = save_figure(fig, args.out, plt)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
