"""End-to-end training throughput (tokens/s) of lmtrain per output strategy, beside a plain-PyTorch loop.

    LMTRAIN_DATA_DIR=../shared/data python scripts/bench_train.py --outputs full,uniform,hsm --steps 150 --json out.json

Every measurement runs in this one process, rounds interleaved (strategy A, B, ..., plain; then again), so that
machine load drifts hit all of them alike. A round trains `--steps` optimizer steps of the configured experiment
(default `zaremba_small`: 2x200 LSTM, batch 20 x 20 steps) through `lmtrain.training.run.train`, with validation,
checkpoints and W&B switched off. Its throughput is all tokens after `--warmup` steps over the time they took
(data loading and every per-step overhead included), from the `tokens_per_sec` values lmtrain writes every
`--interval` steps (each the mean over its interval, as a real run writes every `trainer.log_every_n_steps`).
The reference is the loop a user would write by hand for the full softmax: embedding, LSTM, linear,
cross-entropy, clip, and SGD, on the same windows, timed the same way. Reported: the median over rounds,
each strategy / full, and lmtrain full / plain. lmtrain's allocator setting (`reuse_freed_memory`, see
lmtrain/training/memory.py) is process-wide, so it is applied before the first round and both loops run under it;
`--default-malloc` measures both with glibc's defaults instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from lmtrain.cli.overrides import compose_config
from lmtrain.tools.results import training_throughput
from lmtrain.training.memory import reuse_freed_memory
from lmtrain.training.run import train


def lmtrain_round(entry: str, args: argparse.Namespace, workdir: Path, index: int) -> float:
    """One timed round of ``entry``: an output strategy, optionally with its own overrides after colons
    (``uniform:++output.shared_negatives=false:++output.num_samples=1000``)."""
    output, *own = entry.split(":")
    run_dir = workdir / f"{len(list(workdir.iterdir()))}-{index}"
    cfg = compose_config(
        [
            f"experiment={args.experiment}",
            f"output={output}",
            *args.override,
            *own,
            f"trainer.max_steps={args.steps}",
            "trainer.limit_val_batches=0",
            f"trainer.log_every_n_steps={args.interval}",
            "test_after_fit=false",
            "logger=csv",
            "progress_bar=false",
            "checkpoint_every_n_steps=1000000000",
            f"run_dir={run_dir}",
            f"reuse_freed_memory={not args.default_malloc}",
        ]
    )
    train(cfg)
    return training_throughput(run_dir, args.warmup)


def plain_round(args: argparse.Namespace) -> float:
    """The hand-written full-softmax loop on the same data layout and model sizes."""
    cfg = compose_config([f"experiment={args.experiment}", *args.override])
    dm = instantiate(cfg.data)
    dm.setup()
    n, m = dm.num_classes, cfg.model
    emb = torch.nn.Embedding(n, m.emb_dim)
    lstm = torch.nn.LSTM(m.emb_dim, m.hidden_dim, m.num_layers, batch_first=True, dropout=m.dropout)
    proj = torch.nn.Linear(m.hidden_dim, n)
    params = [*emb.parameters(), *lstm.parameters(), *proj.parameters()]
    for p in params:
        torch.nn.init.uniform_(p, -m.init_range, m.init_range)
    opt = torch.optim.SGD(params, lr=cfg.optim.lr)
    state, tokens, start = None, 0, time.perf_counter()
    for step, (x, y) in enumerate(dm.train_dataloader()):  # data loading is timed, as it is in lmtrain's rate
        if step >= args.steps:
            break
        if step == args.warmup:
            tokens, start = 0, time.perf_counter()
        out, state = lstm(emb(x), state)
        state = tuple(s.detach() for s in state)
        loss = F.cross_entropy(proj(out).reshape(-1, n), y.reshape(-1)) * x.shape[1]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip)
        opt.step()
        tokens += x.numel()
    return tokens / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--outputs",
        default="full,uniform,unigram,nce,negative,hsm,adaptive,quadratic,rff",
        help="comma list of strategies; an entry may add its own overrides after colons, e.g. "
        "uniform:++output.shared_negatives=false",
    )
    parser.add_argument("--experiment", default="zaremba_small")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=int, default=10, help="steps per tokens_per_sec measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="write the results to this path")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's allocator defaults (reuse_freed_memory=false); otherwise lmtrain's setting is applied "
        "before any round, so the plain loop runs under it too",
    )
    args = parser.parse_args(argv)
    if not args.default_malloc:
        reuse_freed_memory()  # process-wide: both loops alike
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as lmtrain.training.run.train does, so the reference is not slowed by subnormals
    outputs = [o for o in args.outputs.split(",") if o]
    samples: dict[str, list[float]] = {o: [] for o in [*outputs, "plain_full"]}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for output in outputs:
                samples[output].append(lmtrain_round(output, args, Path(tmp), index))
            samples["plain_full"].append(plain_round(args))
    median = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "experiment": args.experiment,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "reuse_freed_memory": not args.default_malloc,
        "tokens_per_sec": median,
        "samples": samples,
        "ratio_to_full": {k: v / median["full"] for k, v in median.items()} if "full" in median else {},
        "lmtrain_full_over_plain": median["full"] / median["plain_full"] if "full" in median else None,
    }
    width = max(12, *(len(key) for key in median))
    print(f"{'output':<{width}} {'tokens/s':>10} {'x full':>8}")
    for key, value in median.items():
        ratio = result["ratio_to_full"].get(key)
        print(f"{key:<{width}} {value:>10,.0f} {ratio:>8.2f}" if ratio else f"{key:<{width}} {value:>10,.0f}")
    if result["lmtrain_full_over_plain"]:
        print(f"lmtrain full / plain PyTorch loop: {result['lmtrain_full_over_plain']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
