"""Kernel-tree walks and updates at the PTB and the 10^6 shape, against this machine's memory bandwidth.

    python scripts/bench_walk.py --threads 1 --json docs/bench/walk.json [--sizes 10000,1000000] [--rounds 3]

For each vocabulary size n (an RFF tree, D = 1024, d = 200, N = 700 queries, m = 100 draws per query, as in an
``output=rff`` step on a 20 x 35 batch) this reports:

- **walks** (issue 12 item 5): the walks per step (N m), the bytes one walk reads if it reads its own node pairs
  and bucket (depth x 2F node values + L x d row values: the memory floor of a walk that shares nothing), the
  sampling time of ``KernelTree.sample`` and the read bandwidth that achieves (walks x bytes / time), beside a
  copy and a read benchmark of this machine in the same process. The walk as it was before issue 12
  (``--before``: every level below ~12,000 nodes as one GEMM, gathers in 16 MiB blocks) is timed beside it.
- **updates** (item 4): after the draws of a step, the rows an SGD step changes (targets and drawn ids: per
  example; targets and m draws of the batch-shared mixture for m = 100 and 1,000), the tree update's time with
  delta updates (the default: phi(new) minus the cached phi(old)), without the feature cache (phi(new) - phi(old),
  two feature vectors) and with every changed bucket recomputed (``refresh=0``, no cache: the old update), beside
  the sampling time of the same mode (the draws; and the draws plus the N targets' log q, the proposal's whole
  share of a step).

``--projection bfloat16`` builds the measured tree with ``sampler.projection=bfloat16`` (the other trees
stay float32). All cells run in this one process, rounds interleaved; times are
medians of process CPU time (steadier than wall time on a shared machine; both are in the JSON).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from lmtrain.sampler.kernel import KernelTree, RandomFourierFeatures
from lmtrain.sampler.kernel import walk as walk_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab.provenance import write_record  # noqa: E402
from walk_probes import Before, bandwidth, clocked, storage_trial, walk_bytes  # noqa: E402  (this folder's module)


def shape(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build the tree for n classes and the per-round cells (closures) that are timed."""
    gen = torch.Generator().manual_seed(args.seed + n)
    weight = 0.1 * torch.randn(n, args.dim, generator=gen)
    tree = KernelTree(RandomFourierFeatures(D=args.D, seed=0, projection=args.projection))
    baselines = {  # float32 trees without the feature cache: deltas of two feature vectors, and the update before
        "uncached": KernelTree(RandomFourierFeatures(D=args.D, seed=0), feature_cache="off"),  # issue 12
        "recompute": KernelTree(RandomFourierFeatures(D=args.D, seed=0), refresh=0, feature_cache="off"),
    }
    build = clocked(lambda: tree.rebuild(weight))
    for other in baselines.values():
        other.rebuild(weight.clone())
    query = torch.randn(args.positions, args.dim, generator=gen)
    target = ((torch.rand(args.positions, generator=gen) * torch.log(torch.tensor(n + 1.0))).exp().long() - 1).clamp(
        0, n - 1
    )  # Zipf-like targets
    return {
        "n": n,
        "tree": tree,
        "baselines": baselines,
        "weight": weight,
        "query": query,
        "target": target,
        "build_s": build[0],
    }


def changed_rows(ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.unique(torch.cat([ids.reshape(-1), target]))


def round_cells(cell: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """One round of every timing at one n."""
    tree, weight, query = cell["tree"], cell["weight"], cell["query"]
    out: dict[str, tuple[float, float]] = {}
    drawn: dict[str, torch.Tensor] = {}
    with Before(tree):
        out["sample_before"] = clocked(lambda: tree.sample(query, args.num_samples))
    box: dict[str, Any] = {}
    out["sample"] = clocked(lambda: box.update(per=tree.sample(query, args.num_samples)))
    out["targets_per_example"] = clocked(lambda: tree.log_q(query, cell["target"].view(-1, 1)))
    drawn["per_example"] = box["per"][0]
    for m in args.shared:
        mixture = clocked(lambda: box.update(psi=tree.mixture(query)))
        out[f"sample_shared_m{m}"] = clocked(lambda m=m: box.update(s=tree.sample_mixture(box["psi"], m)))
        out[f"sample_shared_m{m}"] = tuple(a + b for a, b in zip(out[f"sample_shared_m{m}"], mixture, strict=True))
        out[f"targets_shared_m{m}"] = clocked(lambda: tree.log_q_mixture(box["psi"], cell["target"]))
        drawn[f"shared_m{m}"] = box["s"][0]
    for mode, ids in drawn.items():
        rows = changed_rows(ids, cell["target"])
        step = 0.01 * torch.randn(rows.numel(), weight.shape[1])
        weight[rows] += step  # an SGD step on those rows, in place
        out[f"update_{mode}"] = clocked(lambda rows=rows: tree.update(weight, rows))
        for name, other in cell["baselines"].items():
            out[f"update_{name}_{mode}"] = clocked(lambda rows=rows, other=other: other.update(weight, rows))
        out[f"rows_{mode}"] = (float(rows.numel()), float(rows.numel()))  # a count, reported apart from the times
    return out


def summarize(
    cell: dict[str, Any], samples: list[dict[str, tuple[float, float]]], bw: dict[str, float], args: argparse.Namespace
) -> dict[str, Any]:
    tree = cell["tree"]
    med = {
        key: {
            "wall_s": statistics.median(s[key][0] for s in samples),
            "cpu_s": statistics.median(s[key][1] for s in samples),
        }
        for key in samples[0]
        if not key.startswith("rows_")
    }
    rows = {key[5:]: statistics.median(s[key][0] for s in samples) for key in samples[0] if key.startswith("rows_")}
    walks = args.positions * args.num_samples
    per_walk = walk_bytes(tree, args.dim)
    dense_levels = sum(
        tree.walk.dense(
            2 << lv, args.positions, 2 * args.num_samples, tree.walk.dense_factor / walk_module.LEVEL_GATHER_GAIN
        )
        for lv in range(tree.depth)
    )
    with Before(tree):
        dense_before = sum(tree.walk.dense(2 << lv, args.positions, 2 * args.num_samples) for lv in range(tree.depth))
    result: dict[str, Any] = {
        "n": cell["n"],
        "depth": tree.depth,
        "leaf_size": tree.bucket_size,
        "buckets": tree.num_buckets,
        "features": tree.nodes.shape[1],
        "tree_mib": tree.nodes.numel() * tree.nodes.element_size() / 2**20,
        "build_s": cell["build_s"],
        "walks_per_step": walks,
        "bytes_per_walk": per_walk,
        "gemm_levels": dense_levels,
        "gemm_levels_before": dense_before,
        "changed_rows": rows,
        "times": med,
    }
    for key in ("sample", "sample_before"):
        result[f"{key}_read_gbs"] = walks * per_walk / med[key]["cpu_s"] / 1e9
    result["fraction_of_read_bandwidth"] = result["sample_read_gbs"] / bw["read_gbs"]
    for mode in ["per_example", *(f"shared_m{m}" for m in args.shared)]:
        sample = med["sample" if mode == "per_example" else f"sample_{mode}"]["cpu_s"]
        result[f"update_over_sample_{mode}"] = med[f"update_{mode}"]["cpu_s"] / sample
        result[f"update_over_proposal_{mode}"] = med[f"update_{mode}"]["cpu_s"] / (
            sample + med[f"targets_{mode}"]["cpu_s"]
        )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,1000000", help="comma list of vocabulary sizes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--positions", type=int, default=700, help="N queries per step (batch x bptt)")
    p.add_argument("--num-samples", type=int, default=100, help="m draws per query (per example)")
    p.add_argument("--shared", default="100,1000", help="m of the batch-shared mode (comma list)")
    p.add_argument("--dim", type=int, default=200)
    p.add_argument("--D", type=int, default=1024, help="random frequencies (2D features)")
    p.add_argument("--projection", default="float32", help="sampler.projection of the tree (float32, bfloat16)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", help="cpu only: the bandwidth and CPU-time figures are CPU's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("bench_walk.py measures CPU memory bandwidth and CPU time; run it with --device cpu")
    args.shared = [int(x) for x in args.shared.split(",") if x]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bw = bandwidth()
    print(f"memory: copy {bw['copy_gbs']:.1f} GB/s (read + write), read {bw['read_gbs']:.1f} GB/s", flush=True)
    results: dict[str, Any] = {
        "env": {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor()},
        "projection": args.projection,
        "bandwidth": bw,
        "sizes": {},
    }
    for n in (int(float(x)) for x in args.sizes.split(",")):
        cell = shape(n, args)
        samples = [round_cells(cell, args) for _ in range(args.rounds)]
        row = summarize(cell, samples, bw, args)
        row["storage_trial"] = storage_trial(cell["tree"], cell["query"], args.num_samples)
        results["sizes"][str(n)] = row
        t = row["times"]
        print(
            f"n={n}: depth {row['depth']}, leaf {row['leaf_size']}, {row['gemm_levels']} GEMM levels "
            f"(before: {row['gemm_levels_before']}), {row['bytes_per_walk'] / 1e3:.0f} kB per walk, "
            f"{row['walks_per_step']} walks",
            flush=True,
        )
        print(
            f"  sample {t['sample']['cpu_s'] * 1e3:.0f} ms cpu ({row['sample_read_gbs']:.1f} GB/s, "
            f"{100 * row['fraction_of_read_bandwidth']:.0f}% of read bandwidth); before "
            f"{t['sample_before']['cpu_s'] * 1e3:.0f} ms ({row['sample_before_read_gbs']:.1f} GB/s)",
            flush=True,
        )
        trial = row["storage_trial"]
        print(
            f"  one gathered level: float32 nodes {trial['float32_s'] * 1e3:.0f} ms, bfloat16 nodes widened after "
            f"the gather {trial['bfloat16_s'] * 1e3:.0f} ms",
            flush=True,
        )
        for mode in ["per_example", *(f"shared_m{m}" for m in args.shared)]:
            sample = t["sample" if mode == "per_example" else f"sample_{mode}"]["cpu_s"]
            print(
                f"  {mode}: {row['changed_rows'][mode]:.0f} changed rows; "
                f"update {t[f'update_{mode}']['cpu_s'] * 1e3:.1f} ms"
                f" (no cache: {t[f'update_uncached_{mode}']['cpu_s'] * 1e3:.1f} ms, recompute buckets: "
                f"{t[f'update_recompute_{mode}']['cpu_s'] * 1e3:.1f} ms) vs sampling "
                f"{sample * 1e3:.1f} ms: update / sample {row[f'update_over_sample_{mode}']:.2f}; the targets' log q "
                f"{t[f'targets_{mode}']['cpu_s'] * 1e3:.1f} ms, update / (sample + targets) "
                f"{row[f'update_over_proposal_{mode}']:.2f}",
                flush=True,
            )
        del cell, samples
    again = bandwidth()  # the machine may be shared: keep the better of two measurements, both in the JSON
    results["bandwidth_end"] = again
    print(f"memory at the end: copy {again['copy_gbs']:.1f} GB/s, read {again['read_gbs']:.1f} GB/s", flush=True)
    best = max(bw["read_gbs"], again["read_gbs"])
    for n, row in results["sizes"].items():
        row["fraction_of_best_read_bandwidth"] = row["sample_read_gbs"] / best
        print(
            f"n={n}: walks read {row['sample_read_gbs']:.1f} GB/s = {100 * row['fraction_of_best_read_bandwidth']:.0f}%"
            f" of the better read bandwidth measured ({best:.1f} GB/s)"
        )
    if args.json:
        write_record(args.json, results)
    return results


if __name__ == "__main__":
    main()
