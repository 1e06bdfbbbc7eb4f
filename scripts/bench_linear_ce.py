"""The full softmax's training loss alone (forward + backward of the output layer): lmtrain's chunked exact
cross-entropy beside torch's ``F.linear_cross_entropy`` (chunked) and the dense ``F.cross_entropy(F.linear(...))``.

    python scripts/bench_linear_ce.py --sizes 100000,1000000 --repeats 5 --threads 1 --json linear_ce.json
    python scripts/bench_linear_ce.py --sizes 20000 --repeats 1      # smoke test (timings meaningless)

The inputs are those of ``output=full``'s loss at a batch of 20 x 35: hidden (N, d) = (700, 200) requiring grad,
weight (n, d) and bias (n,) (leaves requiring grad, as the layer's parameters) and N targets. The variants:

- ``lmtrain``: the hand-written form, ``chunked_softmax_nll(...).mean()``, at the vocabulary chunk ``output=full``
  picks by default on a CPU (``FullSoftmax.loss_chunk``: the most classes whose (N, chunk) float32 logits fit
  ``logits_mib``);
- ``torch_auto``: ``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())``, torch's defaults (it
  chunks the batch rows, not the classes: each chunk's logits are (rows, n));
- ``torch_aspect``: ``chunking_method="aspect_ratio"`` (rows whose (rows, n) logits match the (N, d) input);
- ``torch_budget``: ``batch_chunk_size`` = the rows whose (rows, n) float32 logits fit lmtrain's ``logits_mib``,
  the same logits memory as lmtrain's chunk (``budget_rows``: the form ``exact_softmax_nll`` trains with where
  ``takes_torch_linear_ce`` takes torch's op); ``torch_budget_none``: the same rows with ``reduction="none"`` and
  the mean taken after (the per-row losses that ``position_nll``, mos and adaptive's tails ask for: torch's
  backward then recomputes the chunks); ``--torch-rows 128,700`` adds ``torch_rows:R`` variants;
- ``dense``: ``F.cross_entropy(F.linear(...))`` where its (N, n) float32 logits take at most ``--dense-max-mib``
  (its peak is about three times that).
A torch variant whose resolved settings equal an earlier one's at a size is left out there (noted in the table).

Every measurement runs in a child process of its own, rounds interleaved (every variant once, then again), under
lmtrain's allocator setting (``reuse_freed_memory``; ``--default-malloc`` keeps glibc's) and flushed subnormals, as
a training run has them. A child times ``--calls`` forward + backward calls after ``--warmup`` (a call slower than
``--slow-s`` is itself the measurement: no warm-up; torch's op imports ``torch._dynamo`` on its first call in a
process, which the warm-up leaves out); gradients are set to None before each call, as ``zero_grad`` does. Reported:
the median seconds over all timed calls of all rounds, the ratio to ``lmtrain``, the child's peak resident set
(``ru_maxrss``: Python, torch and the inputs included) and that peak over the ``inputs`` child's (the inputs and
their three gradients allocated, no loss computed): the loss's own working memory.

Exactness, in this process at ``--check-classes`` (default 20000) classes, N and d as above: the loss and the
gradients wrt hidden, weight and bias of every variant (all of them, whatever ``--variants`` times) against a
float64 dense reference on the same inputs (rounded as the variant received them), as max abs and max abs / max
|reference| ("rel"), in four precisions: ``32`` (float32), ``64`` (float64, ``trainer.precision=64-true``),
``bf16-mixed`` (CPU autocast, float32 hidden: the CPU form, whose LSTM runs in float32) and ``bf16-hidden``
(autocast, bfloat16 hidden and float32 parameters: the form a GPU LSTM hands the output layer under autocast). There
each chunked variant's chunk is capped so that it loops over at least three chunks. ``--support`` adds small probes
of what the chunked path of ``linear_cross_entropy`` accepts (reductions, tied and sparse weights, a second
backward, autocast).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import resource
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.output.chunked_softmax import budget_rows, chunked_softmax_nll
from lmtrain.output.full import FullSoftmax
from lmtrain.process.memory import reuse_freed_memory

HAS_TORCH_LCE = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
BASE_VARIANTS = ["dense", "lmtrain", "torch_auto", "torch_aspect", "torch_budget", "torch_budget_none"]
PRECISIONS = ["32", "64", "bf16-mixed", "bf16-hidden"]
REFERENCE = "lmtrain"  # the ratios' denominator
BASELINE = "inputs"  # the child that only allocates the inputs and their gradients

Loss = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (hidden, weight, bias, target) -> scalar mean loss


def default_layer(num_classes: int, dim: int) -> FullSoftmax:
    """``output=full`` with its default options, on the meta device (no memory): for its chunk rule only."""
    with torch.device("meta"):
        return FullSoftmax(num_classes, dim)


def lmtrain_chunk(num_classes: int, dim: int, positions: int) -> int:
    """The vocabulary chunk ``output=full`` trains with on a CPU by default (>= n: it would go dense)."""
    return default_layer(num_classes, dim).loss_chunk(positions, torch.device("cpu"))


def cpu_budget_rows(num_classes: int, dim: int) -> int:
    """Batch rows whose (rows, n) float32 logits fit the CPU budget ``output=full`` gives its (N, chunk) logits: the
    rows lmtrain's ``exact_softmax_nll`` gives torch's op (``budget_rows``)."""
    return budget_rows(default_layer(num_classes, dim).logits_mib, num_classes)


def torch_options(variant: str, num_classes: int, dim: int) -> Any:
    """The ``LinearCrossEntropyOptions`` of a torch variant (see the module docstring)."""
    options = torch.nn.LinearCrossEntropyOptions
    if variant == "torch_auto":
        return options()
    if variant == "torch_aspect":
        return options(chunking_method="aspect_ratio")
    if variant in ("torch_budget", "torch_budget_none"):
        return options(batch_chunk_size=cpu_budget_rows(num_classes, dim))
    if variant.startswith("torch_rows:"):
        return options(batch_chunk_size=int(variant.split(":", 1)[1]))
    raise ValueError(f"unknown torch variant {variant!r}")


def resolved(options: Any, positions: int, dim: int, num_classes: int, dtype: torch.dtype) -> dict:
    """What torch makes of ``options`` for these shapes on a CPU: rows per chunk, policy, accumulation dtype.
    Reads torch's private ``_adjust`` (the resolution F.linear_cross_entropy applies); empty if it is gone."""
    try:
        got = options._adjust(positions, dim, num_classes, dtype, torch.device("cpu"))
    except (AttributeError, TypeError):
        return {}
    return {"rows": got.batch_chunk_size, "acc_policy": got.acc_policy, "acc_dtype": str(got.acc_dtype)}


def capped(options: Any, rows: int) -> Any:
    """``options`` with at most ``rows`` batch rows per chunk (the exactness check's at-least-three chunks)."""
    return dataclasses.replace(options, batch_chunk_size=rows, chunking_method=None)


def loss_fn(variant: str, num_classes: int, dim: int, positions: int, at_least_chunks: int = 1) -> Loss:
    """The mean training loss of ``variant`` at these shapes; ``at_least_chunks`` caps a chunked variant's chunk
    so that it loops over at least that many chunks."""
    if variant == "dense":
        return lambda h, w, b, t: F.cross_entropy(F.linear(h, w, b), t)
    if variant == "lmtrain":
        chunk = min(lmtrain_chunk(num_classes, dim, positions), math.ceil(num_classes / at_least_chunks))
        return lambda h, w, b, t: chunked_softmax_nll(h, w, b, t, chunk).mean()
    options = torch_options(variant, num_classes, dim)
    rows = resolved(options, positions, dim, num_classes, torch.float32).get("rows", positions)
    if rows > math.ceil(positions / at_least_chunks):
        options = capped(options, math.ceil(positions / at_least_chunks))
    if variant.endswith("_none"):  # per-row losses, averaged outside torch's op
        return lambda h, w, b, t: F.linear_cross_entropy(
            h, w, t, linear_bias=b, reduction="none", options=options
        ).mean()
    return lambda h, w, b, t: F.linear_cross_entropy(h, w, t, linear_bias=b, options=options)


def describe(variant: str, num_classes: int, dim: int, positions: int) -> dict:
    """How a variant chunks at these shapes (for the table and the record)."""
    if variant == "dense":
        return {"chunk": f"dense ({positions} x {num_classes} logits)"}
    if variant == "lmtrain":
        chunk = lmtrain_chunk(num_classes, dim, positions)
        note = " (output=full would go dense)" if chunk >= num_classes else ""
        return {"chunk": f"{min(chunk, num_classes)} classes{note}", "classes": chunk}
    if variant == BASELINE:
        return {"chunk": "no loss: inputs and their gradients"}
    got = resolved(torch_options(variant, num_classes, dim), positions, dim, num_classes, torch.float32)
    per_row = ", per-row losses" if variant.endswith("_none") else ""
    return {"chunk": f"{got.get('rows', '?')} rows, {got.get('acc_policy', '?')}{per_row}", **got}


def make_inputs(num_classes: int, dim: int, positions: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Hidden N(0, 1), weight uniform(-0.1, 0.1) (``output=full``'s init range), bias uniform(-1, 1) (so that its
    gradient is not the zero-bias case), uniform targets; float32 leaves, all but the targets requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(positions, dim, generator=gen).requires_grad_()  # (N, d)
    weight = (torch.rand(num_classes, dim, generator=gen) * 0.2 - 0.1).requires_grad_()  # (n, d)
    bias = (torch.rand(num_classes, generator=gen) * 2 - 1).requires_grad_()  # (n,)
    target = torch.randint(num_classes, (positions,), generator=gen)  # (N,)
    return hidden, weight, bias, target


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def run_cell(cell: dict, args: argparse.Namespace) -> dict:
    """One child's work: ``--warmup`` + ``--calls`` timed forward + backward calls of one variant at one size."""
    num_classes, variant = cell["num_classes"], cell["variant"]
    hidden, weight, bias, target = make_inputs(num_classes, args.dim, args.positions)
    params = (hidden, weight, bias)
    if variant == BASELINE:
        for p in params:
            p.grad = torch.zeros_like(p)  # every variant ends holding these
        return {"seconds": [], "peak_mib": peak_mib(), "loss": None}
    loss = loss_fn(variant, num_classes, args.dim, args.positions)
    seconds, value = [], None
    for index in range(args.warmup + args.calls):
        for p in params:
            p.grad = None
        start = time.perf_counter()
        out = loss(hidden, weight, bias, target)
        out.backward()
        took = time.perf_counter() - start
        value = out.item()
        if index >= args.warmup or took > args.slow_s:  # a slow call is measured as it is: no warm-up
            seconds.append(took)
            if index < args.warmup:
                break
    return {"seconds": seconds, "peak_mib": peak_mib(), "loss": value}


def child(cell: dict, args: argparse.Namespace) -> dict:
    """``run_cell`` in a fresh child process: its timings, peak memory and loss."""
    argv = [sys.executable, __file__, *args.argv, "--cell", json.dumps(cell)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cell['variant']} at n={cell['num_classes']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def errors(got: Tensor, ref: Tensor) -> dict:
    """max |got - ref| and that over max |ref|."""
    diff = (got.detach().double() - ref).abs().max().item()
    return {"abs": diff, "rel": diff / max(ref.abs().max().item(), 1e-300)}


def exactness(variant: str, precision: str, num_classes: int, dim: int, positions: int) -> dict:
    """The loss and the three gradients of ``variant`` in ``precision`` against a float64 dense reference on the
    same inputs (hidden rounded to bfloat16 for ``bf16-hidden``)."""
    hidden, weight, bias, target = make_inputs(num_classes, dim, positions, seed=1)
    dtype = torch.float64 if precision == "64" else torch.float32
    hidden_dtype = torch.bfloat16 if precision == "bf16-hidden" else dtype
    h = hidden.detach().to(hidden_dtype).requires_grad_()
    w, b = (x.detach().to(dtype).requires_grad_() for x in (weight, bias))
    autocast = precision.startswith("bf16")
    loss = loss_fn(variant, num_classes, dim, positions, at_least_chunks=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            out = loss(h, w, b, target)
        out.backward()
    ref_in = [x.detach().double().requires_grad_() for x in (h, w, b)]
    ref = F.cross_entropy(F.linear(*ref_in), target)
    ref.backward()
    found = {
        "loss": errors(out, ref.detach()),
        **{
            name: errors(x.grad, r.grad)
            for name, x, r in zip(("hidden", "weight", "bias"), (h, w, b), ref_in, strict=True)
        },
    }
    found["dtypes"] = f"loss {out.dtype}, grads {h.grad.dtype} / {w.grad.dtype} / {b.grad.dtype}"
    found["warnings"] = sorted({str(c.message)[:200] for c in caught})
    return found


def support() -> dict[str, str]:
    """Small probes of what ``F.linear_cross_entropy``'s chunked path (default options) accepts and computes:
    each an outcome in words. N = 50, d = 16, n = 3000, several row chunks."""
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=7)
    gen = torch.Generator().manual_seed(2)
    n, d, N = 3000, 16, 50
    target = torch.randint(n, (N,), generator=gen)
    probes: dict[str, str] = {}

    def probe(name: str, body: Callable[[], str]) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                outcome = body()
            except Exception as error:  # noqa: BLE001  (a probe's failure is its finding)
                outcome = f"fails: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
        notes = sorted({str(c.message)[:120] for c in caught})
        probes[name] = outcome + (f" (warns: {'; '.join(notes)})" if notes else "")

    def leaves(dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
        return (
            torch.randn(N, d, generator=gen, dtype=dtype).requires_grad_(),
            torch.randn(n, d, generator=gen, dtype=dtype).mul_(0.3).requires_grad_(),
            torch.randn(n, generator=gen, dtype=dtype).requires_grad_(),
        )

    def reduction(kind: str) -> str:
        h, w, b = leaves()
        out = F.linear_cross_entropy(h, w, target, linear_bias=b, reduction=kind, options=options)
        refs = [x.detach().clone().requires_grad_() for x in (h, w, b)]
        ref = F.cross_entropy(F.linear(*refs), target, reduction=kind)
        upstream = torch.rand(ref.shape, generator=gen, dtype=ref.dtype) + 0.5  # a non-uniform incoming gradient
        (out * upstream).sum().backward()
        (ref * upstream).sum().backward()
        worst = max(errors(x.grad, r.grad)["rel"] for x, r in zip((h, w, b), refs, strict=True))
        return f"ok, float64: loss rel {errors(out, ref.detach())['rel']:.1e}, grads rel <= {worst:.1e}"

    for kind in ("mean", "sum", "none"):
        probe(f"reduction={kind} (bias, float64, scaled upstream grad)", lambda kind=kind: reduction(kind))

    def tied(sparse: bool) -> str:
        w = torch.randn(n, d, generator=gen).mul_(0.3).requires_grad_()
        tokens = torch.randint(n, (N,), generator=gen)
        h = torch.tanh(F.embedding(tokens, w, sparse=sparse))  # (N, d) the tied embedding's rows
        F.linear_cross_entropy(h, w, target, options=options).backward()
        w_ref = w.detach().clone().requires_grad_()
        F.cross_entropy(F.linear(torch.tanh(F.embedding(tokens, w_ref)), w_ref), target).backward()
        grad = w.grad.to_dense() if w.grad.is_sparse else w.grad
        return f"ok, weight grad {w.grad.layout}, rel err {errors(grad, w_ref.grad.double())['rel']:.1e}"

    probe("tied weight (dense embedding)", lambda: tied(False))
    probe("tied weight (sparse embedding grad)", lambda: tied(True))

    def sparse_weight() -> str:
        w = torch.randn(n, d, generator=gen).to_sparse().requires_grad_()
        F.linear_cross_entropy(torch.randn(N, d, generator=gen), w, target, options=options).backward()
        return "ok"

    probe("sparse weight tensor", sparse_weight)

    def twice(retain: bool) -> str:
        h, w, b = leaves(torch.float32)
        opts = dataclasses.replace(options, allow_retain_graph=retain)
        out = F.linear_cross_entropy(h, w, target, linear_bias=b, options=opts)
        out.backward(retain_graph=True)
        out.backward()
        return "ok"

    probe("second backward through one graph", lambda: twice(False))
    probe("second backward, allow_retain_graph=True", lambda: twice(True))

    def repeated_calls() -> str:
        h, w, b = leaves(torch.float32)
        for _ in range(2):
            F.linear_cross_entropy(h, w, target, linear_bias=b, options=options).backward()
        return "ok"

    probe("two calls on one leaf hidden", repeated_calls)

    def under_autocast() -> str:
        h, w, b = leaves(torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            chunked = F.linear_cross_entropy(h, w, target, linear_bias=b, options=options)
            dense = F.cross_entropy(F.linear(h, w, b), target)
        plain = F.linear_cross_entropy(h, w, target, linear_bias=b, options=options)  # autocast off
        same = "equal to" if torch.equal(chunked, plain) else "not equal to"
        dense_diff = abs(dense - F.cross_entropy(F.linear(h, w, b), target)).item()
        return f"runs; loss {chunked.dtype}, {same} its loss without autocast (dense: |diff| {dense_diff:.1e})"

    probe("float32 inputs under CPU autocast bf16", under_autocast)

    def no_grad() -> str:
        h, w, b = leaves(torch.float32)
        with torch.no_grad():
            out = F.linear_cross_entropy(h, w, target, linear_bias=b, options=options)
        return f"ok, requires_grad={out.requires_grad}"

    probe("forward under no_grad", no_grad)
    return probes


def table(samples: dict[str, list[float]], peaks: dict[str, float], chunks: dict[str, dict]) -> dict:
    """Medians, ratios to lmtrain, peak memory and its excess over the inputs' of one size."""
    median = {k: statistics.median(v) for k, v in samples.items() if v}
    base = peaks.get(BASELINE)
    reference = median.get(REFERENCE)
    return {
        "seconds": median,
        "samples": samples,
        "over_lmtrain": {k: v / reference for k, v in median.items()} if reference else {},
        "peak_mib": peaks,
        "extra_mib": {k: v - base for k, v in peaks.items() if k != BASELINE} if base else {},
        "chunks": chunks,
    }


def print_size(num_classes: int, found: dict, skipped: dict[str, str]) -> None:
    print(f"\nn = {num_classes:,}")
    width = max(12, *(len(k) for k in found["chunks"]))
    print(f"{'variant':<{width}} {'s/step':>9} {'/ lmtrain':>9} {'peak MiB':>9} {'extra MiB':>9}  chunk")
    for key, info in found["chunks"].items():
        seconds, ratio = found["seconds"].get(key), found["over_lmtrain"].get(key)
        extra = found["extra_mib"].get(key)
        cols = f"{key:<{width}} " + (f"{seconds:>9.3f} " if seconds is not None else " " * 10)
        cols += f"{ratio:>9.2f} " if ratio is not None else " " * 10
        cols += f"{found['peak_mib'].get(key, 0):>9,.0f} " + (f"{extra:>9,.0f}" if extra is not None else " " * 9)
        print(cols + f"  {info['chunk']}")
    for key, why in skipped.items():
        print(f"{key:<{width}} left out: {why}")


def print_exactness(found: dict[str, dict[str, dict]]) -> None:
    print("\nexactness against float64 dense (max abs / max |ref|; loss: abs)")
    print(f"{'precision':<12} {'variant':<14} {'loss':>9} {'hidden':>9} {'weight':>9} {'bias':>9}  dtypes")
    for precision, variants in found.items():
        for variant, e in variants.items():
            cols = f"{precision:<12} {variant:<14} {e['loss']['abs']:>9.1e} "
            cols += " ".join(f"{e[k]['rel']:>9.1e}" for k in ("hidden", "weight", "bias"))
            print(cols + f"  {e['dtypes']}" + (f"  warns: {e['warnings']}" if e["warnings"] else ""))


def variants_at(requested: list[str], num_classes: int, args: argparse.Namespace) -> tuple[list[str], dict]:
    """The variants measured at ``num_classes`` and why any other is left out: the dense logits over
    ``--dense-max-mib``, a torch variant without torch's op, or one resolving to an earlier one's settings."""
    kept, skipped, seen = [], {}, {}
    for variant in requested:
        if variant == "dense" and args.positions * num_classes * 4 / 2**20 > args.dense_max_mib:
            skipped[variant] = f"its logits take over --dense-max-mib {args.dense_max_mib:g}"
            continue
        if variant.startswith("torch") and not HAS_TORCH_LCE:
            skipped[variant] = f"torch {torch.__version__} has no F.linear_cross_entropy"
            continue
        if variant.startswith("torch"):
            key = json.dumps(describe(variant, num_classes, args.dim, args.positions), sort_keys=True)
            if key in seen:
                skipped[variant] = f"resolves as {seen[key]}"
                continue
            seen[key] = variant
        kept.append(variant)
    return kept, skipped


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000", help="comma list of class counts n")
    parser.add_argument("--variants", default=",".join(BASE_VARIANTS), help="comma list (see the docstring)")
    parser.add_argument("--torch-rows", default="", help="comma list of extra batch_chunk_size values")
    parser.add_argument("--positions", type=int, default=20 * 35, help="N: batch x bptt")
    parser.add_argument("--dim", type=int, default=200, help="d")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds, a child per variant each")
    parser.add_argument("--calls", type=int, default=1, help="timed calls per child")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per child before them")
    parser.add_argument("--slow-s", type=float, default=30.0, help="a call this slow is measured without warm-up")
    parser.add_argument("--dense-max-mib", type=float, default=4096.0, help="largest dense (N, n) logits, MiB")
    parser.add_argument("--check-classes", type=int, default=20000, help="n of the exactness check; 0: none")
    parser.add_argument("--support", action="store_true", help="probe what the chunked linear_cross_entropy accepts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--default-malloc", action="store_true", help="keep glibc's allocator defaults")
    parser.add_argument("--json", default=None, help="write the record to this path")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: one child's work
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.cell is not None:
        args.argv = args.argv[: args.argv.index("--cell")]
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as lmtrain's training run does
    if not args.default_malloc:
        reuse_freed_memory()  # as lmtrain's training run does; applies to the children, which measure
    if args.cell is not None:
        print(json.dumps(run_cell(json.loads(args.cell), args)))
        return {}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    requested = [v for v in args.variants.split(",") if v]
    requested += [f"torch_rows:{r}" for r in args.torch_rows.split(",") if r]
    plan = {n: variants_at(requested, n, args) for n in sizes}
    samples = {n: {v: [] for v in kept} for n, (kept, _) in plan.items()}
    peaks: dict[int, dict[str, float]] = {n: {} for n in sizes}
    losses: dict[int, dict[str, float]] = {n: {} for n in sizes}
    for index in range(args.repeats):
        for n, (kept, _) in plan.items():
            for variant in ([BASELINE] if index == 0 else []) + kept:
                got = child({"num_classes": n, "variant": variant}, args)
                peaks[n][variant] = max(peaks[n].get(variant, 0.0), got["peak_mib"])
                if variant == BASELINE:
                    continue
                samples[n][variant] += got["seconds"]
                losses[n][variant] = got["loss"]
                print(f"round {index} n={n} {variant}: {statistics.median(got['seconds']):.3f} s", flush=True)
    sizes_found = {}
    for n, (kept, skipped) in plan.items():
        chunks = {v: describe(v, n, args.dim, args.positions) for v in [*kept, BASELINE]}
        sizes_found[n] = {**table(samples[n], peaks[n], chunks), "loss": losses[n], "left_out": skipped}
        print_size(n, sizes_found[n], skipped)
    exact: dict[str, dict[str, dict]] = {}
    extras = [f"torch_rows:{r}" for r in args.torch_rows.split(",") if r]
    checked, unchecked = (
        variants_at([*BASE_VARIANTS, *extras], args.check_classes, args) if args.check_classes else ([], {})
    )
    for precision in PRECISIONS if checked else []:
        exact[precision] = {v: exactness(v, precision, args.check_classes, args.dim, args.positions) for v in checked}
    if exact:
        print_exactness(exact)
    probes = support() if args.support and HAS_TORCH_LCE else {}
    for name, outcome in probes.items():
        print(f"support: {name}: {outcome}")
    result = {
        "command": shlex.join(["python", "scripts/bench_linear_ce.py", *args.argv]),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "positions": args.positions,
        "dim": args.dim,
        "repeats": args.repeats,
        "reuse_freed_memory": not args.default_malloc,
        "peak_memory": "child ru_maxrss (MiB); extra: over the inputs child's",
        "sizes": {str(n): found for n, found in sizes_found.items()},
        "exactness": {"classes": args.check_classes, "by_precision": exact, "left_out": unchecked},
        "support": probes,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
