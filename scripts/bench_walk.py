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
  delta updates (the default) and with every changed bucket recomputed (``refresh=0``, the old update), beside
  the sampling time of the same mode (the draws; and the draws plus the N targets' log q, the proposal's whole
  share of a step).

``--projection bfloat16`` builds the measured tree with ``sampler.projection=bfloat16`` (the recompute tree
stays the float32 update before issue 12). All cells run in this one process, rounds interleaved; times are
medians of process CPU time (steadier than wall time on a shared machine; both are in the JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lmtrain.sampler.kernel import KernelTree, RandomFourierFeatures
from lmtrain.sampler.kernel import walk as walk_module


def clocked(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, CPU) seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bandwidth(mib: int = 512, repeats: int = 5) -> dict[str, float]:
    """GB/s of a copy (bytes read + bytes written) and of a read (a sum) of ``mib`` MiB, best of ``repeats``."""
    src = torch.empty(mib * 2**18).uniform_()
    dst = torch.empty_like(src)
    size = src.numel() * 4
    copy = min(clocked(lambda: dst.copy_(src))[0] for _ in range(repeats))
    read = min(clocked(src.sum)[0] for _ in range(repeats))
    return {"copy_gbs": 2 * size / copy / 1e9, "read_gbs": size / read / 1e9, "mib": mib}


def walk_bytes(tree: KernelTree, dim: int) -> int:
    """Bytes one walk reads when it reads its own nodes: two children per level and its bucket's rows."""
    node = tree.nodes.shape[1] * tree.nodes.element_size()
    return tree.depth * 2 * node + tree.bucket_size * dim * tree.weight.element_size()


class Before:
    """The walk's settings before issue 12: every level dense below the old crossover, 16 MiB gather blocks."""

    def __init__(self, tree: KernelTree) -> None:
        self.tree = tree

    def __enter__(self) -> None:
        self.saved = walk_module.LEVEL_GATHER_GAIN, self.tree.gather_elements
        walk_module.LEVEL_GATHER_GAIN, self.tree.gather_elements = 1, self.tree.chunk_elements

    def __exit__(self, *exc: object) -> None:
        walk_module.LEVEL_GATHER_GAIN, self.tree.gather_elements = self.saved


def storage_trial(tree: KernelTree, query: torch.Tensor, k: int, repeats: int = 3) -> dict[str, float]:
    """CPU seconds of one gathered level (every walker reads its node pair, one batched product per block of
    queries, as ``TreeWalk._gathered_scores`` does) with the node sums stored in float32, and stored in bfloat16
    and widened to float32 after the gather (float32 products): does halving the bytes read pay?"""
    phi = tree.features(query)
    pairs = tree.nodes[1:].view(-1, 2 * phi.shape[1])
    narrow = pairs.bfloat16()
    pos = torch.randint(0, pairs.shape[0], (query.shape[0] * k,))
    step = max(1, tree.gather_elements // (2 * k * phi.shape[1]))

    def level(table: torch.Tensor) -> None:
        for lo in range(0, phi.shape[0], step):
            hi = min(lo + step, phi.shape[0])
            z = table.index_select(0, pos[lo * k : hi * k]).view(hi - lo, 2 * k, -1).float()
            torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2))

    found = {"float32_s": [], "bfloat16_s": []}
    for _ in range(repeats):
        found["float32_s"].append(clocked(lambda: level(pairs))[1])
        found["bfloat16_s"].append(clocked(lambda: level(narrow))[1])
    return {key: statistics.median(v) for key, v in found.items()}


def shape(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build the tree for n classes and the per-round cells (closures) that are timed."""
    gen = torch.Generator().manual_seed(args.seed + n)
    weight = 0.1 * torch.randn(n, args.dim, generator=gen)
    tree = KernelTree(RandomFourierFeatures(D=args.D, seed=0, projection=args.projection))
    recompute = KernelTree(RandomFourierFeatures(D=args.D, seed=0), refresh=0)  # the update before issue 12
    build = clocked(lambda: tree.rebuild(weight))
    recompute.rebuild(weight.clone())
    query = torch.randn(args.positions, args.dim, generator=gen)
    target = ((torch.rand(args.positions, generator=gen) * torch.log(torch.tensor(n + 1.0))).exp().long() - 1).clamp(
        0, n - 1
    )  # Zipf-like targets
    return {
        "n": n,
        "tree": tree,
        "recompute": recompute,
        "weight": weight,
        "query": query,
        "target": target,
        "build_s": build[0],
    }


def changed_rows(ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.unique(torch.cat([ids.reshape(-1), target]))


def round_cells(cell: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """One round of every timing at one n."""
    tree, recompute, weight, query = cell["tree"], cell["recompute"], cell["weight"], cell["query"]
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
        out[f"update_recompute_{mode}"] = clocked(lambda rows=rows: recompute.update(weight, rows))
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
        tree._dense(2 << lv, args.positions, 2 * args.num_samples, tree.dense_factor / walk_module.LEVEL_GATHER_GAIN)
        for lv in range(tree.depth)
    )
    with Before(tree):
        dense_before = sum(tree._dense(2 << lv, args.positions, 2 * args.num_samples) for lv in range(tree.depth))
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
                f" (recompute buckets: {t[f'update_recompute_{mode}']['cpu_s'] * 1e3:.1f} ms) vs sampling "
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
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
