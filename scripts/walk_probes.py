"""Probes for scripts/bench_walk.py: clocks, this machine's memory bandwidth, a walk's bytes, the walk's old settings
and a trial of node sums stored in bfloat16."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lmtrain.sampler.kernel import KernelTree
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
        self.saved = walk_module.LEVEL_GATHER_GAIN, self.tree.walk.gather_elements
        walk_module.LEVEL_GATHER_GAIN, self.tree.walk.gather_elements = 1, self.tree.store.chunk_elements

    def __exit__(self, *exc: object) -> None:
        walk_module.LEVEL_GATHER_GAIN, self.tree.walk.gather_elements = self.saved


def storage_trial(tree: KernelTree, query: torch.Tensor, k: int, repeats: int = 3) -> dict[str, float]:
    """CPU seconds of one gathered level (every walker reads its node pair, one batched product per block of
    queries, as ``TreeWalk._gathered_scores`` does) with the node sums stored in float32, and stored in bfloat16
    and widened to float32 after the gather (float32 products): does halving the bytes read pay?"""
    phi = tree.features(query)
    pairs = tree.nodes[1:].view(-1, 2 * phi.shape[1])
    narrow = pairs.bfloat16()
    pos = torch.randint(0, pairs.shape[0], (query.shape[0] * k,))
    step = max(1, tree.walk.gather_elements // (2 * k * phi.shape[1]))

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
