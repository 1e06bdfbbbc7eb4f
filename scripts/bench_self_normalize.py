"""Time one training step of ``output=full`` with self-normalization at several ``normalize_fraction`` values, side by
side in one process (steps interleaved round by round, so machine-load drift falls on every variant alike).

    python scripts/bench_self_normalize.py [--n 100000] [--alpha 0.1] [--fractions 1,0.5,0.1] [--json PATH]

The variants are the plain full softmax (``self_normalize=0``) and ``self_normalize=ALPHA`` with each fraction
(1: every position computes Z). Each step is ``scripts/bench_output.py``'s (forward, backward, clipping, SGD step,
after-step hook) on the same hidden states and Zipf-drawn targets. Prints the median milliseconds per step, the IQR
and the ratio to the plain full softmax.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import compose_output, lmtrain_step, zipf_counts  # noqa: E402  (this folder's module)
from lab.provenance import write_record  # noqa: E402

from lmtrain.run.build import build_output  # noqa: E402


def variants(alpha: float, fractions: list[float]) -> dict[str, tuple[str, ...]]:
    """label -> the overrides of ``output=full``."""
    found = {"full": ()}
    for fraction in fractions:
        found[f"alpha={alpha} gamma={fraction}"] = (
            f"output.self_normalize={alpha}",
            f"output.normalize_fraction={fraction}",
        )
    return found


def environment(device: torch.device) -> dict[str, str | int]:
    """torch's version, the device's name, the CPU's model and torch's threads, for the record."""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo() if line.startswith("model name")), "")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    threads = torch.get_num_threads()
    return {"torch": torch.__version__, "device": name, "cpu": cpu or platform.processor(), "threads": threads}


def cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=lambda s: int(float(s)), default=10**5, help="classes")
    p.add_argument("--positions", type=int, default=700, help="N positions per step (batch 20 x bptt 35)")
    p.add_argument("--dim", type=int, default=200)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.5, 0.1])
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (one step of every variant each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.n)
    counts = zipf_counts(args.n)
    target = torch.multinomial(counts.double(), args.positions, replacement=True, generator=gen).to(device)  # (N,)
    hidden = (0.1 * torch.randn(args.positions, args.dim, generator=gen)).to(device).requires_grad_()  # (N, d)
    torch.manual_seed(0)
    steps = {}
    for label, overrides in variants(args.alpha, args.fractions).items():
        output = build_output(compose_output("full", overrides, None), args.n, args.dim, counts).to(device)
        steps[label] = lmtrain_step(output, hidden, target, "sgd", 0.01)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(args.repeats):
        for label, step in steps.items():
            sync()
            start = time.perf_counter()
            step()
            sync()
            times[label].append(time.perf_counter() - start)
    plain = statistics.median(times["full"])
    print(f"n={args.n} N={args.positions} d={args.dim} threads={torch.get_num_threads()} device={device}")
    rows = []
    for label, values in times.items():
        q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        median = statistics.median(values)
        rows.append(
            {
                "variant": label,
                "median_ms": 1e3 * median,
                "iqr_ms": 1e3 * (q3 - q1),
                "vs_full": median / plain,
                "times_ms": [1e3 * t for t in values],
            }
        )
        print(f"  {label:>24} {1e3 * median:10.1f} ms (IQR {1e3 * (q3 - q1):.1f})  {median / plain:.2f}x full")
    data = {
        "command": "python scripts/bench_self_normalize.py " + " ".join(argv or sys.argv[1:]),
        "environment": environment(device),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
    }
    if args.json is not None:
        write_record(args.json, data)
    return data


if __name__ == "__main__":
    main()
