"""A kernel tree's after-step update with fixed shapes: the GPU path of ``TreeStore.update`` (``execution=gpu``).

``TreeStore.update`` finds the distinct changed rows and buckets with ``torch.unique``, counts each bucket's delta
updates and re-sums only the changed ancestors: every one of those sizes depends on the data, a host sync on a GPU.
Here every shape is known before the step:

- with a feature cache (RFF's default), every changed row enters its bucket as phi(new) - cached phi(old), with
  repeated rows masked (sorted, first occurrence kept) instead of removed; when a step names at least n rows, all n
  rows go through with the unchanged ones masked, which is cheaper than the duplicates;
- float drift is bounded as on the CPU path (a bucket is recomputed from the cache after at most ``refresh``
  updates), by recomputing every leaf from the cache at every ``refresh``-th update (n F reads, once in a while);
- without a cache (quadratic), every leaf is recomputed from the weights: one batched product per block, exact;
- then every level is re-summed from its children (one addition per level).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lmtrain.sampler.kernel.store import TreeStore


class FixedUpdate:
    """``TreeStore.update`` for the GPU paths (see the module docstring); ``updates`` counts them since the leaves
    were last recomputed from the cache."""

    def __init__(self, store: TreeStore) -> None:
        self.store = store
        self.updates = 0

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
                store.set_leaves(torch.arange(store.num_buckets, device=weight.device))
                self.updates = 0
        else:
            store.set_leaves(torch.arange(store.num_buckets, device=weight.device))
        store.resum_levels(store.nodes)

    def _add_cached_deltas(self, weight: Tensor, rows: Tensor) -> None:
        store, cache = self.store, self.store.cache
        n = store.num_classes
        if rows.numel() >= n:  # every row once, the unchanged ones masked (their cached phi is kept as it is)
            counted = torch.zeros(n, dtype=torch.bool, device=rows.device).index_fill_(0, rows, True)  # (n,)
            rows = torch.arange(n, device=rows.device)
        else:  # sorted, repeats masked: only a row's first occurrence adds its delta
            rows = rows.sort().values  # (R,)
            counted = torch.ones_like(rows, dtype=torch.bool)
            counted[1:] = rows[1:] != rows[:-1]
        new = store.features(weight.index_select(0, rows)).to(cache.table.dtype)  # (R, F) as the cache stores it
        old = cache.table.index_select(0, rows)  # (R, F): what the tree's sums hold for these rows
        if rows.numel() == n:  # unchanged rows keep their cached features (a recomputation may round otherwise)
            new = torch.where(counted.unsqueeze(1), new, old)
        delta = (new.to(store.nodes.dtype) - old.to(store.nodes.dtype)) * counted.unsqueeze(1)  # (R, F)
        leaf = torch.div(rows, store.bucket_size, rounding_mode="floor") + (store.num_buckets - 1)  # (R,)
        store.nodes.index_add_(0, leaf, delta)
        cache.table.index_copy_(0, rows, new)  # repeats of a row write the same values
