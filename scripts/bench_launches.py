"""Operators that launch work and host syncs of one training step, per strategy, vocabulary size and step forms.

    python scripts/bench_launches.py --json docs/bench/launches.json
    python scripts/bench_launches.py --sizes 10000 --outputs rff,unigram --execution gpu

One ``lmtrain.training.step.train_step`` (forward, backward, clipping, the optimizer step and the after-step tree
update) of the default model (2x200 LSTM) on a batch of 20 x 35 random tokens, m = 100 where a strategy samples,
is counted with ``lab.launches.DispatchCounter`` after two warm-up steps, for every strategy at each
vocabulary size (Zipf counts, no corpus) and in a CPU's and a GPU's step forms (``--execution cpu,gpu``: the config's
``step_forms=cpu|gpu``; a GPU's forms run on the CPU, so the counts are the operators a GPU would launch; a record's
rows keep the key ``execution``). Counts are exact and machine-independent. The budgets
of the GPU paths (the issue on GPU-speed sampling) are checked and printed: at most one host sync per step; kernel
samplers at most 3x unigram's operators and the same count (within 5%) at every size; the strategies of
``WITHIN_THE_RULE`` at most 1.5x full's plus its sampler's own draw (``lab.launches.count_draw``: the proposal and
the m negatives drawn from it, counted alone; recorded as ``draw_launches`` on the GPU rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.launches import count_draw, count_train_step
from records.bench import launches_table

OUTPUTS = (
    "full",
    "uniform",
    "unigram",
    "bigram",
    "exp",
    "quadratic",
    "quadratic:output.shared_negatives=true",
    "rff",
    "rff:output.shared_negatives=true",
    "nce",
    "negative",
    "hsm",
    "adaptive",
    "dsoftmax",
    "charcnn",
    "mos",
    "quartic",
    "sampled:sampler=target",
    "sampled:sampler=adaptive_ngram",
    "sampled:sampler=inbatch",
    "full:output.self_normalize=0.1",
    "full:output.self_normalize=0.1:output.normalize_fraction=0.1",
)
KERNEL = ("quadratic", "rff")
# The strategies held to 1.5x full's operators plus their draw (tests/test_launch_budgets.py reads this tuple). The
# others add work by design (a character CNN, K softmaxes, a proposal's own scoring or adaptation, the log Z
# penalty): here they are held to the sync budget; the tests hold charcnn and the added proposals to rules of their own
WITHIN_THE_RULE = ("hsm", "nce", "negative", "uniform", "unigram", "exp", "bigram", "adaptive", "dsoftmax")


def overrides(entry: str) -> list[str]:
    """``rff:output.shared_negatives=true`` -> [output=rff, output.shared_negatives=true]."""
    name, *extra = entry.split(":")
    return [f"output={name}", *extra]


def budgets(rows: list[dict]) -> list[str]:
    """The GPU paths' budgets, one line each: PASS or FAIL and the numbers."""
    gpu = {(r["output"], r["n"]): r for r in rows if r["execution"] == "gpu"}
    lines = []
    for (output, n), row in sorted(gpu.items()):
        verdict = "PASS" if row["syncs"] <= 1 else "FAIL"
        lines.append(f"{verdict} syncs <= 1: {output} at n = {n}: {row['syncs']}")
    for (output, n), row in sorted(gpu.items()):
        full = gpu.get(("full", n))
        if output not in WITHIN_THE_RULE or not full:
            continue
        limit = 1.5 * full["launches"] + row["draw_launches"]
        verdict = "PASS" if row["launches"] <= limit else "FAIL"
        lines.append(
            f"{verdict} <= 1.5x full + draw: {output} at n = {n}: {row['launches']} vs 1.5 x {full['launches']} + "
            f"{row['draw_launches']} = {limit:g}"
        )
    for output in sorted({o for o, _ in gpu if o.split(":")[0] in KERNEL}):
        counts = {n: row["launches"] for (o, n), row in gpu.items() if o == output}
        for n, count in sorted(counts.items()):
            unigram = gpu.get(("unigram", n))
            if unigram:
                verdict = "PASS" if count <= 3 * unigram["launches"] else "FAIL"
                lines.append(f"{verdict} <= 3x unigram: {output} at n = {n}: {count} vs {unigram['launches']}")
        spread = (max(counts.values()) - min(counts.values())) / min(counts.values())
        verdict = "PASS" if spread <= 0.05 else "FAIL"
        lines.append(f"{verdict} same count at every n (5%): {output}: {sorted(counts.items())} ({spread:.1%})")
    others = sorted({o for o, _ in gpu if o not in (*WITHIN_THE_RULE, "full") and o.split(":")[0] not in KERNEL})
    if others:
        lines.append(f"held to the sync budget only (no 1.5x rule): {', '.join(others)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outputs", default=",".join(OUTPUTS), help="strategies, comma-separated (name:override)")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="vocabulary sizes, comma-separated")
    parser.add_argument("--execution", default="cpu,gpu", help="step forms (step_forms=...), comma-separated")
    parser.add_argument("--override", action="append", default=[], help="extra config overrides for every cell")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'output':<42} {'n':>9} {'execution':>9} {'launches':>9} {'syncs':>6}  sync operators")
    for n in (int(float(s)) for s in args.sizes.split(",")):
        for entry in args.outputs.split(","):
            for execution in args.execution.split(","):
                counts = count_train_step([*overrides(entry), f"step_forms={execution}", *args.override], n)
                row = {"output": entry, "n": n, "execution": execution, **counts.as_dict()}
                if execution == "gpu":  # the sampler's own draw, counted alone (0 without a sampler)
                    row["draw_launches"] = count_draw([*overrides(entry), "step_forms=gpu", *args.override], n).launches
                rows.append(row)
                syncs = ", ".join(f"{k} {v}" for k, v in counts.sync_ops.items())
                print(f"{entry:<42} {n:>9} {execution:>9} {counts.launches:>9} {counts.syncs:>6}  {syncs}", flush=True)
    checks = budgets(rows)
    print("\n".join(checks))
    if args.json:
        command = "python scripts/bench_launches.py " + " ".join(argv if argv is not None else sys.argv[1:])
        record = {"command": command.strip(), "batch": [20, 35], "rows": rows, "budgets": checks}
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        args.json.with_suffix(".md").write_text(launches_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
