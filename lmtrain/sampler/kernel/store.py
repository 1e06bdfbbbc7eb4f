"""The node sums of a kernel tree and their maintenance: build from the weights, refresh changed buckets."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.cache import FeatureCache
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.fixed_update import FixedUpdate
from lmtrain.sampler.options import KernelOptions

# elements of the temporaries of one chunk of changed rows (8 MiB): small enough to stay in cache and to be reused
# without page faults, large enough for few Python steps (docs/architecture.md, measured design choices)
UPDATE_CHUNK = 1 << 21
# the largest temporary of a GPU path's block (4 GiB of float32): blocks there bound memory, not cache use. At
# 10^6 types the default model's quadratic tree recomputes its 16,384 leaves in one product (870 M elements, 3.2 GiB;
# the tree itself holds 2.5 GiB), so the step launches what it launches at 10^4 and 10^5
GPU_BLOCK_ELEMENTS = 1 << 30
DELTA_COST = 2  # a changed row's delta costs two member rows of a bucket recompute (phi(new) and phi(old))


class TreeStore(nn.Module):
    """The node sums of a ``KernelTree``: a complete binary tree over buckets of classes whose nodes store
    z(C) = sum of phi(w_j), j in C.

    Classes are cut into ``2^depth`` contiguous buckets of at most ``leaf_size`` classes (spread
    evenly; trailing buckets may be empty, have zero sums and are never chosen). ``nodes`` is a heap
    array (2B - 1, F): node i has children 2i + 1 and 2i + 2; ``floor`` (2B - 1,) is the clamp of each
    node's score, eps for non-empty nodes and 0 for empty ones. ``leaf_size=None`` uses F / d
    (F = dim phi, d = dim w), which keeps the node memory between 2 and 4 times the weight matrix's n d floats
    whatever F is: 2B - 1 nodes of F = L d floats, B = n / L rounded up to a power of two. The store only holds
    and maintains the sums: the walks over them live in ``TreeWalk``, the per-class scores in ``KernelTree``.

    ``features`` is borrowed, not owned: the ``KernelTree`` that builds this store registers the feature map (so
    it is checkpointed and moved once, under ``tree.features``) and the store only computes with it.

    ``update`` brings the buckets holding changed rows up to date. With a ``FeatureCache`` (``feature_cache``,
    the phi(w) of every class) a changed row enters its bucket as phi(new) - cached phi(old), one feature vector
    per row. Without one, a bucket either is recomputed from the weights (``FeatureMap.node_sums`` of its L rows)
    or, when fewer than L / 2 of its rows changed, takes node_sums(new rows) - node_sums(old rows) of the changed
    rows only, grouped by bucket (for the quadratic map that is S(new) - S(old), two small GEMMs); the old rows
    come from ``previous``, a copy of the weights as of the last update (n x d floats more). Ancestors are then
    re-summed from their children, so they never drift from their leaves. Float deltas round a little at every
    add: a bucket that has taken ``refresh`` delta updates is recomputed (from the cache, or from the weights)
    at its next change, which bounds that drift (tests: 10^4 rounds equal a rebuild).
    """

    features: FeatureMap

    def __init__(self, features: FeatureMap, options: KernelOptions, chunk_elements: int = 1 << 22) -> None:
        super().__init__()
        self.fixed_backend = False  # the backend, chosen by the sampler for the device (KernelTree.use_fixed_backend)
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
        self.fixed_update = FixedUpdate(self, options.tree_update)  # the GPU paths' update (not a module: no tensors)

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
        self.fixed_update.updates = 0  # the GPU paths' count of updates since the leaves were recomputed

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the buckets holding ``rows`` up to the current ``weight`` (recomputed, or by deltas for the
        changed rows: see the class docstring) and re-sum their ancestors. The GPU paths: ``FixedUpdate``."""
        if self.fixed_backend:
            self.fixed_update.update(weight, rows)
            return
        self.weight = weight
        if rows.numel() == 0:
            return
        rows = torch.unique(rows)  # sorted: the rows of one bucket are contiguous
        owner = torch.div(rows, self.bucket_size, rounding_mode="floor")
        buckets, inverse, changed = torch.unique(owner, return_inverse=True, return_counts=True)
        recompute = self.deltas[buckets] >= self.refresh  # refresh 0: every changed bucket
        if not self.cache.active:  # a delta costs two rows' node sums, a recompute all L of the bucket's
            size = (self.num_classes - buckets * self.bucket_size).clamp(max=self.bucket_size)  # classes per bucket
            recompute |= DELTA_COST * changed >= size
        by_delta = ~recompute[inverse]
        self._add_deltas(rows, owner, by_delta)
        self.deltas[buckets] += 1
        self.deltas[buckets[recompute]] = 0
        self.set_leaves(buckets[recompute])
        if 8 * buckets.numel() > self.num_buckets:  # most ancestors change: re-sum whole levels
            self.resum_levels(self.nodes)
            return
        heap = buckets + (self.num_buckets - 1)
        pairs = self.nodes[1:].view(-1, 2, self.nodes.shape[1])  # pairs[i]: both children of node i
        step = max(1, self.chunk_elements // (3 * self.nodes.shape[1]))  # blocks bound the temporaries (no page faults)
        for _ in range(self.depth):
            heap = torch.unique(torch.div(heap - 1, 2, rounding_mode="floor"))
            for lo in range(0, heap.numel(), step):
                children = pairs.index_select(0, heap[lo : lo + step])  # (h, 2, F)
                self.nodes.index_copy_(0, heap[lo : lo + step], torch.add(children[:, 0], children[:, 1]))

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
        step = max(1, (GPU_BLOCK_ELEMENTS if self.fixed_backend else self.chunk_elements) // per_bucket)
        for start in range(0, buckets.numel(), step):  # chunks of buckets bound the memory
            chunk = buckets[start : start + step]
            if cached:
                sums = self.cache.bucket_sums(chunk, size, self.nodes.dtype)
            else:
                sums = self.features.node_sums(*self.members(chunk))
            self.nodes.index_copy_(0, chunk + (self.num_buckets - 1), sums)

    def _add_deltas(self, rows: Tensor, owner: Tensor, by_delta: Tensor) -> None:
        """Leaf of bucket ``owner[i]`` += phi(new row) - phi(old row) for the sorted ``rows[by_delta]``. With a cache
        every changed row's cached phi becomes phi(new) (the old one is the delta's); without, the old rows are
        ``previous`` and every changed row is copied there."""
        leaf = owner + (self.num_buckets - 1)
        if self.cache.active:
            step = max(1, UPDATE_CHUNK // (self.weight.shape[1] + 2 * self.nodes.shape[1]))
            for lo in range(0, rows.numel(), step):
                keep = by_delta[lo : lo + step]  # rows of buckets recomputed below only refresh the cache
                delta = self.cache.swap(self.features, self.weight, rows[lo : lo + step], keep)  # (k, F)
                self.nodes.index_add_(0, leaf[lo : lo + step][keep], delta)
            return
        if self.refresh:
            self._add_grouped_deltas(rows[by_delta], owner[by_delta])
            self.previous[rows] = self.weight[rows]

    def _add_grouped_deltas(self, rows: Tensor, owner: Tensor) -> None:
        """Leaves += node_sums(new rows) - node_sums(old rows) over each bucket's changed rows (sorted by bucket).
        Buckets go in blocks of similar change counts, each padded to its largest count (little padding)."""
        if rows.numel() == 0:
            return
        buckets, counts = torch.unique_consecutive(owner, return_counts=True)  # (G,) each
        starts = counts.cumsum(0) - counts
        order = counts.argsort()
        ranked = counts[order].tolist()
        dim, lo = self.weight.shape[1], 0
        while lo < len(ranked):  # ascending counts: the block's last group is its widest
            hi = lo + 1
            while (
                hi < len(ranked)
                and 2 * (hi + 1 - lo) * self.features.sum_elements(ranked[hi], dim) <= self.chunk_elements
            ):
                hi += 1
            group, width = order[lo:hi], ranked[hi - 1]
            slot = torch.arange(width, device=rows.device)
            valid = slot < counts[group].unsqueeze(1)  # (g, c)
            where = rows[(starts[group].unsqueeze(1) + slot).clamp(max=rows.numel() - 1)].view(-1)  # (g c,)
            new, old = (
                rows_of.index_select(0, where).view(group.numel(), width, -1)
                for rows_of in (self.weight, self.previous)
            )
            sums = self.features.delta_sums(new, old, valid)  # (g, F)
            self.nodes.index_add_(0, buckets[group] + (self.num_buckets - 1), sums)
            lo = hi

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
        On the GPU paths blocks exist only to bound memory (``GPU_BLOCK_ELEMENTS``), not for a cache."""
        limit = GPU_BLOCK_ELEMENTS if self.fixed_backend else min(self.chunk_elements, budget or self.chunk_elements)
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
