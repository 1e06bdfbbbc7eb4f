"""`python -m lmtrain.study`: run, render, list and check the declared studies.

    python -m lmtrain.study NAME [--jobs 2] [--limit N] [--cells GLOB]   run NAME's runs that have no record yet,
                                                          then render
    python -m lmtrain.study NAME --render                 write docs/study/NAME/table.md and plot.png from records
    python -m lmtrain.study NAME --dry-run                print the commands of the pending runs
    python -m lmtrain.study list [--cells]                every study: cells, seeds per cell, runs recorded
                                                          (--cells: every declared cell with its seeds)
    python -m lmtrain.study --bench docs/bench/X.json     render a bench_train or bench_gpu record as docs/bench/X.md
    python -m lmtrain.study --docs                        refresh the tables quoted in docs/results.md
    python -m lmtrain.study --check                       exit 1 if a committed table differs from its rendering

NAME is a study of the package (conf/study/NAME.yaml) or the path of a user's own study YAML file.
Records go to ROOT/NAME/records.jsonl (``--root``, default docs/study), run folders to runs/study/NAME. A run
that another study's record already measured (same resolved config, paths aside, same device kind) takes a copy of
that record instead of training (``--no-reuse``: train it anyway).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmtrain.study.bench import render_bench, write_bench
from lmtrain.study.docs import fill_page, stale_page
from lmtrain.study.records import read_records
from lmtrain.study.render import check, render
from lmtrain.study.reuse import reusable
from lmtrain.study.runner import command, pending_runs, records_path, run_overrides, run_study, training_folder
from lmtrain.study.spec import StudyError, find_spec, load_spec, package_studies


def _list(root: Path, cells: bool = False) -> int:
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
    return 0


def _check(root: Path, pages: list[Path]) -> int:
    problems = [p for p in (check(load_spec(path), root) for path in package_studies().values()) if p]
    problems += [p for p in (stale_page(page, root) for page in pages) if p]
    for table in sorted((root.parent / "bench").glob("*.md")):  # rendered benchmark tables
        record = table.with_suffix(".json")
        if record.is_file() and table.read_text() != render_bench(record):
            problems.append(f"{table} differs from its record: run python -m lmtrain.study --bench {record}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"every rendered table under {root} matches its records")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmtrain.study", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a study name, `list`, or the path of a study YAML file")
    parser.add_argument("--render", action="store_true", help="only write table.md and plot.png from the records")
    parser.add_argument("--check", action="store_true", help="check every committed table against its records")
    parser.add_argument("--bench", type=Path, nargs="*", help="render these bench_train or bench_gpu records (NAME.md)")
    parser.add_argument("--docs", action="store_true", help="refresh the study tables quoted in the --pages")
    parser.add_argument("--pages", type=Path, nargs="*", default=[Path("docs/results.md")], help="pages quoting tables")
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
    parser.add_argument("--no-reuse", action="store_true", help="train runs that another study's record measured")
    parser.add_argument("--root", type=Path, default=Path("docs/study"), help="where records and tables go")
    parser.add_argument("--runs", type=Path, default=Path("runs/study"), help="where the run folders go")
    args = parser.parse_args(argv)
    if args.bench:
        for path in args.bench:
            print(f"wrote {write_bench(path)}")
        return 0
    if args.check:
        return _check(args.root, args.pages)
    if args.docs:
        for page in args.pages:
            print(f"{'updated' if fill_page(page, args.root) else 'unchanged'}: {page}")
        return 0
    if args.name in (None, "list"):
        return _list(args.root, cells=args.cells is not None)
    try:
        spec = find_spec(args.name)
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
