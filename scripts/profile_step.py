"""Where one training step's time goes: ``torch.profiler`` over a few ``train_step`` calls, operators by self time.

    python scripts/profile_step.py --output rff --n 1000000 --device cuda --json docs/bench/profile_rff_1e6.json
    python scripts/profile_step.py --output full:output.train_chunk=0 --n 100000 --batch 128x35

The model ``--output`` describes (``NAME[:OVERRIDE...]``, the default model otherwise) is built for a vocabulary of
``--n`` Zipf-distributed classes (no corpus), on ``--device``, as ``scripts/bench_launches.py`` builds it; after
``--warmup`` steps, ``--steps`` steps run under the profiler (on a GPU with CUDA activity: kernel time on the device,
besides the host time of each operator). Printed: wall ms per step, then the operators by their device self time
(CUDA) or host self time (CPU), per step, with their calls per step and share of the step. ``--json`` keeps the
table. Profiling adds host time per operator: the wall time here is not a benchmark (``scripts/bench_gpu.py`` and
``scripts/bench_train.py`` are); the shares say which operators to look at.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from lab.step_fixture import step_fixture
from torch.profiler import ProfilerActivity, profile


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def profile_steps(entry: str, n: int, batch: tuple[int, int], device: str, warmup: int, steps: int) -> dict:
    """The profile of ``steps`` train steps of ``entry`` after ``warmup``: wall ms per step and the operators."""
    name, *extra = entry.split(":")
    fixture = step_fixture([f"output={name}", *extra], n, warmup + steps, batch, device=device)
    state = None
    for window in fixture.batches[:warmup]:
        state = fixture.step(window, state).state
    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for window in fixture.batches[warmup:]:
            state = fixture.step(window, state).state
        synchronize(device)
        wall = time.perf_counter() - start
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events) or 1.0
    ops = [
        {
            "op": e.key,
            "ms_per_step": getattr(e, key) / 1e3 / steps,
            "calls_per_step": e.count / steps,
            "share": getattr(e, key) / total,
        }
        for e in sorted(events, key=lambda e: -getattr(e, key))
    ]
    return {
        "output": entry,
        "n": n,
        "batch": list(batch),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "time": "device self time" if cuda else "host self time",
        "wall_ms_per_step": 1e3 * wall / steps,
        "profiled_ms_per_step": total / 1e3 / steps,
        "ops": ops,
    }


def render(record: dict, top: int) -> str:
    lines = [
        f"{record['output']} at n = {record['n']:,}, batch {record['batch'][0]} x {record['batch'][1]}, "
        f"{record['device']}: {record['wall_ms_per_step']:.2f} ms a step under the profiler, "
        f"{record['profiled_ms_per_step']:.2f} ms of {record['time']}",
        f"{'ms/step':>9} {'share':>6} {'calls':>7}  operator",
    ]
    for op in record["ops"][:top]:
        lines.append(f"{op['ms_per_step']:9.3f} {op['share']:6.1%} {op['calls_per_step']:7.1f}  {op['op']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", action="append", help="NAME[:OVERRIDE...]; repeat for several (default: full)")
    parser.add_argument("--n", type=int, default=10_000, help="vocabulary size")
    parser.add_argument("--batch", default="20x35", help="B x T")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=20, help="operators printed")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, cols = (int(x) for x in args.batch.lower().split("x"))
    records = []
    for entry in args.output or ["full"]:
        record = profile_steps(entry, args.n, (rows, cols), args.device, args.warmup, args.steps)
        print(render(record, args.top), flush=True)
        records.append(record)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"command": " ".join(sys.argv), "records": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
