"""Divide-and-conquer sampling from a kernel proposal q_i ∝ K(h, w_i) (DESIGN §3)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.features import FeatureMap


class KernelTree(nn.Module):
    """A complete binary tree over buckets of classes whose nodes store z(C) = sum of phi(w_j), j in C.

    Classes are cut into ``2^depth`` contiguous buckets of at most ``leaf_size`` classes (spread
    evenly; trailing buckets may be empty, have zero sums and are never chosen). ``nodes`` is a heap
    array (2B - 1, F): node i has children 2i + 1 and 2i + 2. A draw descends from the root, going
    left with probability s(L) / (s(L) + s(R)), s = max(<phi(h), z>, eps) for non-empty nodes, then
    picks a class in the bucket with probability K(h, w_j) / sum over the bucket, computed exactly.
    ``log_q`` follows the same branch probabilities, so it is the exact log-probability of a draw.
    ``leaf_size=None`` uses F / d (F = dim phi, d = dim w), which keeps node memory near 2-4x the
    weight matrix: about (2 * 2^ceil(log2(n / leaf_size))) * F floats.
    """

    def __init__(
        self,
        features: FeatureMap,
        leaf_size: int | None = None,
        eps: float = 1e-6,
        dense_factor: int = 64,
        chunk_elements: int = 1 << 22,
    ) -> None:
        super().__init__()
        if leaf_size is not None and int(leaf_size) < 1:
            raise ValueError(f"sampler.leaf_size must be a positive class count or null, got {leaf_size}")
        if not eps > 0:
            raise ValueError(f"sampler.eps must be positive (the clamp on node scores), got {eps}")
        self.features = features
        self.leaf_size = None if leaf_size is None else int(leaf_size)
        self.eps, self.dense_factor, self.chunk_elements = float(eps), dense_factor, chunk_elements
        self.num_classes = self.depth = self.bucket_size = 0
        self.weight: Tensor | None = None  # the latest weights given to rebuild/update (not a buffer)
        self.register_buffer("nodes", torch.empty(0), persistent=False)  # (2B - 1, F)
        self.register_buffer("floor", torch.empty(0), persistent=False)  # (2B - 1,) eps or 0 (empty)

    @property
    def num_buckets(self) -> int:
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
        self._set_leaves(torch.arange(buckets, device=weight.device))
        self._resum_levels(self.nodes)
        self._resum_levels(sizes)
        self.floor = torch.where(sizes > 0, self.eps, 0.0).to(weight.dtype)

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Recompute the buckets holding ``rows`` from the current ``weight`` and re-sum their ancestors."""
        self.weight = weight
        if rows.numel() == 0:
            return
        buckets = torch.unique(torch.div(rows, self.bucket_size, rounding_mode="floor"))
        self._set_leaves(buckets)
        if 8 * buckets.numel() > self.num_buckets:  # most ancestors change: re-sum whole levels
            self._resum_levels(self.nodes)
            return
        heap = buckets + (self.num_buckets - 1)
        pairs = self.nodes[1:].view(-1, 2, self.nodes.shape[1])  # pairs[i]: both children of node i
        for _ in range(self.depth):
            heap = torch.unique(torch.div(heap - 1, 2, rounding_mode="floor"))
            children = pairs.index_select(0, heap)  # (h, 2, F)
            self.nodes.index_copy_(0, heap, children[:, 0] + children[:, 1])

    def _resum_levels(self, heap: Tensor) -> None:
        """Every internal node of a heap array := left child + right child, bottom-up."""
        for level in reversed(range(self.depth)):
            lo, hi = (1 << level) - 1, (2 << level) - 1
            heap[lo:hi] = heap[hi : 2 * hi + 1 : 2] + heap[hi + 1 : 2 * hi + 1 : 2]

    def _set_leaves(self, buckets: Tensor) -> None:
        per_bucket = self.features.sum_elements(self.bucket_size, self.weight.shape[1])
        step = max(1, self.chunk_elements // per_bucket)
        for start in range(0, buckets.numel(), step):  # chunks of buckets bound the memory
            chunk = buckets[start : start + step]
            rows, valid = self._members(chunk)
            self.nodes.index_copy_(0, chunk + (self.num_buckets - 1), self.features.node_sums(rows, valid))

    def _members(self, buckets: Tensor) -> tuple[Tensor, Tensor]:
        """Rows (..., L, d) of the classes in ``buckets`` (...) and their validity mask (..., L)."""
        ids = buckets.unsqueeze(-1) * self.bucket_size + torch.arange(self.bucket_size, device=buckets.device)
        rows = self.weight.index_select(0, ids.clamp(max=self.num_classes - 1).view(-1))
        return rows.view(*ids.shape, -1), ids < self.num_classes

    # --- sampling -------------------------------------------------------------------------------
    def sample(self, query: Tensor, num_samples: int) -> tuple[Tensor, Tensor]:
        """query (N, d) -> ids (N, m) drawn per example, and their exact log q (N, m)."""
        self._check(query)
        n_query = query.shape[0]
        uniform = torch.rand(self.depth, n_query * num_samples, device=query.device)
        bucket, log_path = self._walk(query, num_samples, uniform=uniform)  # (W,) each, W = N m
        logk, ids = self._bucket_log_kernels(query, bucket, num_samples)  # (W, L) each
        gumbel = -torch.log(-torch.log(torch.rand_like(logk).clamp_min(1e-20)))
        pick = (logk + gumbel).argmax(1, keepdim=True)  # (W, 1): Gumbel-max draw within the bucket
        log_in = logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)
        return ids.gather(1, pick).view(n_query, num_samples), (log_path + log_in).view(n_query, num_samples)

    def log_q(self, query: Tensor, ids: Tensor) -> Tensor:
        """Exact log q of any ids (N, k) under the walk that ``sample`` performs, (N, k).

        The path of a known id is known in advance, so all levels are scored in one batched step.
        """
        self._check(query)
        n_query, k = ids.shape
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.bucket_size, rounding_mode="floor")
        logk, _ = self._bucket_log_kernels(query, bucket, k)  # (W, L)
        pick = (flat - bucket * self.bucket_size).unsqueeze(1)  # (W, 1)
        log_in = logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)
        if self.depth == 0:
            return log_in.view(n_query, k)
        phi = self.features(query)  # (N, F)
        leaf = (bucket + self.num_buckets).unsqueeze(1)  # (W, 1): 1-based heap index of the bucket
        shifts = torch.arange(self.depth, 0, -1, device=ids.device)  # (depth,)
        parents = (leaf >> shifts) - 1  # (W, depth): 0-based heap index of the node at each level
        right = (leaf >> (shifts - 1)) & 1  # (W, depth): 1 where the path goes right
        pairs, floor = self.nodes[1:].view(-1, 2 * phi.shape[1]), self.floor[1:].view(-1, 2)

        def block(lo: int, hi: int) -> Tensor:
            where = parents[lo * k : hi * k].reshape(-1)
            z = pairs.index_select(0, where).view(hi - lo, -1, phi.shape[1])  # (b, k depth 2, F)
            raw = torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2)).view(-1, self.depth, 2)
            s = torch.maximum(raw, floor.index_select(0, where).view(-1, self.depth, 2))  # (bk, depth, 2)
            chosen = s.gather(2, right[lo * k : hi * k].unsqueeze(2)).squeeze(2)
            return (chosen.log() - s.sum(2).log()).sum(1)  # (bk,)

        log_path = self._blocks(block, n_query, 2 * k * self.depth * phi.shape[1])
        return (log_path + log_in).view(n_query, k)

    def log_q_all(self, query: Tensor) -> Tensor:
        """Exact log q of every class for each query, (N, n): the walk's branch probabilities for every node of
        the tree at once (an (N, F) x (F, 2B - 1) product) times the in-bucket probabilities. For diagnostics."""
        self._check(query)
        phi = self.features(query)  # (N, F)
        n_query, size = phi.shape[0], self.bucket_size
        log_node = phi.new_zeros(n_query, 1)  # (N, 1): log-probability of reaching the root
        for level in range(self.depth):
            nodes = slice((2 << level) - 1, (4 << level) - 1)  # the children's level: 2^(level+1) nodes
            s = torch.maximum(phi @ self.nodes[nodes].T, self.floor[nodes]).view(n_query, -1, 2)  # (N, width/2, 2)
            branch = (s.log() - s.sum(2, keepdim=True).log()).nan_to_num(nan=float("-inf"))  # empty pairs: 0 / 0
            log_node = (log_node.unsqueeze(2) + branch).flatten(1)  # (N, width)
        dots = self.features.prepare(query) @ self.features.prepare(self.weight).T  # (N, n)
        logk = self.features.log_kernel_dot(dots)
        logk = nn.functional.pad(logk, (0, self.num_buckets * size - self.num_classes), value=float("-inf"))
        log_in = torch.log_softmax(logk.view(n_query, self.num_buckets, size), dim=2)  # (N, B, L)
        return (log_node.unsqueeze(2) + log_in).flatten(1)[:, : self.num_classes]

    def _check(self, query: Tensor) -> None:
        if self.weight is None:
            raise RuntimeError("KernelTree is empty: call update(weight) (or rebuild) before sampling")
        if query.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"query has {query.shape[-1]} features, class vectors {self.weight.shape[1]}")

    def _walk(self, query: Tensor, k: int, uniform: Tensor) -> tuple[Tensor, Tensor]:
        """Descend with k walkers per query (walker w belongs to query w // k), branching with
        ``uniform`` (depth, W); returns the buckets reached (W,) and each path's log-probability (W,)."""
        phi = self.features(query)  # (N, F): phi per query, never per walker
        n_query, feats = phi.shape
        qrow = torch.arange(n_query, device=query.device).repeat_interleave(k)  # (W,) walker -> query
        pairs = self.nodes[1:].view(-1, 2 * feats)  # row i: both children of heap node i
        floor = self.floor[1:].view(-1, 2)
        pos = torch.zeros(n_query * k, dtype=torch.long, device=query.device)  # heap index per walker
        scores, turns = [], []
        for level in range(self.depth):  # a loop over levels only; each step is batched over walkers
            width = 2 << level  # nodes on the children's level
            if self._dense(width, n_query, 2 * k):  # one GEMM over the whole level beats gathers
                s = self._level_scores(phi, pos, qrow, width, k)
            else:
                s = self._gathered_scores(phi, pairs, floor, pos, k)
            right = uniform[level] >= s[:, 0] / s.sum(1)  # (W,) go right with prob s_R / (s_L + s_R)
            scores.append(s)
            turns.append(right)
            pos = (pos * 2 + 1).add_(right)
        if not scores:
            return pos, phi.new_zeros(pos.shape)
        s = torch.stack(scores, 1)  # (W, depth, 2)
        chosen = s.gather(2, torch.stack(turns, 1).long().unsqueeze(2)).squeeze(2)  # (W, depth)
        return pos - (self.num_buckets - 1), (chosen.log() - s.sum(2).log()).sum(1)

    def _level_scores(self, phi: Tensor, pos: Tensor, qrow: Tensor, width: int, k: int) -> Tensor:
        """Clamped scores of both children of each walker's node, from one GEMM of every query with
        every node of the children's level (``width`` nodes): (W, 2)."""
        level = slice(width - 1, 2 * width - 1)
        pair = pos + (qrow * (width // 2) - (width // 2 - 1))  # (W,) row of the (N * width / 2, 2) table

        def block(lo: int, hi: int) -> Tensor:
            table = torch.maximum(phi[lo:hi] @ self.nodes[level].T, self.floor[level])  # (b, width)
            return table.view(-1, 2).index_select(0, pair[lo * k : hi * k] - lo * (width // 2))

        return self._blocks(block, phi.shape[0], width)

    def _gathered_scores(self, phi: Tensor, pairs: Tensor, floor: Tensor, pos: Tensor, k: int) -> Tensor:
        """Clamped scores of both children of each walker's node, gathered per walker: (W, 2)."""

        def block(lo: int, hi: int) -> Tensor:
            where = pos[lo * k : hi * k]
            z = pairs.index_select(0, where).view(hi - lo, 2 * k, -1)  # (b, 2k, F)
            raw = torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2))  # (b, 1, 2k); faster than z @ column
            return torch.maximum(raw.view(-1, 2), floor.index_select(0, where))

        return self._blocks(block, phi.shape[0], 2 * k * phi.shape[1])

    def _bucket_log_kernels(self, query: Tensor, bucket: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """log K(h, w_j) for the members of each walker's bucket (W,) -> (W, L) (-inf on padding),
        and the member ids (W, L)."""
        size, n_query = self.bucket_size, query.shape[0]
        ids = bucket.unsqueeze(1) * size + torch.arange(size, device=bucket.device)  # (W, L)
        prepared = self.features.prepare(query)
        if self._dense(self.num_buckets, n_query, k):  # all dot products in one GEMM, then pick
            dots = prepared @ self.features.prepare(self.weight).T  # (N, n)
            dots = nn.functional.pad(dots, (0, self.num_buckets * size - self.num_classes))
            qrow = torch.arange(n_query, device=bucket.device).repeat_interleave(k)  # (W,)
            dots = dots.view(-1, size).index_select(0, bucket + qrow * self.num_buckets)  # (W, L)
        else:

            def block(lo: int, hi: int) -> Tensor:
                where = ids[lo * k : hi * k].clamp(max=self.num_classes - 1).view(-1)
                rows = self.features.prepare(self.weight.index_select(0, where)).view(hi - lo, k * size, -1)
                return torch.bmm(prepared[lo:hi].unsqueeze(1), rows.transpose(1, 2)).view(-1, size)

            dots = self._blocks(block, n_query, k * size * query.shape[1])
        logk = self.features.log_kernel_dot(dots)
        if self.num_buckets * size > self.num_classes:  # padding slots of the last buckets
            logk = logk.masked_fill(ids >= self.num_classes, float("-inf"))
        return logk, ids

    def _dense(self, width: int, n_query: int, gathered: int) -> bool:
        """Whether scoring all ``width`` nodes for every query (one pass over their sums plus a GEMM)
        is cheaper than gathering ``gathered`` node sums per query; ``dense_factor`` = GEMM speed
        relative to gather speed, per element."""
        return width * (self.dense_factor + n_query) <= self.dense_factor * n_query * gathered

    def _blocks(self, fn: Callable[[int, int], Tensor], n_query: int, per_query: int) -> Tensor:
        """fn over blocks of queries sized so each block's temporaries hold about ``chunk_elements``."""
        step = max(1, self.chunk_elements // per_query)
        if step >= n_query:
            return fn(0, n_query)
        return torch.cat([fn(lo, min(lo + step, n_query)) for lo in range(0, n_query, step)])

    # --- device moves ---------------------------------------------------------------------------
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> KernelTree:
        out = super()._apply(fn, recurse)
        if self.weight is not None:  # keep sampling valid until the next update() re-links the weights
            self.weight = fn(self.weight)
        return out

    def timed_rebuild(self, weight: Tensor) -> float:
        """rebuild(weight) and return the seconds it took."""
        start = time.perf_counter()
        self.rebuild(weight)
        return time.perf_counter() - start
