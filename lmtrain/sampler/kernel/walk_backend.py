"""A kernel tree's CPU backend: draws by ``TreeWalk``'s descent in cache-sized blocks, each distinct row or bucket
scored once, and an update that touches only the changed buckets and their ancestors.

Its sizes follow the data (``torch.unique`` of the changed rows and buckets, a bucket's count of deltas), which a
CPU reads at no cost and a GPU would have to wait for: the GPU's backend is ``FixedBackend``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.sampler.kernel.backend import TreeBackend
from lmtrain.sampler.kernel.buckets import BucketScorer, BucketScores
from lmtrain.sampler.kernel.store import TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk
from lmtrain.sampler.options import KernelOptions

# the cost of a node read by a per-id path gather (scattered rows, a small product each) in units of one read by a
# level's GEMM (one streamed product), and of a walk's work in units of a dense draw's: both measured constants of
# the cost rules below (docs/architecture.md, measured design choices)
GATHER_COST = 4.0
WALK_COST = 0.5
DENSE_MAX_ENTRIES = 1 << 26  # (N, n) log q entries a dense draw may hold (256 MiB in float32)
# elements of the temporaries of one chunk of changed rows (8 MiB): small enough to stay in cache and to be reused
# without page faults, large enough for few Python steps (docs/architecture.md, measured design choices)
UPDATE_CHUNK = 1 << 21
DELTA_COST = 2  # a changed row's delta costs two member rows of a bucket recompute (phi(new) and phi(old))


class WalkStep(NamedTuple):
    """What a step's per-position draws and log q share on the walk: the queries' features phi (N, F)."""

    phi: Tensor


class WalkBackend(TreeBackend):
    """The walk (see the module docstring): ``TreeWalk`` descends level by level for every walker, the scorer picks
    in the bucket reached, and a batch's mixture keeps a table of in-bucket scores for its step (``BucketScores``)."""

    name = "walk"
    block_limit = None

    def __init__(self, store: TreeStore, walk: TreeWalk, scorer: BucketScorer, options: KernelOptions) -> None:
        self.store, self.walk, self.scorer, self.features = store, walk, scorer, scorer.features

    def step(self, query: Tensor) -> WalkStep:
        return WalkStep(self.features(query))

    def mixture_step(self, psi: Tensor) -> BucketScores:
        return self.scorer.empty(psi)

    # --- per example ----------------------------------------------------------------------------
    def sample(
        self, query: Tensor, phi: Tensor | None, num_samples: int, step: WalkStep | None = None
    ) -> tuple[Tensor, Tensor]:
        n_query = query.shape[0]
        uniform = torch.rand(self.store.depth, n_query * num_samples, device=query.device)
        phi = self.features(query) if phi is None else phi
        bucket, log_path = self.walk.descend(phi, num_samples, uniform)  # (W,) each, W = N m
        ids, log_in = self.walk.pick(*self.scorer.kernel(query, bucket, num_samples))  # (W,) each
        return ids.view(n_query, num_samples), (log_path + log_in).view(n_query, num_samples)

    def log_q(self, query: Tensor, phi: Tensor | None, ids: Tensor, step: WalkStep | None = None) -> Tensor:
        store = self.store
        n_query, k = ids.shape
        bucket = torch.div(ids, store.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k)  # (W, L)
        pick = (ids - bucket * store.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        if store.depth == 0:
            return log_in
        return self.walk.path_log_q(self.features(query) if phi is None else phi, bucket) + log_in

    def log_q_many(self, query: Tensor, phi: Tensor | None, ids: Tensor, step: WalkStep | None = None) -> Tensor:
        """``log_q`` of ids (N, k) drawn elsewhere, through every query's probability of reaching every bucket (one
        product per level, ``TreeWalk.log_reach``) when the tree has few buckets for the number of ids: reach reads
        2B node sums per query, the paths k x depth x 2 (gathered, ``GATHER_COST`` times slower each)."""
        store = self.store
        n_query, k = ids.shape
        if store.depth == 0 or store.num_buckets > GATHER_COST * k * store.depth * 2:
            return self.log_q(query, phi, ids, step)
        bucket = torch.div(ids, store.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k)  # (N k, L)
        pick = (ids - bucket * store.bucket_size).view(-1, 1)  # (N k, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        reach = self.walk.log_reach(self.features(query) if phi is None else phi)  # (N, B)
        return reach.gather(1, bucket) + log_in  # (N, k)

    def dense_draw_pays(self, n_query: int, num_samples: int) -> bool:
        """Whether ``KernelTree.sample_dense`` costs less than ``sample`` for N queries and m draws each: dense
        reads every node once per query (2B F) and scores every class (n d); m walks read depth x 2F node values and
        a bucket of L classes each. ``WALK_COST`` converts between the two (a walk's reads are scattered, a dense
        draw's streamed). At the PTB shape (n = 10^4, d = 200) the dense draw pays from about m = 50 for quadratic
        and m = 290 for rff with D = 1024."""
        store = self.store
        in_features, feats = store.weight.shape[1], store.nodes.shape[1]
        dense = 2 * store.num_buckets * feats + store.num_classes * in_features
        walk = num_samples * (store.depth * 2 * feats + store.bucket_size * in_features)
        return dense <= WALK_COST * walk and n_query * store.num_classes <= DENSE_MAX_ENTRIES

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def sample_mixture(self, psi: Tensor, num_samples: int, step: BucketScores | None = None) -> tuple[Tensor, Tensor]:
        uniform = torch.rand(self.store.depth, num_samples, device=psi.device)
        bucket, log_path = self.walk.descend(psi.unsqueeze(0), num_samples, uniform)  # (m,) each
        ids, log_in = self.walk.pick(*self.scorer.mixture(psi, bucket, step))  # (m,) each
        return ids, log_path + log_in

    def log_q_mixture(self, psi: Tensor, ids: Tensor, step: BucketScores | None = None) -> Tensor:
        size = self.store.bucket_size
        flat = ids.reshape(-1)
        bucket = torch.div(flat, size, rounding_mode="floor")  # (K,)
        distinct, inverse = torch.unique(bucket, return_inverse=True)  # each bucket's members scored once
        logw, _ = self.scorer.mixture(psi, distinct, step)  # (u, L)
        log_in = torch.log_softmax(logw, 1)[inverse, flat - bucket * size]  # (K,)
        return (self.walk.shared_path_log_q(psi, bucket) + log_in).view(ids.shape)

    # --- the update after a step ----------------------------------------------------------------
    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the buckets holding ``rows`` up to the current ``weight`` and re-sum their ancestors.

        With a ``FeatureCache`` a changed row enters its bucket as phi(new) - cached phi(old), one feature vector per
        row. Without one, a bucket either is recomputed from the weights (``FeatureMap.node_sums`` of its L rows)
        or, when fewer than L / 2 of its rows changed, takes node_sums(new rows) - node_sums(old rows) of the changed
        rows only, grouped by bucket (for the quadratic map that is S(new) - S(old), two small GEMMs); the old rows
        come from the store's ``previous``, a copy of the weights as of the last update. Float deltas round a little
        at every add: a bucket that has taken ``refresh`` delta updates is recomputed (from the cache, or from the
        weights) at its next change, which bounds that drift (tests: 10^4 rounds equal a rebuild). Ancestors are
        then re-summed from their children, so they never drift from their leaves."""
        store = self.store
        store.weight = weight
        if rows.numel() == 0:
            return
        rows = torch.unique(rows)  # sorted: the rows of one bucket are contiguous
        owner = torch.div(rows, store.bucket_size, rounding_mode="floor")
        buckets, inverse, changed = torch.unique(owner, return_inverse=True, return_counts=True)
        recompute = store.deltas[buckets] >= store.refresh  # refresh 0: every changed bucket
        if not store.cache.active:  # a delta costs two rows' node sums, a recompute all L of the bucket's
            size = (store.num_classes - buckets * store.bucket_size).clamp(max=store.bucket_size)  # classes per bucket
            recompute |= DELTA_COST * changed >= size
        by_delta = ~recompute[inverse]
        self._add_deltas(rows, owner, by_delta)
        store.deltas[buckets] += 1
        store.deltas[buckets[recompute]] = 0
        store.set_leaves(buckets[recompute])
        if 8 * buckets.numel() > store.num_buckets:  # most ancestors change: re-sum whole levels
            store.resum_levels(store.nodes)
            return
        heap = buckets + (store.num_buckets - 1)
        pairs = store.nodes[1:].view(-1, 2, store.nodes.shape[1])  # pairs[i]: both children of node i
        step = max(1, store.chunk_elements // (3 * store.nodes.shape[1]))  # blocks bound the temporaries
        for _ in range(store.depth):
            heap = torch.unique(torch.div(heap - 1, 2, rounding_mode="floor"))
            for lo in range(0, heap.numel(), step):
                children = pairs.index_select(0, heap[lo : lo + step])  # (h, 2, F)
                store.nodes.index_copy_(0, heap[lo : lo + step], torch.add(children[:, 0], children[:, 1]))

    def _add_deltas(self, rows: Tensor, owner: Tensor, by_delta: Tensor) -> None:
        """Leaf of bucket ``owner[i]`` += phi(new row) - phi(old row) for the sorted ``rows[by_delta]``. With a cache
        every changed row's cached phi becomes phi(new) (the old one is the delta's); without, the old rows are
        ``previous`` and every changed row is copied there."""
        store = self.store
        leaf = owner + (store.num_buckets - 1)
        if store.cache.active:
            step = max(1, UPDATE_CHUNK // (store.weight.shape[1] + 2 * store.nodes.shape[1]))
            for lo in range(0, rows.numel(), step):
                keep = by_delta[lo : lo + step]  # rows of buckets recomputed below only refresh the cache
                delta = store.cache.swap(self.features, store.weight, rows[lo : lo + step], keep)  # (k, F)
                store.nodes.index_add_(0, leaf[lo : lo + step][keep], delta)
            return
        if store.refresh:
            self._add_grouped_deltas(rows[by_delta], owner[by_delta])
            store.previous[rows] = store.weight[rows]

    def _add_grouped_deltas(self, rows: Tensor, owner: Tensor) -> None:
        """Leaves += node_sums(new rows) - node_sums(old rows) over each bucket's changed rows (sorted by bucket).
        Buckets go in blocks of similar change counts, each padded to its largest count (little padding)."""
        if rows.numel() == 0:
            return
        store = self.store
        buckets, counts = torch.unique_consecutive(owner, return_counts=True)  # (G,) each
        starts = counts.cumsum(0) - counts
        order = counts.argsort()
        ranked = counts[order].tolist()
        dim, lo = store.weight.shape[1], 0
        while lo < len(ranked):  # ascending counts: the block's last group is its widest
            hi = lo + 1
            while (
                hi < len(ranked)
                and 2 * (hi + 1 - lo) * self.features.sum_elements(ranked[hi], dim) <= store.chunk_elements
            ):
                hi += 1
            group, width = order[lo:hi], ranked[hi - 1]
            slot = torch.arange(width, device=rows.device)
            valid = slot < counts[group].unsqueeze(1)  # (g, c)
            where = rows[(starts[group].unsqueeze(1) + slot).clamp(max=rows.numel() - 1)].view(-1)  # (g c,)
            new, old = (
                rows_of.index_select(0, where).view(group.numel(), width, -1)
                for rows_of in (store.weight, store.previous)
            )
            sums = self.features.delta_sums(new, old, valid)  # (g, F)
            store.nodes.index_add_(0, buckets[group] + (store.num_buckets - 1), sums)
            lo = hi
