"""The descent through a kernel tree for queries in feature space, and the exact log-probability of its paths."""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.sampler.kernel.store import TreeStore

# elements of gathered node sums per block of walkers (4 MiB): the block stays in cache between the gather and its
# product (docs/architecture.md, measured design choices)
GATHER_CHUNK = 1 << 20
# node pairs are contiguous 2F-float rows, gathered faster per element than bucket rows (which are also normalized),
# so a level goes dense later than a bucket scoring does; the factor is measured (docs/architecture.md)
LEVEL_GATHER_GAIN = 4


class TreeWalk:
    """Walks down the node sums of a ``TreeStore`` for feature-space queries phi (N, F): from a node, go left with
    probability s(L) / (s(L) + s(R)), s = max(<phi, z>, floor) (eps for non-empty nodes, 0 for empty ones).

    Which class is picked inside the bucket reached is up to the caller (``KernelTree``); ``pick`` draws it
    from given log-weights. Every branch probability used is the one ``path_log_q`` returns, so draws and
    log q agree exactly. The walk holds no tensors of its own: it reads the store's at every call, so it follows
    the store's rebuilds and device moves. ``dense`` is its cost rule (one GEMM over a level or a bucket range
    against per-walker gathers), ``dense_factor`` that rule's GEMM-to-gather speed ratio per element.
    """

    def __init__(self, store: TreeStore, dense_factor: float = 64, gather_elements: int = GATHER_CHUNK) -> None:
        self.store = store
        self.dense_factor = dense_factor
        self.gather_elements = gather_elements  # block size of per-walker gathers (at most store.chunk_elements)

    def dense(self, width: int, n_query: int, gathered: int, factor: float | None = None) -> bool:
        """Whether scoring all ``width`` items for every query (one pass over them plus a GEMM) is cheaper than
        gathering ``gathered`` items per query; ``factor`` (default ``dense_factor``) = GEMM speed relative to
        gather speed, per element."""
        factor = self.dense_factor if factor is None else factor
        return width * (factor + n_query) <= factor * n_query * gathered

    def descend(self, phi: Tensor, k: int, uniform: Tensor) -> tuple[Tensor, Tensor]:
        """Descend with k walkers per query phi (N, F) (walker w belongs to query w // k), branching with
        ``uniform`` (depth, W); returns the buckets reached (W,) and each path's log-probability (W,)."""
        n_query, feats = phi.shape
        qrow = torch.arange(n_query, device=phi.device).repeat_interleave(k)  # (W,) walker -> query
        pairs = self.store.nodes[1:].view(-1, 2 * feats)  # row i: both children of heap node i
        floor = self.store.floor[1:].view(-1, 2)
        pos = torch.zeros(n_query * k, dtype=torch.long, device=phi.device)  # heap index per walker
        scores, turns = [], []
        for level in range(self.store.depth):  # a loop over levels only; each step is batched over walkers
            width = 2 << level  # nodes on the children's level
            if n_query == 1:  # one query (a batch's mixture): walkers on the same node share its children's scores
                distinct, inverse = torch.unique(pos, return_inverse=True)
                s = self.pair_scores(phi[0], distinct)[inverse]  # (W, 2)
            elif self.dense(width, n_query, 2 * k, self.dense_factor / LEVEL_GATHER_GAIN):  # a GEMM beats gathers
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
        return pos - (self.store.num_buckets - 1), (chosen.log() - s.sum(2).log()).sum(1)

    def _level_scores(self, phi: Tensor, pos: Tensor, qrow: Tensor, width: int, k: int) -> Tensor:
        """Clamped scores of both children of each walker's node, from one GEMM of every query with
        every node of the children's level (``width`` nodes): (W, 2)."""
        level = slice(width - 1, 2 * width - 1)
        pair = pos + (qrow * (width // 2) - (width // 2 - 1))  # (W,) row of the (N * width / 2, 2) table

        def block(lo: int, hi: int) -> Tensor:
            table = torch.maximum(phi[lo:hi] @ self.store.nodes[level].T, self.store.floor[level])  # (b, width)
            return table.view(-1, 2).index_select(0, pair[lo * k : hi * k] - lo * (width // 2))

        return self.store.blocks(block, phi.shape[0], width)

    def _gathered_scores(self, phi: Tensor, pairs: Tensor, floor: Tensor, pos: Tensor, k: int) -> Tensor:
        """Clamped scores of both children of each walker's node, gathered per walker: (W, 2)."""

        def block(lo: int, hi: int) -> Tensor:
            where = pos[lo * k : hi * k]
            z = pairs.index_select(0, where).view(hi - lo, 2 * k, -1)  # (b, 2k, F)
            raw = torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2))  # (b, 1, 2k); faster than z @ column
            return torch.maximum(raw.view(-1, 2), floor.index_select(0, where))

        return self.store.blocks(block, phi.shape[0], 2 * k * phi.shape[1], self.gather_elements)

    def _path_parents(self, bucket: Tensor) -> tuple[Tensor, Tensor]:
        """For buckets (W,): the heap index of the node left at each level (W, depth), and 1 where the path
        goes right (W, depth). The path of a known bucket is known in advance, so all levels go at once."""
        leaf = (bucket + self.store.num_buckets).unsqueeze(1)  # (W, 1): 1-based heap index of the bucket
        shifts = torch.arange(self.store.depth, 0, -1, device=bucket.device)  # (depth,)
        return (leaf >> shifts) - 1, (leaf >> (shifts - 1)) & 1

    def path_log_q(self, phi: Tensor, bucket: Tensor) -> Tensor:
        """Log-probability (N, k) that query i's walk reaches ``bucket[i, j]`` (N, k), phi (N, F)."""
        n_query, k = bucket.shape
        if self.store.depth == 0:
            return phi.new_zeros(n_query, k)
        parents, right = self._path_parents(bucket.reshape(-1))  # (W, depth) each
        feats = phi.shape[1]
        pairs, floor = self.store.nodes[1:].view(-1, 2 * feats), self.store.floor[1:].view(-1, 2)

        def block(lo: int, hi: int) -> Tensor:
            where = parents[lo * k : hi * k].reshape(-1)
            z = pairs.index_select(0, where).view(hi - lo, -1, feats)  # (b, k depth 2, F)
            raw = torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2)).view(-1, self.store.depth, 2)
            s = torch.maximum(raw, floor.index_select(0, where).view(-1, self.store.depth, 2))  # (bk, depth, 2)
            chosen = s.gather(2, right[lo * k : hi * k].unsqueeze(2)).squeeze(2)
            return (chosen.log() - s.sum(2).log()).sum(1)  # (bk,)

        return self.store.blocks(block, n_query, 2 * k * self.store.depth * feats, self.gather_elements).view(
            n_query, k
        )

    def shared_path_log_q(self, psi: Tensor, bucket: Tensor) -> Tensor:
        """Log-probability (K,) that the walk of the single query psi (F,) reaches each of ``bucket`` (K,):
        each distinct node on the paths is scored once (at most K depth, at most all 2B - 1)."""
        if self.store.depth == 0:
            return psi.new_zeros(bucket.shape)
        parents, right = self._path_parents(bucket)  # (K, depth) each
        distinct, inverse = torch.unique(parents, return_inverse=True)  # (u,), (K, depth)
        s = self.pair_scores(psi, distinct)[inverse]  # (K, depth, 2)
        chosen = s.gather(2, right.unsqueeze(2)).squeeze(2)  # (K, depth)
        return (chosen.log() - s.sum(2).log()).sum(1)

    def pair_scores(self, psi: Tensor, heap: Tensor) -> Tensor:
        """Clamped scores (u, 2) of both children of each of the distinct heap nodes ``heap`` (u,) for the single
        query psi (F,), in blocks of about ``chunk_elements`` gathered node values."""
        pairs, floor = self.store.nodes[1:].view(-1, 2, psi.shape[0]), self.store.floor[1:].view(-1, 2)

        def block(lo: int, hi: int) -> Tensor:
            where = heap[lo:hi]
            return torch.maximum(pairs.index_select(0, where) @ psi, floor.index_select(0, where))  # (b, 2)

        return self.store.blocks(block, heap.numel(), 2 * psi.shape[0])

    def log_reach(self, phi: Tensor) -> Tensor:
        """Log-probability (N, B) that each query's walk reaches each bucket: the branch probabilities of every
        node of the tree at once, one (N, F) x (F, width) product per level."""
        n_query = phi.shape[0]
        log_node = phi.new_zeros(n_query, 1)  # (N, 1): log-probability of reaching the root
        for level in range(self.store.depth):
            nodes = slice((2 << level) - 1, (4 << level) - 1)  # the children's level: 2^(level+1) nodes
            s = torch.maximum(phi @ self.store.nodes[nodes].T, self.store.floor[nodes]).view(
                n_query, -1, 2
            )  # (N, width/2, 2)
            branch = (s.log() - s.sum(2, keepdim=True).log()).nan_to_num(nan=float("-inf"))  # empty pairs: 0 / 0
            log_node = (log_node.unsqueeze(2) + branch).flatten(1)  # (N, width)
        return log_node

    @staticmethod
    def pick(log_weights: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """One Gumbel-max draw per row of ``log_weights`` (W, L) (-inf = never): the ids (W,) drawn from
        ``ids`` (W, L) and the log-probability of the pick inside its row (W,)."""
        gumbel = -torch.log(-torch.log(torch.rand_like(log_weights).clamp_min(1e-20)))
        pick = (log_weights + gumbel).argmax(1, keepdim=True)  # (W, 1)
        log_in = log_weights.gather(1, pick).squeeze(1) - torch.logsumexp(log_weights, 1)
        return ids.gather(1, pick).squeeze(1), log_in
