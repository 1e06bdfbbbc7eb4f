"""The node sums of a kernel tree: built from the weights, and what both backends' walks and updates read."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.cache import FeatureCache
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.options import KernelOptions

# the largest temporary of a fixed backend's block (4 GiB of float32): blocks there bound memory, not cache use. At
# 10^6 types the default model's quadratic tree recomputes its 16,384 leaves in one product (870 M elements, 3.2 GiB;
# the tree itself holds 2.5 GiB), so the step launches what it launches at 10^4 and 10^5
GPU_BLOCK_ELEMENTS = 1 << 30


class TreeStore(nn.Module):
    """The node sums of a ``KernelTree``: a complete binary tree over buckets of classes whose nodes store
    z(C) = sum of phi(w_j), j in C.

    Classes are cut into ``2^depth`` contiguous buckets of at most ``leaf_size`` classes (spread
    evenly; trailing buckets may be empty, have zero sums and are never chosen). ``nodes`` is a heap
    array (2B - 1, F): node i has children 2i + 1 and 2i + 2; ``floor`` (2B - 1,) is the clamp of each
    node's score, eps for non-empty nodes and 0 for empty ones. ``leaf_size=None`` uses F / d
    (F = dim phi, d = dim w), which keeps the node memory between 2 and 4 times the weight matrix's n d floats
    whatever F is: 2B - 1 nodes of F = L d floats, B = n / L rounded up to a power of two. The store holds the sums
    and builds them from the weights; the tree's backend walks them and updates them after a step
    (``WalkBackend.update``, ``FixedUpdate``), with ``FeatureCache`` (``feature_cache``: phi(w) of every class) and,
    without one, ``previous`` (a copy of the weights as of the last update, n x d floats more), and counts what
    bounds float drift: ``deltas``, each bucket's delta updates since it was recomputed (the walk's), and
    ``updates``, the updates since every leaf was (the fixed backend's).

    ``features`` is borrowed, not owned: the ``KernelTree`` that builds this store registers the feature map (so
    it is checkpointed and moved once, under ``tree.features``) and the store only computes with it.
    """

    features: FeatureMap

    def __init__(self, features: FeatureMap, options: KernelOptions, chunk_elements: int = 1 << 22) -> None:
        super().__init__()
        self.block_limit: int | None = None  # the backend's (``TreeBackend.block_limit``): None, cache-sized blocks
        self.refresh = int(options.refresh)
        object.__setattr__(self, "features", features)  # borrowed: a plain assignment would register it here too
        self.cache = FeatureCache(options.feature_cache)
        self.leaf_size = None if options.leaf_size is None else int(options.leaf_size)
        self.eps, self.chunk_elements = float(options.eps), chunk_elements
        self.num_classes = self.depth = self.bucket_size = 0
        self.weight: Tensor | None = None  # the latest weights given to rebuild/update (not a buffer)
        self.register_buffer("nodes", torch.empty(0), persistent=False)  # (2B - 1, F)
        self.register_buffer("floor", torch.empty(0), persistent=False)  # (2B - 1,) eps or 0 (empty)
        self.register_buffer("previous", torch.empty(0), persistent=False)  # (n, d) the rows the leaves hold
        self.register_buffer("deltas", torch.empty(0), persistent=False)  # (B,) delta updates since a recompute
        self.slots = torch.arange(0)  # (L,) 0..L-1, the slots of a bucket (made once per bucket size and device)
        self.updates = 0  # the fixed backend's updates since every leaf was recomputed (``FixedUpdate``)

    @property
    def num_buckets(self) -> int:
        """B = 2^depth buckets (leaves)."""
        return 1 << self.depth

    # --- building -------------------------------------------------------------------------------
    def rebuild(self, weight: Tensor) -> None:
        """Recompute every node from ``weight`` (n, d)."""
        n, dim = weight.shape
        size = self.leaf_size or max(1, math.ceil(self.features.out_features(dim) / dim))
        self.depth = max(0, math.ceil(math.log2(math.ceil(n / size))))
        self.bucket_size, self.num_classes = math.ceil(n / self.num_buckets), n
        self.weight = weight
        buckets = self.num_buckets
        starts = torch.arange(buckets, device=weight.device) * self.bucket_size
        counts = (n - starts).clamp(0, self.bucket_size)  # (B,) classes per bucket
        shape = (2 * buckets - 1, self.features.out_features(dim))
        if self.nodes.shape != shape or self.nodes.dtype != weight.dtype or self.nodes.device != weight.device:
            self.nodes = weight.new_empty(shape)  # every row is written below
        sizes = torch.zeros(2 * buckets - 1, dtype=torch.long, device=weight.device)
        sizes[buckets - 1 :] = counts
        self.cache.fill(self.features, weight, buckets * self.bucket_size, self.chunk_elements)
        self.set_leaves(torch.arange(buckets, device=weight.device))
        self.resum_levels(self.nodes)
        self.resum_levels(sizes)
        self.floor = torch.where(sizes > 0, self.eps, 0.0).to(weight.dtype)
        self.previous = weight.clone() if self.refresh and not self.cache.active else weight.new_empty(0)
        self.deltas = torch.zeros(buckets, dtype=torch.int32, device=weight.device)
        self.updates = 0

    def resum_levels(self, heap: Tensor, stop: int = 0) -> None:
        """Every internal node of a heap array down from level ``stop`` := left child + right child, bottom-up."""
        for level in reversed(range(stop, self.depth)):
            lo, hi = (1 << level) - 1, (2 << level) - 1
            torch.add(heap[hi : 2 * hi + 1 : 2], heap[hi + 1 : 2 * hi + 1 : 2], out=heap[lo:hi])  # no temporary

    def set_leaves(self, buckets: Tensor) -> None:
        """Leaves of ``buckets`` := the sum of their classes' features (from the cache, or computed from the rows)."""
        dim, size = self.weight.shape[1], self.bucket_size
        cached = self.cache.active
        per_bucket = size * self.nodes.shape[1] if cached else self.features.sum_elements(size, dim)
        step = max(1, (self.block_limit or self.chunk_elements) // per_bucket)
        for start in range(0, buckets.numel(), step):  # chunks of buckets bound the memory
            chunk = buckets[start : start + step]
            if cached:
                sums = self.cache.bucket_sums(chunk, size, self.nodes.dtype)
            else:
                sums = self.features.node_sums(*self.members(chunk))
            self.nodes.index_copy_(0, chunk + (self.num_buckets - 1), sums)

    # --- what the walks and the scorings read --------------------------------------------------------
    def member_ids(self, buckets: Tensor) -> Tensor:
        """Class ids (..., L) of the slots of ``buckets`` (...); ids >= n are the padding of the last buckets."""
        slots = self.slots
        if slots.numel() != self.bucket_size or slots.device != buckets.device:
            self.slots = slots = torch.arange(self.bucket_size, device=buckets.device)  # (L,), kept: one launch less
        return torch.add(slots, buckets.unsqueeze(-1), alpha=self.bucket_size)  # (..., L) bucket x L + slot

    def members(self, buckets: Tensor) -> tuple[Tensor, Tensor]:
        """Rows (..., L, d) of the classes in ``buckets`` (...) and their validity mask (..., L)."""
        ids = self.member_ids(buckets)
        rows = self.weight.index_select(0, ids.clamp(max=self.num_classes - 1).view(-1))
        return rows.view(*ids.shape, -1), ids < self.num_classes

    def blocks(self, fn: Callable[[int, int], Tensor], count: int, per_item: int, budget: int | None = None) -> Tensor:
        """fn over blocks of ``count`` items (queries, nodes) sized so each block's temporaries hold about
        ``budget`` elements (default ``chunk_elements``; ``per_item`` elements per item), concatenated along dim 0.
        Under a backend's ``block_limit`` (the fixed one's) blocks exist only to bound memory, not for a cache."""
        limit = self.block_limit or min(self.chunk_elements, budget or self.chunk_elements)
        step = max(1, limit // per_item)
        if step >= count:
            return fn(0, count)
        return torch.cat([fn(lo, min(lo + step, count)) for lo in range(0, count, step)])

    # --- device moves ---------------------------------------------------------------------------
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> TreeStore:
        out = super()._apply(fn, recurse)
        if self.weight is not None:  # keep sampling valid until the next update() re-links the weights
            self.weight = fn(self.weight)
        return out
