"""Dynamic evaluation's cost per objective and proposal: seconds per 1,000 tokens side by side in one process, and
each pass's perplexity, over the first ``--tokens`` test tokens of trained runs.

    LMTRAIN_DATA_DIR=../shared/data python scripts/bench_dynamic.py --threads 1 \
        --runs full=runs/study/survey/data-ptb__output-full__seed-1,rff=runs/study/survey/data-ptb__output-rff__seed-1 \
        --json docs/bench/dynamic_eval_ptb.json

The modes are ``exact`` (dynamic.objective=exact) and ``train:PROPOSAL[:RECENT]`` (dynamic.objective=train with
dynamic.proposal=trained or current, and dynamic.recent=RECENT where given: ``train:trained:0`` steps on the sampled
loss alone, without the recent targets a sampled softmax holds by default; on a loss that is the exact one, as
full's, a train mode is the exact pass). Every mode runs ``method=rms`` at one lr
(``--lr``; the search is left out so that the modes take the same steps' sizes) with the gradient statistics of
``--stat-batches`` training batches, computed once per objective and not timed. After an untimed pass of
``--warmup-tokens`` per mode, in interleaved rounds (A, B, ..., then again) each mode reads the same tokens from the
trained weights (restored after every pass) with the same seed; a pass's time includes setting the evaluation up
(θ_0's copy and, with ``proposal=trained``, the tree built from it). The figure is the median seconds per 1,000 tokens
and its ratio to ``exact`` on the same run. The perplexity is the last round's (a sampled objective draws its
negatives from the seeded generator, so the rounds agree).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from bench_train import labelled, parse_bench_args

from lmtrain.output.cache import ppl, read_stream
from lmtrain.tools.dynamic_eval import DynamicEvaluation, DynamicOptions, gradient_rms, resolved
from lmtrain.tools.score_extras import run_data
from lmtrain.tools.trained import TrainedModel, load_trained, resolve_checkpoint, run_config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="comma list of LABEL=RUN_FOLDER (trained runs)")
    modes = "exact,train:trained,train:trained:0,train:current"
    parser.add_argument("--modes", default=modes, help="comma list of modes")
    parser.add_argument("--tokens", type=int, default=1000, help="test tokens each pass predicts")
    parser.add_argument("--lr", type=float, default=2e-5, help="dynamic.lr of every mode (method rms)")
    parser.add_argument("--stat-batches", type=int, default=20, help="dynamic.stat_batches (the statistics' batches)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-tokens", type=int, default=100, help="an untimed pass per mode before the rounds")
    return parse_bench_args(parser, argv)


def options_of(mode: str, args: argparse.Namespace) -> DynamicOptions:
    """``exact`` or ``train:PROPOSAL[:RECENT]`` as dynamic evaluation's options."""
    objective, proposal, recent = (mode.split(":") + ["", ""])[:3]
    chosen: dict[str, Any] = {"objective": objective}
    chosen |= {"proposal": proposal} if proposal else {}
    chosen |= {"recent": int(recent)} if recent else {}
    return DynamicOptions(lr=args.lr, stat_batches=args.stat_batches, **chosen)


def timed_pass(trained: TrainedModel, options: DynamicOptions, rms: list, stream: torch.Tensor) -> tuple[float, float]:
    """Seconds and perplexity of one dynamic pass over ``stream`` from the trained weights (restored after it)."""
    start = time.perf_counter()
    # the pinned proposal's tree build is paid here; it seeds the sampled objective's draws (the same every round)
    evaluation = DynamicEvaluation(trained.module, options, rms)
    try:
        with torch.no_grad():
            log_p, _, _ = read_stream(evaluation, stream, 1, (), trained.device, options.segment)
        seconds = time.perf_counter() - start
    finally:
        evaluation.restore()
    return seconds, ppl(log_p)


def run_table(args: argparse.Namespace, label: str, folder: str, modes: list[str]) -> dict[str, Any]:
    """Every mode's rounds, median seconds per 1,000 tokens, ratio to exact and perplexity on one run."""
    trained = load_trained(folder, [], "cpu")
    data = run_data(trained, run_config(resolve_checkpoint(Path(folder)), []))
    stream = data.test_ids[: args.tokens + 1]  # (tokens + 1,)
    # as a scoring resolves them: a train mode on a loss that is the exact NLL (full's) runs the exact pass
    options = {mode: resolved(options_of(mode, args), trained.module) for mode in modes}
    rms = {}
    for opts in options.values():  # the statistics follow the objective's gradient
        if opts.objective not in rms:
            rms[opts.objective] = gradient_rms(trained.module, data.train_ids, opts, trained.device)[0]
    for opts in options.values():  # the first pass of a mode pays its allocations and lazy setup: not timed
        timed_pass(trained, opts, rms[opts.objective], stream[: args.warmup_tokens + 1])
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    perplexity: dict[str, float] = {}
    for index in range(args.rounds):
        for mode, opts in options.items():
            spent, perplexity[mode] = timed_pass(trained, opts, rms[opts.objective], stream)
            seconds[mode].append(spent / (args.tokens / 1000))
            print(
                f"round {index} {label} {mode}: {seconds[mode][-1]:.3f} s per 1,000 tokens, ppl {perplexity[mode]:.2f}"
            )
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    exact = median.get("exact")
    return {
        "run": folder,
        "num_classes": int(trained.module.output.num_classes),
        "seconds_per_1k_tokens": median,
        "samples": seconds,
        "ratio_to_exact": {mode: value / exact for mode, value in median.items()} if exact else {},
        "ppl": perplexity,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = [mode for mode in args.modes.split(",") if mode]
    runs = {label: run_table(args, label, folder, modes) for label, folder in map(labelled, args.runs.split(","))}
    record = {
        "kind": "bench_dynamic",
        "command": shlex.join(["python", "scripts/bench_dynamic.py", *args.argv]),
        "threads": torch.get_num_threads(),
        "tokens": args.tokens,
        "lr": args.lr,
        "stat_batches": args.stat_batches,
        "rounds": args.rounds,
        "warmup_tokens": args.warmup_tokens,
        "options": dataclasses.asdict(options_of("exact", args)) | {"objective": None},
        "runs": runs,
    }
    for label, found in runs.items():
        print(f"{label} ({found['num_classes']:,} classes, {args.tokens:,} tokens)")
        for mode, value in found["seconds_per_1k_tokens"].items():
            ratio = found["ratio_to_exact"].get(mode, 0)
            print(f"  {mode:<16} {value:>8.3f} s per 1,000 tokens {ratio:>6.2f}x exact  ppl {found['ppl'][mode]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


if __name__ == "__main__":
    main()
