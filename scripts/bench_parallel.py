"""Two training jobs at once on this machine against one job alone: do parallel jobs share the cores well?

    python scripts/bench_parallel.py --json parallel.json [--steps 300] [--override output=uniform ...]

Runs, one after another, as separate `python -m lmtrain` processes (each its own torch runtime, as in a sweep):
1. one job alone (`threads=auto`: every usable core);
2. two jobs at once through the joblib launcher (`hydra/launcher=joblib hydra.launcher.n_jobs=2`), `threads=auto`,
   so each takes half of the cores;
3. with `--contrast`, the same two jobs with `threads=<all cores>` each (what every process did before
   `threads=auto`): oversubscribed.
Each job's throughput is its total tokens over total time after `--warmup` steps (from the `tokens_per_sec` values
in its metrics.csv). Reported: the alone rate, each parallel job's rate, and the summed parallel rate over the alone
rate (the target is at least 0.8). Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lmtrain.process.threads import usable_cores
from lmtrain.tools.run_records import training_throughput


def launch(args: argparse.Namespace, extra: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.setdefault("WANDB_MODE", "disabled")
    common = [
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=10",
        "++trainer.limit_val_batches=0",
        "test_after_fit=false",
        "logger=csv",
        "progress_bar=false",
        "checkpoint_every_n_steps=1000000000",
        *args.override,
    ]
    flags = [a for a in extra if a.startswith("-")]  # Hydra's flags (-m) come before the overrides
    command = [sys.executable, "-m", "lmtrain", *flags, *common, *(a for a in extra if not a.startswith("-"))]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_parallel: {' '.join(command[2:])} failed:\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--override", action="append", default=[], help="Hydra override for every job (repeatable)")
    parser.add_argument("--contrast", action="store_true", help="also run two jobs with all cores each")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cores = usable_cores()
    result: dict = {"cores": cores, "steps": args.steps, "overrides": args.override}
    with tempfile.TemporaryDirectory() as tmp:
        launch(args, [f"hydra.run.dir={tmp}/alone"])
        result["alone"] = training_throughput(Path(tmp) / "alone", args.warmup)
        modes = {"auto": "threads=auto"} | ({"oversubscribed": f"threads={cores}"} if args.contrast else {})
        for mode, threads in modes.items():
            sweep = Path(tmp) / mode
            pair = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2", threads]
            launch(args, [*pair, f"hydra.sweep.dir={sweep}"])
            rates = [training_throughput(sweep / str(job), args.warmup) for job in (0, 1)]
            result[mode] = {"jobs": rates, "sum": sum(rates), "sum_over_alone": sum(rates) / result["alone"]}
    print(f"cores {cores}; one job alone: {result['alone']:,.0f} tokens/s")
    for mode in modes:
        jobs = ", ".join(f"{r:,.0f}" for r in result[mode]["jobs"])
        print(f"two jobs, threads {mode}: {jobs} tokens/s; sum / alone = {result[mode]['sum_over_alone']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
