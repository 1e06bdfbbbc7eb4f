"""Mutation score of the estimator code from a random sample of its mutants, with a 95% confidence interval.

mutmut (configured in pyproject.toml under ``[tool.mutmut]``) makes ~4,000 mutants of lmtrain/output/sampled/,
lmtrain/sampler/ and lmtrain/output/hsm*.py; checking all of them takes hours on a 2-core machine. This script
generates them, draws ``--count`` names uniformly at random (``--seed``), has ``mutmut run NAME...`` check exactly
those, and reports killed / survived / no tests with the Wilson interval of the killed share::

    python scripts/mutation_sample.py --count 80 --seed 0 --json docs/bench/mutation_sample.json

After a survivor has been rechecked on its own (``mutmut run NAME``), ``--report`` rewrites the record from the
results mutmut keeps in mutants/, without running the sample again.

Surviving names are listed so that each can be read (``mutmut show NAME``) and called equivalent or not; the
score over non-equivalent mutants is killed / (sampled - equivalent). Run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from pathlib import Path


def generate() -> None:
    """Write mutants/ (the mutated copies and their .meta files) without running any test."""
    from mutmut.__main__ import create_mutants, store_lines_covered_by_tests
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    store_lines_covered_by_tests()
    create_mutants(2)


def exit_codes() -> dict[str, int | None]:
    """Every mutant's name and last exit code (None: not checked), read from mutants/**/*.meta."""
    codes: dict[str, int | None] = {}
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial share k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=80, help="mutants to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-children", type=int, default=1, help="mutmut's parallel test processes")
    parser.add_argument("--json", type=Path, help="write the sample and its results here")
    parser.add_argument("--report", action="store_true", help="report the sample's last results, run nothing")
    args = parser.parse_args()

    generate()
    names = sorted(exit_codes())
    sample = sorted(random.Random(args.seed).sample(names, min(args.count, len(names))))
    print(f"{len(names)} mutants; a sample of {len(sample)} drawn with seed {args.seed}", flush=True)
    if not args.report:
        mutmut = ["mutmut", "run", "--max-children", str(args.max_children), *sample]
        subprocess.run(mutmut, check=False)
    codes = exit_codes()
    from mutmut.stats import status_by_exit_code  # mutmut's own reading of its exit codes

    status = {name: status_by_exit_code[codes.get(name)] for name in sample}
    counts = {s: sum(v == s for v in status.values()) for s in sorted(set(status.values()))}
    killed, checked = counts.get("killed", 0), len(sample) - counts.get("not checked", 0)
    low, high = wilson(killed, checked)
    print(f"killed {killed} of {checked} checked ({killed / max(checked, 1):.1%}; 95% CI {low:.1%}-{high:.1%})")
    for name, s in status.items():
        if s != "killed":
            print(f"  {s}: {name}")
    if args.json:
        record = {
            "total_mutants": len(names),
            "seed": args.seed,
            "counts": counts,
            "killed_share": killed / max(checked, 1),
            "ci95": [low, high],
            "status": status,
            "command": " ".join(["python scripts/mutation_sample.py", *sys.argv[1:]]),
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    sys.exit(0 if checked == len(sample) else 1)


if __name__ == "__main__":
    main()
