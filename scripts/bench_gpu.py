"""One command that measures a GPU: the CUDA tests, then tokens/s and peak GPU memory of every output strategy.

    LMTRAIN_DATA_DIR=/path/to/data python scripts/bench_gpu.py --json docs/bench/gpu_h100.json
    python scripts/bench_gpu.py --quick --device cpu --json /tmp/smoke.json    # the smoke path, on a CPU, seconds

First ``pytest -m cuda`` (the tests that need a GPU; ``--tests none`` skips them), then, in interleaved rounds,
one training run per cell: every strategy of ``--outputs`` (plus ``full`` forced to its chunked and to its dense
path when the config has ``output.train_chunk``) and the plain PyTorch loop of ``scripts/bench_train.py``, on every
corpus of ``--corpora`` (PTB, 10^4 types, and ``data=zipf`` at 10^5 and 10^6), in every precision of
``--precisions``, with the default model (2x200 LSTM, batch 20 x 35). Cells run one after another in this process,
one job alone on the device; each run's folder (with its last.ckpt) is deleted after it. A cell trains at most
``--steps`` steps and ``--cell-seconds`` of training; its tokens/s are timed by
``lab.step_clock`` after ``--warmup`` steps (synchronized with the device), its peak memory is
``torch.cuda.max_memory_allocated`` since the cell began. A cell that runs out of memory or fails is recorded
with the reason and not retried. The whole run keeps to ``--minutes``: a cell whose last run would not end in
time is skipped for that round (with the reason, where it has no round at all). Writes the record (``--json``,
after every round) and its rendered table beside it (NAME.md, ``records.gpu_bench``), and prints the goals.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_train import base_overrides, data_overrides, plain_round, round_overrides
from lab.provenance import commit, environment, run_cuda_tests
from lab.step_clock import clock_throughput
from records.bench import write_bench
from records.gpu_bench import KIND, PLAIN, PLAIN_READ, checks, median

from lmtrain.config import compose_config
from lmtrain.run.run import train

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = (
    "full,uniform,unigram,bigram,exp,quadratic,rff,rff shared=rff:++output.shared_negatives=true,"
    "quadratic shared=quadratic:++output.shared_negatives=true,nce,negative,hsm,adaptive"
)
# --quick: a tiny model on a small synthetic corpus, so that every code path runs in seconds on a CPU
QUICK = ["model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1", "data.batch_size=8", "data.bptt=10"]
QUICK += ["data.train_tokens=20000", "data.valid_tokens=1000", "data.test_tokens=1000", "threads=1"]
PRESETS = {  # option: (default, --quick default)
    "corpora": ("ptb,zipf:100000,zipf:1000000", "synthetic:300"),
    "steps": (300, 6),  # 120 steps timed 0.6 s at PTB, where rounds of the same cell moved by up to 15%
    "warmup": (20, 2),
    "rounds": (3, 1),
    "cell_seconds": (5.0, 30.0),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the record here (and the rendered table as NAME.md)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="a tiny model on synthetic data: a smoke test")
    parser.add_argument("--outputs", default=OUTPUTS, help="comma list of OUTPUT[:OVERRIDE...], or LABEL=ENTRY")
    parser.add_argument("--corpora", help="comma list: ptb, zipf:N, synthetic:N")
    parser.add_argument("--precisions", default="32-true,bf16-mixed", help="comma list of trainer.precision values")
    parser.add_argument("--chunked", default="output.train_chunk=4096", help="the override that forces chunked full")
    parser.add_argument("--dense", default="output.train_chunk=0", help="the override that forces dense full")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for every cell")
    parser.add_argument("--steps", type=int, help="most optimizer steps of a cell")
    parser.add_argument("--warmup", type=int, help="steps before the clock starts")
    parser.add_argument("--rounds", type=int, help="interleaved rounds, as many as fit in --minutes")
    parser.add_argument("--cell-seconds", type=float, help="most training seconds of a cell")
    parser.add_argument("--minutes", type=float, default=19.0, help="the whole run's budget, the tests included")
    parser.add_argument("--tests", default="tests", help="what pytest -m cuda collects; none: skip the tests")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for name, (default, quick) in PRESETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: use --device cpu (with --quick for a smoke test)")
    return args


def strategies(args: argparse.Namespace) -> dict[str, str]:
    """label -> entry (``output[:override...]``, as scripts/bench_train.py reads it). Where this lmtrain's full
    softmax has a chunked training path (``output.train_chunk``), ``full`` is its default (chunked by size) and,
    when ``--outputs`` has ``full``, ``full chunked`` and ``full dense`` force either path."""
    found = [
        tuple(item.split("=", 1)) if "=" in item.split(":")[0] else (item, item) for item in args.outputs.split(",")
    ]
    at = next((i + 1 for i, (label, _) in enumerate(found) if label == "full"), None)
    if at is not None and "train_chunk" in compose_config(["output=full"]).output:
        found[at:at] = [("full chunked", f"full:{args.chunked}"), ("full dense", f"full:{args.dense}")]
    return dict(found)


# the cells the goals compare, run first in each corpus and precision: a round that the time budget cuts short still
# has them side by side (an H200 run of 9.3 minutes had the plain loop of its last PTB round cut off)
GOAL_CELLS = ("full", PLAIN, PLAIN_READ, "rff")


def run_order(cells: list[dict[str, Any]]) -> list[int]:
    """The indices of ``cells`` in the order a round runs them: corpus by corpus and precision by precision, as
    listed, with the goals' cells (``GOAL_CELLS``) first in each, the others in their order."""
    groups = list(dict.fromkeys((c["corpus"], c["precision"]) for c in cells))
    first = {name: rank for rank, name in enumerate(GOAL_CELLS)}

    def key(index: int) -> tuple[int, int]:
        cell = cells[index]
        return groups.index((cell["corpus"], cell["precision"])), first.get(cell["strategy"], len(GOAL_CELLS))

    return sorted(range(len(cells)), key=key)  # stable: the other cells keep their order


def cell_error(err: BaseException) -> tuple[str, str]:
    """(status, reason) of a failed cell: ``oom`` when running out of memory caused it, else ``error``."""
    chain, cause = [], err  # the exception, what it was raised from or while handling, and so on
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e) for e in chain):
        return "oom", "out of memory"
    root = err
    while root.__cause__ is not None:  # a wrapper's cause (Hydra's InstantiationException) says what went wrong
        root = root.__cause__
    first = (str(root).strip().splitlines() or [""])[0][:160]
    return "error", f"{type(root).__name__}: {first}"


def measure(cell: dict[str, Any], args: argparse.Namespace, run_dir: Path) -> float:
    """One round of one cell: its tokens/s; also records its overrides, steps timed and peak memory."""
    bench = argparse.Namespace(
        experiment="none", device=args.device, threads=None, default_malloc=False, steps=args.steps,
        warmup=args.warmup,
        override=[*(QUICK if args.quick else []), *args.override, f"trainer.precision={cell['precision']}"],
    )  # fmt: skip
    if cell["strategy"] in (PLAIN, PLAIN_READ):
        cell["overrides"] = base_overrides(bench, cell["corpus"])
        return plain_round(bench, cell["corpus"], args.cell_seconds, read_loss=cell["strategy"] == PLAIN_READ)
    clock = run_dir / "clock.json"
    extra = ["+callbacks.clock._target_=lab.step_clock.StepClock", f"+callbacks.clock.path={clock}"]
    extra += [f"+callbacks.clock.warmup={args.warmup}", f"max_train_seconds={args.cell_seconds}"]
    output, *own = cell["entry"].split(":")
    overrides = round_overrides(output, own, args.steps, 20, bench, run_dir, cell["corpus"], extra)
    cell["overrides"] = [o.replace(str(run_dir), "RUN_DIR") for o in overrides]
    train(compose_config(overrides))
    rate, timed = clock_throughput(clock, args.warmup)
    cell["steps_timed"].append(timed)
    return rate


def run_cell(cell: dict[str, Any], args: argparse.Namespace, run_dir: Path) -> None:
    """``measure`` with the device emptied first and failures recorded in the cell."""
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        left = torch.cuda.memory_allocated() / 2**30  # what earlier cells left allocated: counted in the peak
        cell["baseline_gib"] = max(cell.get("baseline_gib") or 0.0, left)
    started = time.monotonic()
    try:
        cell["tokens_per_sec"].append(measure(cell, args, run_dir))
    except Exception as err:  # recorded, the run goes on: an OOM at 10^6 must not lose the other cells
        cell["status"], cell["reason"] = cell_error(err)
    cell["seconds"].append(time.monotonic() - started)
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
        cell["peak_gib"] = max(cell["peak_gib"] or 0.0, peak)
    got = f"{cell['tokens_per_sec'][-1]:,.0f} tokens/s" if cell["status"] == "ok" else cell["reason"]
    print(f"{cell['corpus']} {cell['precision']} {cell['strategy']}: {cell['status']} {got}", flush=True)


def missing_corpus(corpus: str) -> str | None:
    """Why a text corpus (a data config with a ``root`` folder) cannot be read here, else None: a missing corpus is
    skipped, never downloaded (a GPU machine may have no network)."""
    data = compose_config(data_overrides(corpus)).data
    if "root" not in data:
        return None  # generated
    folder = Path(str(data.root)) / str(data.name)
    return None if (folder / "train.txt").is_file() else f"no {folder}/train.txt: set LMTRAIN_DATA_DIR"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    named = strategies(args)
    corpora, precisions = args.corpora.split(","), args.precisions.split(",")
    cells = [
        {"corpus": c, "precision": p, "strategy": s, "entry": named.get(s), "status": "ok", "reason": None}
        | {"tokens_per_sec": [], "steps_timed": [], "seconds": [], "peak_gib": None, "overrides": []}
        for c in corpora for p in precisions for s in [*named, PLAIN, PLAIN_READ]
    ]  # fmt: skip
    missing = {corpus: missing_corpus(corpus) for corpus in corpora}
    for cell in cells:
        if missing[cell["corpus"]]:
            cell["status"], cell["reason"] = "skipped", missing[cell["corpus"]]
    record = {
        "kind": KIND,
        "quick": args.quick,
        "command": shlex.join(["python", "scripts/bench_gpu.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": commit(ROOT),
        "environment": environment(args.device),
        "settings": {k: getattr(args, k) for k in ("steps", "warmup", "rounds", "cell_seconds", "minutes")}
        | {"corpora": corpora, "precisions": precisions, "strategies": named, "override": args.override}
        | {"quick_overrides": QUICK if args.quick else [], "classes": {}},
        "tests": run_cuda_tests(args.tests.split(), 0.4 * (deadline - started), ROOT)
        if args.tests != "none"
        else {"status": "not run", "reason": "--tests none"},
        "cells": cells,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for number in run_order(cells):
                cell = cells[number]
                if cell["status"] != "ok":
                    continue
                guess = max(cell["seconds"], default=args.cell_seconds + 30)  # training, data and model setup
                if time.monotonic() + guess > deadline:
                    if not cell["tokens_per_sec"]:
                        cell["status"], cell["reason"] = "skipped", f"time budget (--minutes {args.minutes:g})"
                    continue
                run_dir = Path(tmp) / f"{number}-{index}"
                run_cell(cell, args, run_dir)
                vocab = run_dir / "vocab.tsv"
                if cell["corpus"] not in record["settings"]["classes"] and vocab.is_file():
                    record["settings"]["classes"][cell["corpus"]] = len(vocab.read_text().splitlines()) - 1
                shutil.rmtree(run_dir, ignore_errors=True)  # its last.ckpt: 1.6 GB at 10^6, 30 cells a round
            finish(record, args, started)
    for check in record["checks"]:
        value = "not measured" if check["value"] is None else f"{check['value']:.2f}"
        print(f"{check['verdict']}: {check['goal']} on {check['corpus']} {check['precision']}: {value}")
    return record


def finish(record: dict[str, Any], args: argparse.Namespace, started: float) -> None:
    """The goals, the medians and the elapsed time into the record; the record and its table written."""
    for cell in record["cells"]:
        cell["median"] = median(cell)
    record["checks"] = checks(record)
    record["seconds"] = time.monotonic() - started
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json} and {write_bench(args.json)}", flush=True)


if __name__ == "__main__":
    main()
