"""End-to-end training throughput (tokens/s) of lmtrain per output strategy, beside a plain-PyTorch loop.

    LMTRAIN_DATA_DIR=../shared/data python scripts/bench_train.py --outputs full,uniform,hsm --steps 150 --json out.json

Every measurement runs in this one process, rounds interleaved (strategy A, B, ..., plain; then again), so that
machine load drifts hit all of them alike. A round trains `--steps` optimizer steps of the configured experiment
(default `zaremba_small`: 2x200 LSTM, batch 20 x 20 steps) through `lmtrain.run.run.train`, with validation,
checkpoints and W&B switched off. Its throughput is all tokens after `--warmup` steps over the time they took
(data loading and every per-step overhead included), from the `tokens_per_sec` values lmtrain writes every
`--interval` steps (each the mean over its interval, as a real run writes every `trainer.log_every_n_steps`).
The reference is the loop a user would write by hand for the full softmax: embedding, LSTM, linear,
cross-entropy, clip, and SGD, on the same windows, timed the same way. Reported: the median over rounds,
each strategy / full, and lmtrain full / plain. lmtrain's allocator setting (`reuse_freed_memory`, see
lmtrain/process/memory.py) is process-wide, so it is applied before the first round and both loops run under it;
`--default-malloc` measures both with glibc's defaults instead.

At scale (issue 12), `--data ptb,zipf:100000,zipf:1000000` measures every strategy on each corpus (`zipf:N` is
`data=zipf data.vocab_size=N`), with ratios to full per corpus; `--experiment none` keeps the default model
(2x200 LSTM, batch 20 x 35); `--steps-for full@1000000=4` gives slow cells fewer steps (timed from the second,
one measurement per step); `--isolate` runs every cell in a child process of its own (rounds still interleaved)
and adds its peak memory: the child's peak resident set (`ru_maxrss`: the whole process, Python, torch, corpus
and model included) or, with `--device cuda`, torch's peak allocated GPU memory.

    LMTRAIN_DATA_DIR=../shared/data python scripts/bench_train.py --experiment none --isolate --threads 1 \
        --data ptb,zipf:1000000 --outputs full,rff,rff:++output.shared_negatives=true --steps-for full@1000000=3

Each cell also reports its step time (ms/step, from the median tokens/s) and the train/loss of its last round's
steps. The full softmax's chunked and dense training paths side by side: `--outputs full,full:output.train_chunk=0`
(at 10^5 and 10^6 the default is chunked; `train_chunk=0` forces the (N, n) logits).

Framework overhead (issue 28): a model so small that host time dominates its step (1x32 LSTM, 1,000 types, batch
20 x 20, one thread), lmtrain full against the plain loop (`lmtrain_full_over_plain`; 400 steps stay in one epoch
of the generated corpus, which the plain loop reads once):

    python scripts/bench_train.py --experiment none --data synthetic:1000 --outputs full --threads 1 \
        --override model.num_layers=1 --override model.hidden_dim=32 --override model.emb_dim=32 \
        --override data.batch_size=20 --override data.bptt=20 --steps 400 --warmup 50 --rounds 9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from lmtrain.common.precision import lstm_region
from lmtrain.config import compose_config
from lmtrain.process.memory import reuse_freed_memory
from lmtrain.run.run import train
from lmtrain.tools.run_records import read_metrics, training_throughput


def data_overrides(data: str | None) -> list[str]:
    """``ptb`` -> data=ptb; ``zipf:N`` -> the generated corpus with N types; None -> the experiment's data."""
    if not data:
        return []
    name, _, size = data.partition(":")
    return [f"data={name}", *([f"data.vocab_size={int(float(size))}"] if size else [])]


def data_size(data: str | None) -> int | None:
    return int(float(data.partition(":")[2])) if data and ":" in data else None


def cell_steps(entry: str, data: str | None, args: argparse.Namespace) -> tuple[int, int, int]:
    """(steps, warmup, interval) of a cell: ``--steps-for OUTPUT@N=STEPS`` rules, else the defaults."""
    for rule in args.steps_for:
        target, _, steps = rule.partition("=")
        output, _, size = target.partition("@")
        if output == entry.split(":")[0] and (not size or int(float(size)) == (data_size(data) or 0)):
            return int(steps), 1, 1
    return args.steps, args.warmup, args.interval


def base_overrides(args: argparse.Namespace, data: str | None) -> list[str]:
    experiment = [] if args.experiment == "none" else [f"experiment={args.experiment}"]
    device = {"cpu": ["trainer.accelerator=cpu"], "cuda": ["trainer.accelerator=gpu"]}.get(args.device, [])
    threads = [f"threads={args.threads}"] if args.threads else []
    return [*experiment, *data_overrides(data), *device, *threads, *args.override]


def round_overrides(
    output: str,
    own: Sequence[str],
    steps: int,
    interval: int,
    args: argparse.Namespace,
    run_dir: Path,
    data: str | None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The overrides of one timed round of ``output`` with its ``own`` overrides (and the ``extra`` ones) on
    ``data``: ``steps`` optimizer steps, metrics every ``interval``, training only (no validation, test,
    checkpoints or W&B), writing to ``run_dir``."""
    return [
        *base_overrides(args, data),
        f"output={output}",
        *own,
        *extra,
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        f"trainer.log_every_n_steps={interval}",
        "test_after_fit=false",
        "logger=csv",
        "progress_bar=false",
        "checkpoint_every_n_steps=1000000000",
        f"run_dir={run_dir}",
        f"reuse_freed_memory={not args.default_malloc}",
    ]


def lmtrain_round(
    entry: str, args: argparse.Namespace, workdir: Path, index: int, data: str | None = None
) -> tuple[float, list[float]]:
    """One timed round of ``entry``: an output strategy, optionally with its own overrides after colons
    (``uniform:++output.shared_negatives=false:++output.num_samples=1000``). Returns its tokens/s and the
    ``train/loss`` of every step."""
    output, *own = entry.split(":")
    steps, warmup, interval = cell_steps(entry, data, args)
    run_dir = workdir / f"{len(list(workdir.iterdir()))}-{index}"
    cfg = compose_config(round_overrides(output, own, steps, interval, args, run_dir, data))
    train(cfg)
    losses = [value for _, _, value in read_metrics(run_dir / "metrics.csv")["train/loss"]]
    return training_throughput(run_dir, warmup), losses


def parse_bench_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """A side-by-side bench's arguments, with the ones every such bench takes (``--threads``, ``--json``) added and
    the command line kept (``args.argv``) for the record's ``command``."""
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def labelled(entry: str) -> tuple[str, str]:
    """``LABEL=OUTPUT[:OVERRIDE...]`` -> (LABEL, OUTPUT[:OVERRIDE...]); an entry without a label is its own label.
    A label is told from an override by coming before the first colon."""
    head = entry.split(":", 1)[0]
    return tuple(entry.split("=", 1)) if "=" in head else (entry, entry)  # type: ignore[return-value]


def peak_memory_mib(device: str) -> float:
    """This process's peak memory: resident set (CPU) or torch's peak allocated CUDA memory."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def isolated_round(entry: str, args: argparse.Namespace, workdir: Path, index: int, data: str | None) -> dict:
    """``lmtrain_round`` in a fresh child process: its tokens/s and peak memory."""
    cell = {"entry": entry, "data": data, "workdir": str(workdir), "index": index}
    argv = [sys.executable, __file__, *args.argv, "--cell", json.dumps(cell)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cell {entry} on {data} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plain_round(
    args: argparse.Namespace, data: str | None = None, max_seconds: float | None = None, read_loss: bool = False
) -> float:
    """The hand-written full-softmax loop on the same data layout and model sizes, on ``args.device`` (else the
    trainer's accelerator) and under autocast for ``trainer.precision=bf16-mixed``; ``max_seconds`` ends it early.
    ``read_loss``: the host reads each step's loss right after the forward pass, as lmtrain's step does (its one
    sync, for the non-finite check and the metrics); without it the loop never waits for the device."""
    cfg = compose_config(base_overrides(args, data))
    dm = instantiate(cfg.data)
    dm.setup()
    n, m = dm.num_classes, cfg.model
    device = torch.device(
        args.device or ("cuda" if cfg.trainer.accelerator != "cpu" and torch.cuda.is_available() else "cpu")
    )
    emb = torch.nn.Embedding(n, m.emb_dim)
    lstm = torch.nn.LSTM(m.emb_dim, m.hidden_dim, m.num_layers, batch_first=True, dropout=m.dropout)
    proj = torch.nn.Linear(m.hidden_dim, n)
    params = [*emb.parameters(), *lstm.parameters(), *proj.parameters()]
    for p in params:
        torch.nn.init.uniform_(p, -m.init_range, m.init_range)
    emb, lstm, proj = emb.to(device), lstm.to(device), proj.to(device)  # in place: ``params`` follow
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as lmtrain's runs set it
    mixed = str(cfg.trainer.precision) == "bf16-mixed"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if mixed else contextlib.nullcontext
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # the clock reads an idle device
    opt = torch.optim.SGD(params, lr=cfg.optim.lr)
    clip = cfg.optim.clip  # read once: a config lookup costs as much host time as a small model's kernel
    state, tokens, start = None, 0, time.perf_counter()
    for step, (x, y) in enumerate(dm.train_dataloader()):  # data loading is timed, as it is in lmtrain's rate
        if step >= args.steps or (max_seconds and step > args.warmup and time.perf_counter() - start > max_seconds):
            break
        if step == args.warmup:
            wait()
            tokens, start = 0, time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(), lstm_region(device):  # float32 where the CPU has no bfloat16 LSTM, as lmtrain runs it
            out, state = lstm(emb(x), state)
            loss = F.cross_entropy(proj(out).reshape(-1, n), y.reshape(-1)) * x.shape[1]
        if read_loss:
            loss.item()
        state = tuple(s.detach() for s in state)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        tokens += x.numel()
    wait()
    return tokens / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--outputs",
        default="full,uniform,unigram,nce,negative,hsm,adaptive,quadratic,rff",
        help="comma list of strategies; an entry may add its own overrides after colons, e.g. "
        "uniform:++output.shared_negatives=false, and a label before '=': target=sampled:sampler=target",
    )
    parser.add_argument("--experiment", default="zaremba_small", help="an experiment config, or none")
    parser.add_argument("--data", default=None, help="comma list of corpora: ptb, wikitext2, zipf:N (N types)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=int, default=10, help="steps per tokens_per_sec measurement")
    parser.add_argument(
        "--steps-for",
        action="append",
        default=[],
        help="OUTPUT@N=STEPS: that many steps for an output on the zipf:N corpus (timed from the second, "
        "every step measured); OUTPUT=STEPS on every corpus (repeatable)",
    )
    parser.add_argument("--isolate", action="store_true", help="every cell in its own child process; adds peak memory")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain-PyTorch full-softmax loop")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the trainer's accelerator=auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="write the results to this path")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: one isolated round
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's allocator defaults (reuse_freed_memory=false); otherwise lmtrain's setting is applied "
        "before any round, so the plain loop runs under it too",
    )
    args = parser.parse_args(argv)
    args.argv = [a for a in (sys.argv[1:] if argv is None else argv)]
    if args.cell is not None:
        args.argv = args.argv[: args.argv.index("--cell")]
    if not args.default_malloc:
        reuse_freed_memory()  # process-wide: both loops alike
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as lmtrain.run.run.train does, so the reference is not slowed by subnormals
    if args.cell is not None:  # a child of --isolate: one round, one JSON line
        cell = json.loads(args.cell)
        rate, losses = lmtrain_round(cell["entry"], args, Path(cell["workdir"]), cell["index"], cell["data"])
        print(json.dumps({"tokens_per_sec": rate, "peak_mib": peak_memory_mib(args.device or "cpu"), "loss": losses}))
        return {}
    outputs = [labelled(o)[0] for o in args.outputs.split(",") if o]
    entries = dict(labelled(o) for o in args.outputs.split(",") if o)
    corpora: list[str | None] = [d for d in args.data.split(",") if d] if args.data else [None]
    samples: dict[str, dict[str, list[float]]] = {str(d): {o: [] for o in outputs} for d in corpora}
    peaks: dict[str, dict[str, float]] = {str(d): {} for d in corpora}
    losses: dict[str, dict[str, list[float]]] = {str(d): {} for d in corpora}  # each cell's last round
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for data in corpora:
                for output in outputs:
                    entry = entries[output]
                    if args.isolate:
                        got = isolated_round(entry, args, Path(tmp), index, data)
                        rate, losses[str(data)][output] = got["tokens_per_sec"], got["loss"]
                        peaks[str(data)][output] = max(peaks[str(data)].get(output, 0.0), got["peak_mib"])
                    else:
                        rate, losses[str(data)][output] = lmtrain_round(entry, args, Path(tmp), index, data)
                    samples[str(data)][output].append(rate)
                    print(f"round {index} {data} {output}: {samples[str(data)][output][-1]:,.0f} tokens/s", flush=True)
                if not args.no_plain:
                    samples[str(data)].setdefault("plain_full", []).append(plain_round(args, data))
    tables = {data: table(cells, peaks[data], losses[data], step_tokens(args, data)) for data, cells in samples.items()}
    result = {
        "command": shlex.join(["python", "scripts/bench_train.py", *args.argv]),
        "experiment": args.experiment,
        "steps": args.steps,
        "steps_for": args.steps_for,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "reuse_freed_memory": not args.default_malloc,
        "peak_memory": "child ru_maxrss (MiB)" if args.device != "cuda" else "torch.cuda.max_memory_allocated (MiB)",
        **(tables["None"] if corpora == [None] else {"corpora": tables}),
    }
    for data, found in tables.items():
        median = found["tokens_per_sec"]
        width = max(12, *(len(key) for key in median))
        print(f"data {data}\n{'output':<{width}} {'tokens/s':>10} {'ms/step':>9} {'x full':>8} {'peak MiB':>9}")
        for key, value in median.items():
            ratio = found["ratio_to_full"].get(key)
            peak = found["peak_mib"].get(key)
            cols = f"{key:<{width}} {value:>10,.0f} {found['ms_per_step'][key]:>9,.1f} "
            cols += f"{ratio:>8.2f}" if ratio else " " * 8
            print(cols + (f" {peak:>9,.0f}" if peak else ""))
        if found["lmtrain_full_over_plain"]:
            print(f"lmtrain full / plain PyTorch loop: {found['lmtrain_full_over_plain']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def step_tokens(args: argparse.Namespace, data: str) -> int:
    """Tokens in one training window (batch x bptt) of the corpus ``data`` (a key of the tables)."""
    cfg = compose_config(base_overrides(args, None if data == "None" else data))
    return int(cfg.data.batch_size * cfg.data.bptt)


def table(samples: dict[str, list[float]], peaks: dict[str, float], losses: dict, tokens: int) -> dict:
    """Medians, step times, ratios to full, peak memory and the last round's losses of one corpus's cells."""
    median = {k: statistics.median(v) for k, v in samples.items() if v}
    full, plain = median.get("full"), median.get("plain_full")
    return {
        "tokens_per_sec": median,
        "ms_per_step": {k: 1000 * tokens / v for k, v in median.items()},
        "samples": samples,
        "ratio_to_full": {k: v / full for k, v in median.items()} if full else {},
        "lmtrain_full_over_plain": full / plain if full and plain else None,
        "peak_mib": peaks,
        "train_loss": losses,
    }


if __name__ == "__main__":
    main()
