"""Time one training step (forward + backward + clip + optimizer step + hook) of every output strategy.

    python scripts/bench_output.py [--outputs full,uniform,...] [--sizes 10000,100000,1000000] [--json PATH]
    python scripts/bench_output.py --quick            # small sizes, few repeats (smoke test)
    python scripts/bench_output.py --kernel [...]     # delegate to scripts/bench_kernel.py

Each strategy is composed from the config tree (``output=<name>`` plus any ``--override``) and built the
way the app builds it (sampler, then output, with num_classes / dim / Zipf-like counts). Beside them, in
the same process, the plain-PyTorch sampled softmax a user would write (gather W[ids], dense gradient,
dense SGD step over all of W) is timed as a reference; ``full`` is the other reference. Reports the
median and IQR over repeats, and ratios: plain / X, full / X, and X(largest n) / X(smallest n).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.config import choices, compose_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output_table import print_table, report  # noqa: E402  (this folder's module, also when imported)

DEFAULT_OUTPUTS = ["full", "uniform", "unigram", "exp", "nce", "negative"]
OPTIONAL_OUTPUTS = ["quadratic", "rff", "hsm", "adaptive"]
PLAIN = "plain_sampled"  # name of the plain-PyTorch reference in the results
REFERENCE = "uniform"  # the lmtrain strategy the targets are about


def zipf_counts(n: int, tokens: float = 1e7) -> Tensor:
    """Zipf-like training counts (count_i ∝ 1 / (i + 1)), vocabulary in descending frequency order."""
    return (tokens / torch.arange(1, n + 1, dtype=torch.float64)).floor().long()


@functools.cache
def compose_output(name: str, overrides: tuple[str, ...], num_samples: int | None) -> Any:
    """The full app config with ``output=name`` (the data group is dropped: no corpus is needed here), in a CPU's
    step forms (the step runs on the CPU; ``step_forms=gpu`` among the overrides times a GPU's forms there)."""
    cfg = compose_config(["~data", "trainer.accelerator=cpu", f"output={name}", *overrides])
    if num_samples is not None and "num_samples" in cfg.output:
        cfg.output.num_samples = num_samples
    return cfg


def time_steps(step: Callable[[], None], warmup: int, repeats: int, budget_s: float) -> list[float]:
    """Seconds per call after up to ``warmup`` calls (at least one); slow cells get fewer repeats (>= 3)."""
    start, calls = time.perf_counter(), 0
    while calls < max(warmup, 1) and (calls == 0 or time.perf_counter() - start < budget_s / 4):
        step()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    repeats = max(3, min(repeats, int(budget_s / max(per_call, 1e-9))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def lmtrain_step(output: nn.Module, hidden: Tensor, target: Tensor, optim: str, lr: float) -> Callable[[], None]:
    from lmtrain.training.optim import build_optimizer
    from lmtrain.training.step import after_update, clip_gradients

    sparse = output.sparse_parameters()
    sparse_ids = {id(p) for p in sparse}
    dense = [p for p in output.parameters() if id(p) not in sparse_ids]
    optimizer = build_optimizer(optim, dense, sparse, lr=lr)
    params = [hidden, *output.parameters()]

    def step() -> None:
        loss = output.loss(hidden, target)
        loss.backward()
        clip_gradients(params, 5.0)
        optimizer.step()
        after_update(output)
        optimizer.zero_grad(set_to_none=True)
        hidden.grad = None

    return step


def plain_step(n: int, dim: int, m: int, hidden: Tensor, target: Tensor, lr: float) -> Callable[[], None]:
    """The sampled softmax a user would write: W[ids] gathers, dense gradients, dense SGD over all of W."""
    weight = nn.Parameter(torch.empty(n, dim).uniform_(-0.1, 0.1))
    bias = nn.Parameter(torch.zeros(n))
    optimizer = torch.optim.SGD([weight, bias], lr=lr)
    correction = math.log(m / n)  # uniform proposal: ln(m q)

    def step() -> None:
        ids = torch.randint(n, (m,))
        target_logit = (hidden * weight[target]).sum(1) + bias[target]  # (N,)
        sampled = hidden @ weight[ids].T + bias[ids] - correction  # (N, m)
        sampled = sampled.masked_fill(ids.unsqueeze(0) == target.unsqueeze(1), float("-inf"))
        logits = torch.cat([target_logit.unsqueeze(1), sampled], dim=1)  # (N, 1 + m)
        loss = F.cross_entropy(logits, torch.zeros_like(target))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([hidden, weight, bias], 5.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        hidden.grad = None

    return step


def summarize(name: str, n: int, times: list[float]) -> dict[str, Any]:
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    median = statistics.median(times)
    return dict(output=name, n=n, median_s=median, iqr_s=q3 - q1, repeats=len(times), times_s=times)


def make_step(name: str, n: int, args: argparse.Namespace) -> Callable[[], None]:
    """One training step of output ``name`` (or the plain reference) at vocabulary size n; same data per n."""
    gen = torch.Generator().manual_seed(args.seed + n)
    counts = zipf_counts(n)
    target = torch.multinomial(counts.double(), args.positions, replacement=True, generator=gen)  # (N,)
    hidden = (0.1 * torch.randn(args.positions, args.dim, generator=gen)).requires_grad_()  # (N, d)
    if name == PLAIN:
        return plain_step(n, args.dim, args.num_samples, hidden, target, args.lr)
    from lmtrain.run.build import build_output

    output = build_output(compose_output(name, tuple(args.override), args.num_samples), n, args.dim, counts)
    return lmtrain_step(output, hidden, target, args.optim, args.lr)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if any("=" not in item for item in args.limit):
        raise ValueError(f"--limit takes NAME=MAX_N (e.g. exp=100000), got {args.limit}")
    extra = {name: int(float(value)) for name, _, value in (item.partition("=") for item in args.limit)}
    limits = {"full": args.max_full_n, "exp": args.max_exp_n, **extra}
    results: list[dict[str, Any]] = []
    torch.manual_seed(args.seed)
    for n in args.sizes:
        for name in [PLAIN, *args.outputs]:
            if n > limits.get(name, n):
                print(f"  skip {name} at n={n} (above its limit {limits[name]})", flush=True)
                continue
            step = make_step(name, n, args)
            row = summarize(name, n, time_steps(step, args.warmup, args.repeats, args.budget))
            results.append(row)
            print(
                f"  {name:>14} n={n:<8d} {1e3 * row['median_s']:10.3f} ms  (IQR {1e3 * row['iqr_s']:.3f})",
                flush=True,
            )
            del step
            if n >= 10**5:  # free the big matrices before the next cell
                gc.collect()
    return results


def interleaved_scaling(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """X(largest n) / X(smallest n) with steps alternating between the two, so machine-load drift cancels."""
    sizes = (min(args.sizes), max(args.sizes))
    steps = [make_step(name, n, args) for n in sizes]
    for step in steps * max(args.warmup, 1):
        step()
    times: list[list[float]] = [[], []]
    for _ in range(args.repeats):
        for step, bucket in zip(steps, times, strict=True):
            t0 = time.perf_counter()
            step()
            bucket.append(time.perf_counter() - t0)
    low, high = (statistics.median(t) for t in times)
    print(f"  {name:>14} interleaved n={sizes[1]} / n={sizes[0]}: {high / low:.2f}", flush=True)
    return {"sizes": list(sizes), "median_s": [low, high], "ratio": high / low, "repeats": args.repeats}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--outputs", type=lambda s: s.split(","), help="output configs (default: core six + extras)")
    add("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")], help="n (default 1e4,1e5,1e6)")
    add("--positions", type=int, default=700, help="N hidden states per step (batch 20 x bptt 35)")
    add("--dim", type=int, default=200, help="hidden size d")
    add("--num-samples", type=int, default=100, help="m negatives (set on outputs that take it)")
    add("--repeats", type=int, help="timed steps per cell (default 30; --quick 5)")
    add("--warmup", type=int, help="untimed steps first (default 3; --quick 1)")
    add("--budget", type=float, default=20.0, help="seconds per cell; slow cells get fewer repeats (>= 3)")
    add("--max-full-n", type=int, default=10**6, help="skip output=full above this n")
    add("--max-exp-n", type=int, default=10**5, help="skip output=exp (O(nd) sampling) above this n")
    add("--limit", action="append", default=[], help="NAME=MAX_N: skip output NAME above MAX_N")
    add(
        "--scaling-outputs",
        type=lambda s: [x for x in s.split(",") if x],
        default=[REFERENCE],
        help="outputs whose largest/smallest-n ratio is also timed interleaved (default uniform; '' = none)",
    )
    add("--override", action="append", default=[], help="extra Hydra override, e.g. output.unique=true")
    add("--optim", default="sgd", help="optimizer name for lmtrain.training.optim.build_optimizer")
    add("--lr", type=float, default=0.01)
    add("--seed", type=int, default=0)
    add("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    add("--quick", action="store_true", help="sizes 1e3,1e4 and few repeats (smoke test)")
    add("--json", type=Path, help="write all results to this JSON file")
    add("--kernel", action="store_true", help="run scripts/bench_kernel.py with the other arguments")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any] | int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--kernel" in argv:
        kernel = Path(__file__).with_name("bench_kernel.py")
        if not kernel.is_file():
            raise SystemExit(f"--kernel needs {kernel}, which does not exist yet")
        sys.path.insert(0, str(kernel.parent))
        import bench_kernel  # type: ignore[import-not-found]

        return bench_kernel.main([a for a in argv if a != "--kernel"])
    args = parser().parse_args(argv)
    if args.outputs is None:
        args.outputs = DEFAULT_OUTPUTS + [o for o in OPTIONAL_OUTPUTS if o in choices("output")]
    args.sizes = sorted(args.sizes or ([10**3, 10**4] if args.quick else [10**4, 10**5, 10**6]))
    args.repeats = args.repeats or (5 if args.quick else 30)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"N={args.positions} d={args.dim} m={args.num_samples} n={args.sizes}", end=" ")
    print(f"threads={torch.get_num_threads()}")
    results = run(args)
    scaling = {name: interleaved_scaling(name, args) for name in args.scaling_outputs if len(args.sizes) > 1}
    data = report(results, scaling, args, plain=PLAIN, reference=REFERENCE)
    print_table(data)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2, default=str))
        print(f"\nwrote {args.json}")
    return data


if __name__ == "__main__":
    main()
