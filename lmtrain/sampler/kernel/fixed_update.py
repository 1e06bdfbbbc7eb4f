"""A kernel tree's after-step update with fixed shapes: the GPU path of ``TreeStore.update`` (``execution=gpu``).

``TreeStore.update`` finds the distinct changed rows and buckets with ``torch.unique``, counts each bucket's delta
updates and re-sums only the changed ancestors: every one of those sizes depends on the data, a host sync on a GPU.
Here every shape is known before the step:

- with a feature cache (RFF's default), every changed row enters its bucket as phi(new) - cached phi(old); the
  repeats of a row (found by sorting) add theirs to the leaf's parent instead, which the re-sum below rewrites, so
  they are not removed; when a step names at least n rows, all n rows go through with the unchanged ones masked,
  which is cheaper than the duplicates;
- float drift is bounded as on the CPU path (a bucket is recomputed from the cache after at most ``refresh``
  updates), by recomputing every leaf from the cache at every ``refresh``-th update (n F reads, once in a while);
- without a cache (quadratic), every leaf is recomputed from the weights: one batched product per block, exact;
- then the ``SUMMED_LEVELS`` levels above the leaves are re-summed from their children (one addition per level), and
  every level above them at once: one product of a sparse 0/1 matrix (each node's descendants on the lowest of
  those levels, built once per device) with that level's nodes. The operator count does not grow with the depth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lmtrain.sampler.kernel.heap_paths import descendant_matrix

if TYPE_CHECKING:
    from lmtrain.sampler.kernel.store import TreeStore

# levels above the leaves re-summed by one addition each; the levels above them come from one sparse product, whose
# matrix has (depth - SUMMED_LEVELS) x 2^(depth - SUMMED_LEVELS) ones: with 3, it reads about 2 x the leaves' values
# at depth 17 (10^6 classes, rff), where pairwise sums read 1 x
SUMMED_LEVELS = 3


class FixedUpdate:
    """``TreeStore.update`` for the GPU paths (see the module docstring); ``updates`` counts them since the leaves
    were last recomputed from the cache."""

    def __init__(self, store: TreeStore) -> None:
        self.store = store
        self.updates = 0
        self._descendants: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}
        self._buckets: dict[tuple[int, torch.device], Tensor] = {}  # the last ``every_bucket``
        self._parents: dict[tuple, Tensor] = {}  # the last ``leaf_and_parent``
        self._members: dict[tuple[int, int, int, torch.device], tuple[Tensor, Tensor]] = {}  # ``set_every_leaf``'s

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the tree up to ``weight`` (n, d) after the rows ``rows`` (R,) changed (repeats allowed)."""
        store = self.store
        store.weight = weight
        if rows.numel() == 0:
            return
        if store.cache.active:
            self._add_cached_deltas(weight, rows)
            self.updates += 1
            if self.updates >= store.refresh:  # refresh 0: every time
                self.set_every_leaf()
                self.updates = 0
        else:
            self.set_every_leaf()
        self.resum(store.nodes)

    def resum(self, heap: Tensor) -> None:
        """Every internal node of the heap array ``heap`` (2B - 1, F) := the sum of its children, in at most
        ``SUMMED_LEVELS`` + 1 operators whatever the depth (see the module docstring)."""
        top = max(0, self.store.depth - SUMMED_LEVELS)
        self.store.resum_levels(heap, stop=top)
        if top:
            count = (1 << top) - 1  # nodes above level ``top``
            torch.mm(self.descendants(top, heap), heap[count : 2 * count + 1], out=heap[:count])

    def descendants(self, level: int, like: Tensor) -> Tensor:
        """The sparse CSR matrix (2^level - 1, 2^level) of ones where column c (a node of ``level``) lies below row r
        (a node above it, heap order), of ``like``'s dtype and device; made once per level, device and dtype."""
        key = (level, like.device, like.dtype)
        if key not in self._descendants:
            self._descendants[key] = descendant_matrix(level, like)
        return self._descendants[key]

    def leaf_and_parent(self) -> Tensor:
        """(n, 2) the heap index of every class's leaf and of its parent (-1 in a tree of one leaf, which has
        none), made once per tree shape and device."""
        store = self.store
        key = (store.num_classes, store.bucket_size, store.depth, store.nodes.device)
        if key not in self._parents:
            classes = torch.arange(store.num_classes, device=store.nodes.device)
            leaf = torch.div(classes, store.bucket_size, rounding_mode="floor") + store.num_buckets - 1
            self._parents = {key: torch.stack([leaf, torch.div(leaf - 1, 2, rounding_mode="floor")], 1)}
        return self._parents[key]

    def set_every_leaf(self) -> None:
        """Every leaf := the sum of its classes' features (``TreeStore.set_leaves`` of every bucket), from the cache or
        from the rows; in one block where the memory budget allows, gathering the rows with the (B, L) member ids and
        validity of every bucket, made once per tree shape (else by ``set_leaves``' blocks)."""
        from lmtrain.sampler.kernel.store import GPU_BLOCK_ELEMENTS  # the store imports this module

        store = self.store
        size, buckets = store.bucket_size, store.num_buckets
        leaves = store.nodes[buckets - 1 :]  # (B, F)
        if store.cache.active:
            leaves.copy_(store.cache.table.view(buckets, size, -1).sum(1, dtype=leaves.dtype))
            return
        if buckets * store.features.sum_elements(size, store.weight.shape[1]) > GPU_BLOCK_ELEMENTS:
            store.set_leaves(self.every_bucket())
            return
        key = (store.num_classes, size, buckets, store.nodes.device)
        if key not in self._members:
            ids = store.member_ids(self.every_bucket())  # (B, L)
            self._members = {key: (ids.clamp(max=store.num_classes - 1).view(-1), ids < store.num_classes)}
        rows, valid = self._members[key]
        store.features.node_sums(store.weight.index_select(0, rows).view(buckets, size, -1), valid, out=leaves)

    def every_bucket(self) -> Tensor:
        """(B,) 0..B - 1, made once per tree shape and device."""
        store = self.store
        key = (store.num_buckets, store.nodes.device)
        if key not in self._buckets:
            self._buckets = {key: torch.arange(store.num_buckets, device=store.nodes.device)}
        return self._buckets[key]

    def _add_cached_deltas(self, weight: Tensor, rows: Tensor) -> None:
        store, cache = self.store, self.store.cache
        n = store.num_classes
        if rows.numel() >= n:  # every row once, the unchanged ones masked (their cached phi is kept as it is)
            counted = torch.zeros(n, dtype=torch.bool, device=rows.device).index_fill_(0, rows, True)  # (n,)
            prepared = store.features.prepare(weight)  # (n, d)
            new = store.features.of_prepared(prepared, cache.table.dtype)  # (n, F) as the cache stores it
            cache.keep_prepared(None, prepared)
            old = cache.table[:n]  # (n, F): what the tree's sums hold
            new = torch.where(counted.unsqueeze(1), new, old)  # unchanged rows keep their cached features
            leaf = self.leaf_and_parent()[:, 0]  # (n,)
            store.nodes.index_add_(0, leaf, new.to(store.nodes.dtype) - old.to(store.nodes.dtype))
            old.copy_(new)
            return
        rows = rows.sort().values  # (R,) sorted, repeats masked: only a row's first occurrence adds its delta
        counted = torch.ones_like(rows, dtype=torch.bool)
        torch.ne(rows[1:], rows[:-1], out=counted[1:])
        prepared = store.features.prepare(weight.index_select(0, rows))  # (R, d)
        new = store.features.of_prepared(prepared, cache.table.dtype)  # (R, F) as the cache stores it
        cache.keep_prepared(rows, prepared)  # repeats of a row write the same values
        old = cache.table.index_select(0, rows)  # (R, F): what the tree's sums hold for these rows
        # old (the cache's dtype) is promoted to the nodes' inside the subtraction: a cast's values, one operator fewer
        delta = torch.sub(new.to(store.nodes.dtype), old)  # (R, F) in the nodes' dtype
        if store.num_buckets > 1:  # a row's first occurrence adds to its leaf, a repeat to the leaf's parent, which
            leaf, parent = self.leaf_and_parent().index_select(0, rows).unbind(1)  # ``resum`` rewrites next: (R,) each
            store.nodes.index_add_(0, torch.where(counted, leaf, parent), delta)  # no pass over delta to mask them
        else:  # the one leaf is the root: the repeats' deltas masked
            store.nodes.index_add_(0, torch.zeros_like(rows), delta * counted.unsqueeze(1))
        cache.table.index_copy_(0, rows, new)  # repeats of a row write the same values
