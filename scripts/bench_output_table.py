"""The report of scripts/bench_output.py: the JSON it writes (settings, cells, ratios, targets), its console table."""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

import torch


def report(
    results: list[dict[str, Any]],
    scaling: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    plain: str,
    reference: str,
) -> dict[str, Any]:
    """The JSON of a run: its settings, every cell, the ratios per output and the issue's targets for
    ``reference`` (the strategy the targets are about) against ``plain`` (the plain-PyTorch reference)."""
    median = {(r["output"], r["n"]): r["median_s"] for r in results}
    ratios: dict[str, dict[str, Any]] = {}
    for name in args.outputs:
        sizes = [n for n in args.sizes if (name, n) in median]
        if not sizes:
            continue
        entry: dict[str, Any] = {"plain_over": {}, "full_over": {}}
        for n in sizes:
            if (plain, n) in median:
                entry["plain_over"][str(n)] = median[(plain, n)] / median[(name, n)]
            if ("full", n) in median:
                entry["full_over"][str(n)] = median[("full", n)] / median[(name, n)]
        entry["scaling"] = median[(name, sizes[-1])] / median[(name, sizes[0])] if len(sizes) > 1 else None
        entry["scaling_interleaved"] = scaling[name]["ratio"] if name in scaling else None
        ratios[name] = entry
    top, bottom = max(args.sizes), min(args.sizes)
    ref = ratios.get(reference, {})
    targets = dict(
        n=top,
        plain_over_uniform=ref.get("plain_over", {}).get(str(top)),
        plain_target=50.0,
        full_over_uniform=ref.get("full_over", {}).get(str(top)),
        full_target=1000.0,
        uniform_scaling=ref.get("scaling_interleaved") or ref.get("scaling"),
        uniform_scaling_cells=ref.get("scaling"),
        scaling_target=2.0,
        scaling_sizes=[bottom, top],
    )
    config = {k: v for k, v in vars(args).items() if k != "json"}
    config.update(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        machine=platform.machine(),
        command=" ".join(["python", *sys.argv]),
    )
    return {"config": config, "results": results, "scaling": scaling, "ratios": ratios, "targets": targets}


def print_table(data: dict[str, Any]) -> None:
    """The medians per output and size, the ratios and the verdicts on the targets, for the console."""
    print(f"\n{'output':>14} " + " ".join(f"{'n=' + str(n):>14}" for n in data["config"]["sizes"]))
    names = list(dict.fromkeys(r["output"] for r in data["results"]))
    median = {(r["output"], r["n"]): r["median_s"] for r in data["results"]}
    for name in names:
        cells = [
            f"{1e3 * median[(name, n)]:11.2f} ms" if (name, n) in median else f"{'-':>14}"
            for n in data["config"]["sizes"]
        ]
        print(f"{name:>14} " + " ".join(cells))
    print("\nratios (plain / X, full / X at each n; X at largest n / X at smallest n):")
    for name, entry in data["ratios"].items():
        plain = ", ".join(f"{n}: {v:.1f}x" for n, v in entry["plain_over"].items())
        full = ", ".join(f"{n}: {v:.1f}x" for n, v in entry["full_over"].items())
        scaling = f"{entry['scaling']:.2f}" if entry["scaling"] is not None else "-"
        if entry["scaling_interleaved"] is not None:
            scaling += f" (interleaved {entry['scaling_interleaved']:.2f})"
        print(f"  {name:>12}: plain/X [{plain}]  full/X [{full}]  scaling {scaling}")
    t = data["targets"]

    def verdict(value: float | None, goal: float, above: bool) -> str:
        if value is None:
            return "not measured"
        met = value >= goal if above else value <= goal
        return f"{value:.2f} ({'meets' if met else 'MISSES'} {goal:g})"

    plain, full = verdict(t["plain_over_uniform"], 50, True), verdict(t["full_over_uniform"], 1000, True)
    scaling = verdict(t["uniform_scaling"], 2, False)
    low, high = t["scaling_sizes"]
    print(f"\ntargets at n={t['n']}: plain/uniform {plain}; full/uniform {full}; ", end="")
    print(f"uniform n={high} / n={low} {scaling}")
