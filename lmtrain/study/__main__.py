"""`python -m lmtrain.study`: run, render and list the declared studies.

    python -m lmtrain.study NAME [--jobs 2] [--limit N] [--cells GLOB]   run NAME's runs that have no record yet,
                                                          then render
    python -m lmtrain.study NAME --render                 write docs/study/NAME/table.md and plot.png from records
    python -m lmtrain.study NAME --dry-run                print the commands of the pending runs
    python -m lmtrain.study list [--cells]                every study: cells, seeds per cell, runs recorded
                                                          (--cells: every declared cell with its seeds)

A scoring study (a ``scores`` block in place of the grid, ``lmtrain.study.scores``) runs, renders and dry-runs the
same way: python -m lmtrain.score over another study's trained runs, one record per (run, mode); ``--runs`` (or
``--runs-root``) is where those runs' folders are, and ``--train-missing`` first trains again the recorded runs whose
folders are gone (``lmtrain.study.retrain``).

NAME is a study of the package (conf/study/NAME.yaml) or the path of a user's own study YAML file.
Records go to ROOT/NAME/records.jsonl (``--root``, default docs/study), run folders to runs/study/NAME. A run
that another study's record already measured (same resolved config, paths aside, same device kind) takes a copy of
that record instead of training (``--no-reuse``: train it anyway). The project's own docs (the benchmark tables,
docs/results.md) are rendered, and checked against the records, by ``python scripts/render_docs.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmtrain.study.records import read_records
from lmtrain.study.render import render
from lmtrain.study.retrain import retrain_missing
from lmtrain.study.reuse import reusable
from lmtrain.study.runner import command, pending_runs, records_path, run_overrides, run_study, training_folder
from lmtrain.study.scores import dry_run, listing, run_scores
from lmtrain.study.scores_render import render_scores
from lmtrain.study.scores_spec import ScoreSpec, find_scores, load_scores, package_scores
from lmtrain.study.spec import StudyError, find_spec, load_spec, package_studies


def _list(root: Path, cells: bool = False, runs_root: Path = Path("runs/study")) -> int:
    for name, path in sorted(package_studies().items()):
        spec = load_spec(path)
        keys = {record["key"] for record in read_records(records_path(spec, root))}
        declared = {run.key for run in spec.runs()}
        total = len(declared)
        counts = sorted({len(spec.seeds_of(cell)) for cell in spec.cells})
        seeds = "-".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts)) + " seeds"
        print(f"{name:<22} {len(spec.cells):>3} cells x {seeds:<8} {len(keys & declared):>4}/{total:<4} recorded  ")
        print(f"{'':<22} {spec.description}")
        for cell in spec.cells if cells else []:  # every declared cell: its seeds, and those recorded
            own = spec.seeds_of(cell)
            done = [s for s in own if f"{cell.label},seed={s}" in keys]
            print(f"{'':<4}{cell.label:<60} seeds {','.join(map(str, own)):<8} recorded {len(done)}/{len(own)}")
    for path in sorted(package_scores().values()):
        print(listing(load_scores(path), root, runs_root))
    return 0


def _scores(spec: ScoreSpec, args: argparse.Namespace) -> int:
    """A scoring study: dry-run, run what is not recorded, render."""
    if args.dry_run:
        print("\n".join(dry_run(spec, args.root, args.runs, args.cells, args.limit)))
        return 0
    if not args.render:
        if args.train_missing:
            retrain_missing(spec, args.root, args.runs, args.cells, args.jobs)
        run_scores(spec, args.root, args.runs, args.jobs, args.limit, args.cells)
    for path in render_scores(spec, args.root):
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmtrain.study", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a study name, `list`, or the path of a study YAML file")
    parser.add_argument("--render", action="store_true", help="only write table.md and plot.png from the records")
    parser.add_argument("--dry-run", action="store_true", help="print the pending runs' commands, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once (threads=auto shares the cores)")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many pending runs")
    parser.add_argument(
        "--cells",
        nargs="?",
        const="*",
        default=None,
        help="only the cells whose label matches this glob ('output=rff*'); with `list`: show every cell and its seeds",
    )
    parser.add_argument(
        "--train-missing",
        action="store_true",
        help="a scoring study: first train again the source runs whose folders are gone (checked against records)",
    )
    parser.add_argument("--no-reuse", action="store_true", help="train runs that another study's record measured")
    parser.add_argument("--root", type=Path, default=Path("docs/study"), help="where records and tables go")
    parser.add_argument("--runs", "--runs-root", type=Path, default=Path("runs/study"), help="where run folders go")
    args = parser.parse_args(argv)
    if args.name in (None, "list"):
        return _list(args.root, cells=args.cells is not None, runs_root=args.runs)
    try:
        scoring = find_scores(args.name)
        if scoring is not None:
            return _scores(scoring, args)
        spec = find_spec(args.name)
        if args.train_missing:
            raise StudyError(f"--train-missing retrains a scoring study's source runs; {spec.name} trains its own")
    except StudyError as err:
        print(f"lmtrain.study: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        pending = pending_runs(spec, args.root, args.cells)
        found = {} if args.no_reuse else reusable(spec, pending, args.root, lambda run: run_overrides(spec, run))
        for run in [run for run in pending if run.key in found]:
            print(f"# {run.key}: would reuse {found[run.key]['study']}'s record {found[run.key]['key']}")
        for run in [run for run in pending if run.key not in found][: args.limit]:
            print(" ".join(command(spec, run, training_folder(spec, run, args.runs))[1:]))
        return 0
    if not args.render:
        run_study(spec, args.root, args.runs, args.jobs, args.limit, args.cells, reuse=not args.no_reuse)
    for path in render(spec, args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
