"""Training throughput of this tree against another checkout of lmtrain, in alternating rounds, one process each.

    git worktree add /tmp/old d4661c8
    python scripts/bench_before_after.py --old /tmp/old --rounds 3 --json docs/bench/redesign_before_after.json

Each round runs ``scripts/bench_train.py --rounds 1`` of the OLD tree and then of this one (each with its own tree
first on PYTHONPATH, so each imports its own lmtrain), alternating old, new, old, new, ...; so both sides see the
same drift of a shared machine. Prints the median tokens/s per strategy and side and the ratio new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

NEW = Path(__file__).resolve().parents[1]


def one_round(tree: Path, outputs: str, args: argparse.Namespace) -> dict[str, float]:
    """tokens/s per output from one bench_train.py round run in ``tree`` with ``tree``'s lmtrain."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "round.json"
        command = [sys.executable, "scripts/bench_train.py", "--experiment", args.experiment, "--isolate"]
        command += ["--threads", str(args.threads), "--rounds", "1", "--no-plain", "--steps", str(args.steps)]
        command += ["--outputs", outputs, "--json", str(out), "--warmup", str(args.warmup)]
        command += [*(["--data", args.data] if args.data else []), *(f"--steps-for={s}" for s in args.steps_for)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
        subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        record = json.loads(out.read_text())
        corpora = record.get("corpora")  # one --data corpus: its table is the record's own
        return record["tokens_per_sec"] if corpora is None else next(iter(corpora.values()))["tokens_per_sec"]


def git_head(tree: Path) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return head.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--outputs", default="full,unigram,rff,rff:++output.shared_negatives=true")
    parser.add_argument("--experiment", default="none")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--data", help="one corpus, as bench_train.py's --data (ptb, zipf:N); default its own")
    parser.add_argument("--steps-for", action="append", default=[], help="as bench_train.py's (repeatable)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    rounds: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for side, tree in (("old", args.old.resolve()), ("new", NEW)):
            rounds[side].append(one_round(tree, args.outputs, args))
            print(f"round {r} {side}: " + ", ".join(f"{k} {v:,.0f}" for k, v in rounds[side][-1].items()), flush=True)
    names = list(rounds["new"][0])
    median = {side: {k: statistics.median(x[k] for x in rounds[side]) for k in names} for side in rounds}
    ratio = {k: median["new"][k] / median["old"][k] for k in names}
    print(f"{'output':<40} {'old tok/s':>10} {'new tok/s':>10} {'new/old':>8}")
    for k in names:
        print(f"{k:<40} {median['old'][k]:>10,.0f} {median['new'][k]:>10,.0f} {ratio[k]:>8.3f}")
    if args.json:
        record = {
            "what": f"tokens/s of this tree against {args.old}, alternating rounds, one process per cell",
            "command": " ".join(["python scripts/bench_before_after.py", *sys.argv[1:]]),
            "old_commit": git_head(args.old),
            "new_commit": git_head(NEW),
            "threads": args.threads,
            "steps": args.steps,
            "experiment": args.experiment,
            "data": args.data,
            "rounds": rounds,
            "median_tokens_per_sec": median,
            "new_over_old": ratio,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
