"""Test-time cost of every output strategy: positions/s of its scoring, side by side in one process, and the size of
its output layer.

    LMTRAIN_DATA_DIR=../shared/data python scripts/bench_scoring.py --data ptb --threads 1 \
        --outputs full,hsm,dsoftmax,self_normalize=full:output.self_normalize=0.1 --unnormalized self_normalize \
        --json docs/bench/survey_score_ptb.json

Each entry (``LABEL=OUTPUT[:OVERRIDE...]``, as ``scripts/bench_train.py`` takes them) is built as a run of
``--experiment`` builds it (the data module, the encoder, the output layer, untrained). The hidden states of the first
``--positions`` test positions are computed once by the encoder (not timed); then, in interleaved rounds (A, B, ...,
then again), each layer scores them as an evaluation does: its exact ``log_prob`` in windows of ``--window``
positions, or, for the labels in ``--unnormalized``, its ``unnormalized_log_prob`` (the target's score alone, the
self-normalized model's test-time form). An evaluation starts from a layer switched to training and back to
evaluation, so whatever a layer computes once per evaluation (CNN-softmax's class vectors) is paid in every one; a
round repeats whole evaluations until it lasts ``--min-seconds``. The figure is the median of the rounds'
positions/s, and its ratio to ``full`` (exact) on the same corpus. The record also holds each output layer's
parameter count (its sampler's included; the encoder left out) and its ratio to ``full``'s.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import statistics
import time
from typing import Any

import torch
from bench_train import data_overrides, labelled, parse_bench_args
from torch import Tensor

from lmtrain.config import compose_config
from lmtrain.run.build import build_model
from lmtrain.training.step import carry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", default="full,hsm,adaptive", help="comma list of [LABEL=]OUTPUT[:OVERRIDE...]")
    parser.add_argument("--unnormalized", default="", help="comma list of labels scored by unnormalized_log_prob")
    parser.add_argument("--data", default="ptb", help="comma list of corpora: ptb, wikitext2, zipf:N, synthetic:N")
    parser.add_argument("--experiment", default="ptb_study", help="an experiment config, or none")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--positions", type=int, default=20_000, help="test positions scored per round")
    parser.add_argument("--window", type=int, default=200, help="positions per log_prob call (an eval window)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--min-seconds", type=float, default=0.5, help="a round repeats whole evaluations until it lasts this long"
    )
    return parse_bench_args(parser, argv)


def overrides(args: argparse.Namespace, data: str, entry: str) -> list[str]:
    output, *own = entry.split(":")
    experiment = [] if args.experiment == "none" else [f"experiment={args.experiment}"]
    return [*experiment, *data_overrides(data), f"output={output}", *own, *args.override, "logger=csv"]


def test_hidden(args: argparse.Namespace, data: str) -> tuple[Tensor, Tensor]:
    """The encoder's hidden states (P, d) and the targets (P,) of the first ``--positions`` test positions, from the
    full softmax's (untrained) model: every layer scores the same states."""
    datamodule, module = build_model(compose_config(overrides(args, data, "full")))
    module.eval()
    hidden, targets, state, count = [], [], None, 0
    with torch.no_grad():
        for inputs, target in datamodule.test_dataloader():
            h, state = carry(module.encoder, inputs, state)  # (B*T, d)
            hidden.append(h)
            targets.append(target.reshape(-1))
            count += h.shape[0]
            if count >= args.positions:
                break
    return torch.cat(hidden)[: args.positions], torch.cat(targets)[: args.positions]


def evaluation_seconds(
    output: torch.nn.Module, hidden: Tensor, targets: Tensor, window: int, unnormalized: bool
) -> float:
    """Seconds of one evaluation over ``hidden``: the layer set to evaluation afresh, then scored in windows."""
    output.train()
    score = output.unnormalized_log_prob if unnormalized else output.log_prob
    start = time.perf_counter()
    output.eval()
    with torch.no_grad():
        for begin in range(0, hidden.shape[0], window):
            score(hidden[begin : begin + window], targets[begin : begin + window])
    return time.perf_counter() - start


def score_round(
    output: torch.nn.Module, hidden: Tensor, targets: Tensor, window: int, unnormalized: bool, min_seconds: float
) -> tuple[float, int]:
    """Positions/s of one round and its number of evaluations: whole evaluations of ``hidden`` until the round lasts
    ``min_seconds`` (a layer that reads one row per position finishes one in milliseconds, where a timer's noise
    would decide its rate)."""
    seconds, evaluations = 0.0, 0
    while evaluations == 0 or seconds < min_seconds:
        seconds += evaluation_seconds(output, hidden, targets, window, unnormalized)
        evaluations += 1
    return evaluations * hidden.shape[0] / seconds, evaluations


def corpus_table(args: argparse.Namespace, data: str, entries: dict[str, str]) -> dict[str, Any]:
    """Every entry's rounds, median positions/s, ratio to full and parameter count on one corpus."""
    hidden, targets = test_hidden(args, data)
    unnormalized = {label for label in args.unnormalized.split(",") if label}
    layers, params = {}, {}
    for label, entry in entries.items():
        _, module = build_model(compose_config(overrides(args, data, entry)))
        layers[label] = module.output
        params[label] = sum(p.numel() for p in module.output.parameters())
        del module
        gc.collect()
    samples: dict[str, list[float]] = {label: [] for label in entries}
    evaluations: dict[str, list[int]] = {label: [] for label in entries}
    for index in range(args.rounds):
        for label, layer in layers.items():
            rate, count = score_round(layer, hidden, targets, args.window, label in unnormalized, args.min_seconds)
            samples[label].append(rate)
            evaluations[label].append(count)
            print(f"round {index} {data} {label}: {rate:,.0f} positions/s ({count} evaluations)", flush=True)
    median = {label: statistics.median(values) for label, values in samples.items()}
    full = median.get("full")
    return {
        "positions": int(hidden.shape[0]),
        "num_classes": int(next(iter(layers.values())).num_classes),
        "positions_per_sec": median,
        "samples": samples,
        "evaluations": evaluations,
        "ratio_to_full": {k: v / full for k, v in median.items()} if full else {},
        "unnormalized": sorted(unnormalized & set(entries)),
        "parameters": params,
        "parameters_to_full": {k: v / params["full"] for k, v in params.items()} if "full" in params else {},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    entries = dict(labelled(o) for o in args.outputs.split(",") if o)
    corpora = {data: corpus_table(args, data, entries) for data in args.data.split(",") if data}
    record = {
        "kind": "bench_scoring",
        "command": shlex.join(["python", "scripts/bench_scoring.py", *args.argv]),
        "experiment": args.experiment,
        "threads": torch.get_num_threads(),
        "window": args.window,
        "rounds": args.rounds,
        "min_seconds": args.min_seconds,
        "corpora": corpora,
    }
    for data, found in corpora.items():
        print(f"data {data} ({found['num_classes']:,} classes, {found['positions']:,} positions)")
        for label, rate in found["positions_per_sec"].items():
            ratio, share = found["ratio_to_full"].get(label), found["parameters_to_full"].get(label)
            shown = f"{label:<16} {rate:>12,.0f} positions/s {ratio or 0:>6.2f}x full"
            print(shown + f" {found['parameters'][label]:>12,} parameters {share or 0:>6.2f}x full")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
