"""A kernel tree's after-step update with fixed shapes: the fixed backend's (``FixedBackend.update``).

The walk's update (``WalkBackend.update``) finds the distinct changed rows and buckets with ``torch.unique``, counts
each bucket's delta updates and re-sums only the changed ancestors: every one of those sizes depends on the data, a
host sync on a GPU. Here every shape is known before the step:

- with a feature cache (RFF's default), every changed row enters its bucket as phi(new) - cached phi(old); the
  repeats of a row (found by sorting) add theirs to the leaf's parent instead, which the re-sum below rewrites, so
  they are not removed; when a step names at least n rows, all n rows go through with the unchanged ones masked,
  which is cheaper than the duplicates;
- float drift is bounded as on the CPU path (a bucket is recomputed from the cache after at most ``refresh``
  updates), by recomputing every leaf from the cache at every ``refresh``-th update (n F reads, once in a while);
- without a cache (quadratic), every leaf is recomputed from the weights: one batched product per block, exact
  (but for the path deltas below);
- then the ``SUMMED_LEVELS`` levels above the leaves are re-summed from their children (one addition per level), and
  every level above them at once: one product of a sparse 0/1 matrix (each node's descendants on the lowest of
  those levels, built once per device) with that level's nodes. The operator count does not grow with the depth.

A step that changes few rows for its tree (batch-shared negatives at 10^6 classes: R = m + N = 800 rows against
2^14 quadratic or 2^17 rff buckets) skips that re-sum of every node: each changed bucket's delta is added to its
leaf and to every ancestor at once (one ``index_add_`` of R (depth + 1) rows), which ``by_paths`` picks where it
touches fewer node values. Without a cache the changed buckets' leaves are recomputed from the weights and enter
the same way, as new leaf - old leaf. Those ancestors then hold sums that were added to, not re-summed, so their
rounding drifts like the leaves' deltas; the ``refresh``-th update recomputes every leaf and re-sums the tree,
which bounds it alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmtrain.sampler.kernel.heap_paths import descendant_matrix
from lmtrain.sampler.kernel.store import GPU_BLOCK_ELEMENTS, TreeStore

# levels above the leaves re-summed by one addition each; the levels above them come from one sparse product, whose
# matrix has (depth - SUMMED_LEVELS) x 2^(depth - SUMMED_LEVELS) ones: with 3, it reads about 2 x the leaves' values
# at depth 17 (10^6 classes, rff), where pairwise sums read 1 x
SUMMED_LEVELS = 3
# node values a re-sum of the tree touches, per bucket and feature (``by_paths``): each summed level's children read
# and its nodes written (3 (1/2 + 1/4 + 1/8) B F), and the product's level read and its ancestors written (B F / 4)
WHOLE_COST = 2.9
# node values the path deltas touch per changed row, level and feature: the (R, depth + 1, F) deltas written, read
# back by ``index_add_``, and each node row it adds to read and written
PATH_COST = 4


class FixedUpdate:
    """The fixed backend's update (see the module docstring); the store's ``updates`` counts them since the leaves
    were last recomputed. ``mode`` (``sampler.tree_update``): ``auto`` chooses path deltas or a re-sum by
    ``by_paths``' count, ``paths`` takes the deltas wherever they fit the memory budget, ``resum`` never."""

    def __init__(self, store: TreeStore, mode: str) -> None:
        self.store = store
        self.mode = mode
        self._descendants: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}
        self._tables: dict[tuple, Tensor] = {}  # index tables of the current tree shape (``_table``)
        self._shape: tuple = ()  # that shape: classes, bucket size, depth, device

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the tree up to ``weight`` (n, d) after the rows ``rows`` (R,) changed (repeats allowed)."""
        store = self.store
        store.weight = weight
        if rows.numel() == 0:
            return
        cached = store.cache.active
        store.updates += 1
        paths = store.updates < store.refresh and self.by_paths(rows.numel())  # refresh 0: never
        if cached:
            self._add_cached_deltas(weight, rows, paths)
        elif paths:
            self._add_bucket_deltas(rows)
        if paths:
            return
        if store.updates >= store.refresh or not cached:  # without a cache every leaf, unless by paths
            self.set_every_leaf()
            store.updates = 0
        self.resum(store.nodes)

    def by_paths(self, rows: int) -> bool:
        """Whether ``rows`` changed rows enter the tree by path deltas (the module docstring): in ``auto`` mode when
        they touch fewer values than a re-sum of the tree, counting without a cache the leaves recomputed (theirs
        against every bucket's); in any mode only where their temporaries fit the memory budget. Decided by shapes
        alone: a step's operators are known before it runs."""
        store = self.store
        if self.mode == "resum" or store.depth == 0 or rows >= store.num_classes:
            return False
        features, buckets, levels = store.nodes.shape[1], store.num_buckets, store.depth + 1
        recompute = 0 if store.cache.active else store.features.sum_elements(store.bucket_size, store.weight.shape[1])
        if max(rows * recompute, rows * levels * features) > GPU_BLOCK_ELEMENTS:
            return False
        whole = WHOLE_COST * buckets * features + buckets * recompute
        return self.mode == "paths" or PATH_COST * rows * levels * features + rows * recompute <= whole

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

    def _table(self, kind: str, make: Callable[[], Tensor], *extra: object) -> Tensor:
        """The index table ``kind`` of the current tree shape and device (and ``extra``), made by ``make`` once;
        tables of an earlier shape are dropped."""
        store = self.store
        shape = (store.num_classes, store.bucket_size, store.depth, store.nodes.device)
        if shape != self._shape:
            self._tables, self._shape = {}, shape
        key = (kind, *extra)
        if key not in self._tables:
            self._tables[key] = make()
        return self._tables[key]

    def every_bucket(self) -> Tensor:
        """(B,) 0..B - 1."""
        return self._table("buckets", lambda: torch.arange(self.store.num_buckets, device=self.store.nodes.device))

    def leaf_and_parent(self) -> Tensor:
        """(n, 2) the heap index of every class's leaf and of its parent (-1 in a tree of one leaf, which has none)."""
        store = self.store

        def make() -> Tensor:
            classes = torch.arange(store.num_classes, device=store.nodes.device)
            leaf = torch.div(classes, store.bucket_size, rounding_mode="floor") + store.num_buckets - 1
            return torch.stack([leaf, torch.div(leaf - 1, 2, rounding_mode="floor")], 1)

        return self._table("parents", make)

    def members(self) -> tuple[Tensor, Tensor]:
        """Every bucket's member ids (B, L), clamped to n - 1, and their validity (B, L) (the padding of the last)."""
        n = self.store.num_classes
        valid = self._table("valid", lambda: self.store.member_ids(self.every_bucket()) < n)
        return self._table("clamped", lambda: self.store.member_ids(self.every_bucket()).clamp(max=n - 1)), valid

    def leaf_sums(self, buckets: Tensor | None = None, out: Tensor | None = None) -> Tensor:
        """The leaves (R, F) of ``buckets`` (R,) (None: every bucket) recomputed from the weights: the sum of their
        classes' features, gathered with ``members``; written into ``out`` where given."""
        ids, valid = self.members()  # (B, L) each
        if buckets is not None:
            ids, valid = ids.index_select(0, buckets), valid.index_select(0, buckets)  # (R, L) each
        rows = self.store.weight.index_select(0, ids.view(-1)).view(*ids.shape, -1)  # (R, L, d)
        return self.store.features.node_sums(rows, valid, out=out)

    def paths(self) -> Tensor:
        """(B, depth + 1) the heap rows of every bucket's leaf and ancestors: node i's k-th ancestor is
        ((i + 1) >> k) - 1, so bucket b's is (b + B - 2^k) >> k."""
        store = self.store

        def make() -> Tensor:
            shifts = torch.arange(store.depth + 1, device=store.nodes.device)  # (depth + 1,) k
            lifts = torch.ones_like(shifts).bitwise_left_shift(shifts) - store.num_buckets  # 2^k - B
            return (self.every_bucket().unsqueeze(1) - lifts) >> shifts

        return self._table("paths", make)

    def first_of_each(self, sorted_ids: Tensor) -> Tensor:
        """(R,) bool: whether each of the sorted ids (R,) is the first of its value (a scratch tensor, reused)."""
        first = self._table("first", lambda: torch.ones_like(sorted_ids, dtype=torch.bool), sorted_ids.numel())
        torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])  # first[0] stays True
        return first

    def set_every_leaf(self) -> None:
        """Every leaf := the sum of its classes' features (``TreeStore.set_leaves`` of every bucket), from the cache or
        from the rows; in one block where the memory budget allows, gathering the rows with ``members`` (else by
        ``set_leaves``' blocks)."""
        store = self.store
        size, buckets = store.bucket_size, store.num_buckets
        leaves = store.nodes[buckets - 1 :]  # (B, F)
        if store.cache.active:
            leaves.copy_(store.cache.table.view(buckets, size, -1).sum(1, dtype=leaves.dtype))
            return
        if buckets * store.features.sum_elements(size, store.weight.shape[1]) > GPU_BLOCK_ELEMENTS:
            store.set_leaves(self.every_bucket())
            return
        self.leaf_sums(out=leaves)

    def _add_along_paths(self, buckets: Tensor, delta: Tensor, counted: Tensor) -> None:
        """Add ``delta`` (R, F) to the leaves of ``buckets`` (R,) and to every ancestor of each, where ``counted``
        (R,) (bool); a repeat (not counted) adds nothing."""
        nodes = self.paths().index_select(0, buckets)  # (R, depth + 1) heap rows
        share = delta.unsqueeze(1).expand(-1, nodes.shape[1], -1) * counted.view(-1, 1, 1)  # (R, depth + 1, F)
        self.store.nodes.index_add_(0, nodes.view(-1), share.view(-1, delta.shape[1]))

    def _add_bucket_deltas(self, rows: Tensor) -> None:
        """Without a cache, by paths: every changed bucket's leaf recomputed from the weights enters as new - old."""
        store = self.store
        buckets = torch.div(rows, store.bucket_size, rounding_mode="floor").sort().values  # (R,) repeats adjacent
        old = store.nodes[store.num_buckets - 1 :].index_select(0, buckets)  # (R, F) the leaves as they are
        self._add_along_paths(buckets, self.leaf_sums(buckets) - old, self.first_of_each(buckets))

    def _add_cached_deltas(self, weight: Tensor, rows: Tensor, paths: bool = False) -> None:
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
        counted = self.first_of_each(rows)  # (R,)
        prepared = store.features.prepare(weight.index_select(0, rows))  # (R, d)
        new = store.features.of_prepared(prepared, cache.table.dtype)  # (R, F) as the cache stores it
        cache.keep_prepared(rows, prepared)  # repeats of a row write the same values
        old = cache.table.index_select(0, rows)  # (R, F): what the tree's sums hold for these rows
        # old (the cache's dtype) is promoted to the nodes' inside the subtraction: a cast's values, one operator fewer
        delta = torch.sub(new.to(store.nodes.dtype), old)  # (R, F) in the nodes' dtype
        if paths:  # each row's first occurrence adds to its leaf and every ancestor
            self._add_along_paths(torch.div(rows, store.bucket_size, rounding_mode="floor"), delta, counted)
        elif store.num_buckets > 1:  # a row's first occurrence adds to its leaf, a repeat to the leaf's parent, which
            leaf, parent = self.leaf_and_parent().index_select(0, rows).unbind(1)  # ``resum`` rewrites next: (R,) each
            store.nodes.index_add_(0, torch.where(counted, leaf, parent), delta)  # no pass over delta to mask them
        else:  # the one leaf is the root: the repeats' deltas masked
            store.nodes.index_add_(0, torch.zeros_like(rows), delta * counted.unsqueeze(1))
        cache.table.index_copy_(0, rows, new)  # repeats of a row write the same values
