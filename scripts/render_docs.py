"""Render the tables the docs quote from the project's records, or check that the committed ones match them.

    python scripts/render_docs.py                            rewrite every docs/bench/NAME.md from NAME.json, then
                                                             the rendered blocks of docs/results.md
    python scripts/render_docs.py --bench docs/bench/X.json  the same, and a first table X.md for a new record
    python scripts/render_docs.py --check                    exit 1 if a committed table (a study's, a benchmark's,
                                                             a block of a page) differs from its rendering

A study's own table and plot come from ``python -m lmtrain.study NAME --render``; ``--check`` compares them too.
Benchmark records are written by the scripts beside this one (``scripts/bench_train.py --json``,
``scripts/bench_gpu.py``, ...); the renderers are ``scripts/records/``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from records.bench import render_bench
from records.docs import fill_page, stale_page

from lmtrain.study.render import check
from lmtrain.study.scores_render import check_scores
from lmtrain.study.scores_spec import load_scores, package_scores
from lmtrain.study.spec import load_spec, package_studies

ROOT = Path(__file__).resolve().parents[1]


def bench_tables(bench: Path) -> list[Path]:
    """The benchmark records that have a rendered table beside them (NAME.json with NAME.md)."""
    return [table.with_suffix(".json") for table in sorted(bench.glob("*.md")) if table.with_suffix(".json").is_file()]


def problems(root: Path, pages: list[Path]) -> list[str]:
    """Every committed table that differs from its rendering, with what to run."""
    found = [p for p in (check(load_spec(path), root) for path in package_studies().values()) if p]
    found += [p for p in (check_scores(load_scores(path), root) for path in package_scores().values()) if p]
    found += [p for p in (stale_page(page, root) for page in pages) if p]
    for record in bench_tables(root.parent / "bench"):
        if record.with_suffix(".md").read_text() != render_bench(record):
            found.append(f"{record.with_suffix('.md')} differs from its record: run python scripts/render_docs.py")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/render_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, nargs="*", default=[], help="records to render a first table for")
    parser.add_argument("--check", action="store_true", help="only check the committed tables, write nothing")
    parser.add_argument("--root", type=Path, default=ROOT / "docs" / "study", help="the studies' records and tables")
    parser.add_argument("--pages", type=Path, nargs="*", default=[ROOT / "docs" / "results.md"], help="pages to fill")
    args = parser.parse_args(argv)
    if args.check:
        found = problems(args.root, args.pages)
        for problem in found:
            print(problem, file=sys.stderr)
        if not found:
            print(f"every rendered table under {args.root.parent} matches its records")
        return 1 if found else 0
    records = [*bench_tables(args.root.parent / "bench"), *args.bench]
    for record in dict.fromkeys(path.resolve() for path in records):  # the tables first: the pages quote them
        table, text = record.with_suffix(".md"), render_bench(record)
        if not table.is_file() or table.read_text() != text:
            table.write_text(text)
            print(f"wrote {os.path.relpath(table)}")
    for page in args.pages:
        print(f"{'updated' if fill_page(page, args.root) else 'unchanged'}: {os.path.relpath(page)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
