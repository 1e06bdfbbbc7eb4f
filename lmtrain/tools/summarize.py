"""Summarize a Hydra multirun of lmtrain jobs: a markdown table and two perplexity plots.

    python -m lmtrain.summarize MULTIRUN_DIR [--out DIR] [--outputs full,rff] [--num-samples 100]

Writes DIR/summary.md (strategy, sampler and its options, m, best val ppl, test ppl, tokens/s, wall time per
job; failed or unfinished jobs are listed as such), DIR/ppl_vs_samples.png (test perplexity against the number
of samples, one line per sampler, log x: Blanc & Rendle 2018, Fig. 2) and DIR/val_curves.png (validation
perplexity against steps, one line per strategy, one panel per m: Rawat et al. 2019, Fig. 3); a plot with
nothing to show yet (no finished job, no validation) is not written, and a line says so. DIR defaults to
MULTIRUN_DIR. Also prints the `wandb sync` command for the sweep's offline W&B runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmtrain.tools.run_records import find_runs, natural_key
from lmtrain.tools.sweep_plots import plot_ppl_vs_samples, plot_val_curves
from lmtrain.tools.sweep_table import markdown_table, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="a multirun folder (hydra.sweep.dir) or any folder of run folders")
    parser.add_argument("--out", type=Path, default=None, help="where to write summary.md and the PNGs")
    parser.add_argument("--outputs", default=None, help="keep only these strategies (comma list, e.g. full,rff)")
    parser.add_argument("--num-samples", type=int, default=None, help="keep only this m (and strategies without m)")
    parser.add_argument("--metric", choices=("test", "val"), default="test", help="perplexity plotted against m")
    parser.add_argument("--hide", default="", help="option names left out of the labels (comma list)")
    args = parser.parse_args(argv)

    if not args.sweep.is_dir():
        print(f"summarize: {args.sweep} is not a folder: pass a multirun folder (hydra.sweep.dir)", file=sys.stderr)
        return 2
    runs = find_runs(args.sweep)
    if not runs:
        print(f"summarize: no run folders (metrics.csv or .hydra/) under {args.sweep}", file=sys.stderr)
        return 2
    out = args.out or args.sweep
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, hide=[h for h in args.hide.split(",") if h])
    if args.outputs:
        rows = [row for row in rows if row.strategy in args.outputs.split(",")]
    if args.num_samples is not None:
        rows = [row for row in rows if row.num_samples in (args.num_samples, None)]
    table = markdown_table(rows, root=args.sweep)
    finished = sum(row.finished for row in rows)
    text = f"# Sweep {args.sweep}\n\n{finished} of {len(rows)} jobs finished.\n\n{table}"
    (out / "summary.md").write_text(text)
    print(table, end="")
    print(f"wrote {out / 'summary.md'}")
    if plot_ppl_vs_samples(rows, out / "ppl_vs_samples.png", args.metric) is None:
        print("no finished job has a perplexity yet: ppl_vs_samples.png not written")
    else:
        print(f"wrote {out / 'ppl_vs_samples.png'}")
    if plot_val_curves(rows, out / "val_curves.png") is None:
        print(f"no validations in {args.sweep} yet: val_curves.png not written")
    else:
        print(f"wrote {out / 'val_curves.png'}")
    offline = offline_wandb_runs(args.sweep)
    if offline:
        print(f"{len(offline)} offline W&B runs; upload them with:\n  wandb sync {' '.join(map(str, offline))}")
    return 0


def offline_wandb_runs(root: str | Path) -> list[Path]:
    """W&B offline run folders under ``root`` (to upload with ``wandb sync``)."""
    return sorted(Path(root).glob("**/wandb/offline-run-*"), key=natural_key)
