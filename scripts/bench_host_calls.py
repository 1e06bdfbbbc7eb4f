"""Python function calls per training step: lmtrain's loop against the plain PyTorch loop (host work, counted).

    python scripts/bench_host_calls.py --json docs/bench/host_calls_tiny.json

On a model so small that host time dominates its step (the framework-overhead setting of ``scripts/bench_train.py``:
1x32 LSTM, 1,000 types, batch 20 x 20, one thread), what the framework does around each step decides the speed.
Timing needs a quiet machine; counting does not. Each loop runs once to warm up (imports, caches), then twice under
``cProfile``, for ``--short`` and ``--long`` steps, and the difference of the call counts over the difference of the
steps is the calls of one step in the middle of a run (setup and teardown cancel out). Printed: calls per step of
each loop, their ratio, the calls by whose code runs (lightning, lmtrain, torch, Python's library, builtins) and the
functions with the most calls per step beyond the plain loop's (where the host time goes). Counts vary by a call or
two between runs (Python's own bookkeeping), not with load.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from bench_train import plain_round, round_overrides

from lmtrain.config import compose_config
from lmtrain.run.run import train

TINY = ["model.num_layers=1", "model.hidden_dim=32", "model.emb_dim=32", "data.batch_size=20", "data.bptt=20"]
DATA = "synthetic:1000"


def loop_args(steps: int, extra: list[str]) -> argparse.Namespace:
    """What ``bench_train``'s round helpers read: the experiment, device, threads, overrides and steps."""
    return argparse.Namespace(
        experiment="none", device=None, threads=1, override=[*TINY, *extra], steps=steps, warmup=0, default_malloc=False
    )


def lmtrain_loop(output: str, extra: list[str]) -> Callable[[int], None]:
    def run(steps: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            overrides = round_overrides(output, [], steps, 50, loop_args(steps, extra), Path(tmp), DATA)
            train(compose_config(overrides))

    return run


def plain_loop(extra: list[str]) -> Callable[[int], None]:
    return lambda steps: plain_round(loop_args(steps, extra), DATA)


def package(file: str) -> str:
    """Whose code a profiled function is: lightning, lmtrain, torch, builtins (C functions) or python."""
    if file == "~":
        return "builtins"
    parts = Path(file).parts
    for name in ("lightning", "lightning_utilities", "lmtrain", "torch"):
        if name in parts:
            return "lightning" if name.startswith("lightning") else name
    return "python"


def calls(run: Callable[[int], None], steps: int) -> dict[tuple[str, str], int]:
    """Calls of each function ((package, ``file:line name``)) in one profiled run of ``steps`` steps."""
    profile = cProfile.Profile()
    profile.enable()
    run(steps)
    profile.disable()
    counts: dict[tuple[str, str], int] = {}
    for (file, line, name), row in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        key = (package(file), f"{Path(file).name}:{line} {name}")  # short names can coincide: added up
        counts[key] = counts.get(key, 0) + row[1]
    return counts


def per_step(run: Callable[[int], None], short: int, long: int) -> dict[tuple[str, str], float]:
    """Calls per step of each function: (calls in ``long`` steps - calls in ``short`` steps) / (long - short)."""
    run(short)  # imports and caches filled once, outside the counts
    few, many = calls(run, short), calls(run, long)
    return {key: (count - few.get(key, 0)) / (long - short) for key, count in many.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="full", help="lmtrain's output strategy")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for both loops")
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=300)
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lm = per_step(lmtrain_loop(args.output, args.override), args.short, args.long)
    plain = per_step(plain_loop(args.override), args.short, args.long)
    total_lm, total_plain = sum(lm.values()), sum(plain.values())
    extra = {key: count - plain.get(key, 0.0) for key, count in lm.items()}
    top = sorted(extra.items(), key=lambda item: -item[1])[: args.top]
    print(f"calls per step: lmtrain {args.output} {total_lm:,.0f}, plain loop {total_plain:,.0f}")
    print(f"lmtrain / plain: {total_lm / total_plain:.2f}")
    by_package = {
        side: {
            name: round(sum(v for (p, _), v in counts.items() if p == name), 1)
            for name in sorted({p for p, _ in counts})
        }
        for side, counts in (("lmtrain", lm), ("plain", plain))
    }
    for side, packages in by_package.items():
        print(
            f"{side} loop, calls per step by whose code runs: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in packages.items())
        )
    print("most calls per step beyond the plain loop's:")
    for (owner, key), count in top:
        print(f"  {count:8.1f}  {owner:<9} {key}")
    record = {
        "command": "python scripts/bench_host_calls.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "setting": {"model": TINY, "data": DATA, "output": args.output, "steps": [args.short, args.long]},
        "calls_per_step": {"lmtrain": round(total_lm, 1), "plain": round(total_plain, 1)},
        "lmtrain_over_plain": round(total_lm / total_plain, 3),
        "by_package": by_package,
        "top_beyond_plain": {f"{owner} {key}": round(count, 2) for (owner, key), count in top},
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
