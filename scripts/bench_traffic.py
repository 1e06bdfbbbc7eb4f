"""Modelled memory traffic of one training step, per strategy and vocabulary size, with its launches and syncs.

    python scripts/bench_traffic.py --json docs/bench/traffic_1e6.json
    python scripts/bench_traffic.py --sizes 100000 --outputs full:output.train_chunk=0,rff --top 8

One ``lmtrain.training.step.train_step`` of the default model (2x200 LSTM) on a batch of 20 x 35 random tokens
(``--batch``), m = 100 where a strategy samples, in a GPU's forms (``step_forms=gpu``, run here on the CPU), is
counted with ``lab.traffic.TrafficCounter`` after a warm-up step: the bytes each operator must read and
write at least (the model is in that module's docstring), the operators that launch work and the host syncs, and
the call sites in lmtrain's code that move the most. Counts are exact and machine-independent; on a GPU of B
bytes/s the step's operators need at least GiB / B, beside its launches' host time.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch
from bench_launches import overrides
from lab.traffic import KIND, count_step_traffic
from records.bench import traffic_table

OUTPUTS = (
    "full:output.train_chunk=0",  # dense, as on a GPU (the CPU budget would chunk it at 10^6)
    "unigram",
    "rff",
    "rff:output.shared_negatives=true",
    "quadratic:output.shared_negatives=true",  # per-position quadratic at 10^6 needs more than 22 GiB to count here
    "hsm",
    "adaptive:output.logits_mib=8192",  # dense tails, as a GPU's budget (a sixteenth of its memory) keeps them
)
GIB = 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="comma list of vocabulary sizes")
    parser.add_argument("--outputs", default=",".join(OUTPUTS), help="comma list of OUTPUT[:OVERRIDE...]")
    parser.add_argument("--batch", default="20x35", help="B x T")
    parser.add_argument("--top", type=int, default=5, help="call sites listed per cell")
    parser.add_argument("--threads", type=int, default=1, help="torch threads: counts do not depend on them")
    parser.add_argument("--json", type=Path, help="write the record here (and the table as NAME.md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    outputs = args.outputs.split(",")
    rows_cols = tuple(int(x) for x in args.batch.lower().split("x"))
    command = "python scripts/bench_traffic.py " + " ".join(sys.argv[1:] if argv is None else argv)
    record = {
        "kind": KIND,
        "command": command.strip(),
        "batch": args.batch,
        "sizes": sizes,
        "outputs": outputs,
        "rows": [],
    }
    for n in sizes:
        for output in outputs:
            counts, traffic = count_step_traffic([*overrides(output), "step_forms=gpu"], n, rows_cols)
            gc.collect()  # the cell's model and tree are cycles: freed now, before the next cell's (GiBs at 10^6)
            row = {"output": output, "n": n, "bytes": traffic.bytes, "macs": traffic.macs, "launches": counts.launches}
            row |= {"syncs": counts.syncs, "top": traffic.top(args.top)}
            record["rows"].append(row)
            print(
                f"{output} at n = {n:,}: {traffic.bytes / GIB:.2f} GiB, {traffic.macs / 1e9:.1f} G multiply-adds, "
                f"{counts.launches} operators, "
                f"{counts.syncs} syncs",
                flush=True,
            )
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(record, indent=1) + "\n")
                args.json.with_suffix(".md").write_text(traffic_table(record))
    print(traffic_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
