"""The kernel tree's descent in a bounded number of operators, whatever the depth: the GPU path of ``TreeWalk``.

``TreeWalk`` descends level by level (a few operators per level, cache-sized blocks per level on a CPU), so a
step's operator count grows with log n and with the batch. Here the top levels are scored for every node at
once and the walkers only descend the last levels (``WALKED_LEVELS`` at most) by gathers:

1. ``top_reach``: one product of the queries with every node of levels 1..t (t = max(depth - WALKED_LEVELS,
   min(depth, SCORED_LEVELS)), less where its temporaries would pass the memory budget: a tree of up to
   2^SCORED_LEVELS buckets is scored whole) gives each node's clamped score, hence every branch probability of
   those levels; the log-probability of reaching each node of level t is the sum of its ancestors' branch
   log-probabilities (one gather through a fixed ancestor table, one sum). This is
   the walk's own probability of arriving there, not an approximation. One query (a batch's mixture psi) has t = the
   whole depth where its product, a matrix-vector product, reads at most ``single_reads`` node values (the GPU
   paths' budget, 2^30: at 10^6 RFF classes, 2^18 nodes of 2,048 features, 537 M values): no level is walked.
2. ``descend``: each walker draws its level-t node from that distribution (inverse CDF: a cumulative sum and a
   sorted search) and descends the remaining levels as ``TreeWalk`` does, gathering its node's children. Known
   buckets (a step's targets) walk down with the draws, their turns given by their index's bits instead of drawn,
   so their path probabilities come from the same scores.
3. ``path_log_q``: any bucket's path probability is the reach of its level-t ancestor plus the branch
   probabilities of its last levels, gathered for all those levels at once.

Draws and log q follow the same branch probabilities as ``TreeWalk`` (the same clamps max(<phi, z>, floor)), so
the proposal is the same distribution; only its random numbers are used differently. The number of operators
does not grow past depth SCORED_LEVELS + WALKED_LEVELS; the product of step 1 reads N x 2^(t+1) x F node values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.sampler.kernel.store import GPU_BLOCK_ELEMENTS, TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk

# levels each walker descends by gathers at most; the levels above are scored for all of their nodes by one product.
# It bounds the operators a step takes whatever the depth (a level walked is about 7 of them)
WALKED_LEVELS = 4
# multiply-adds of a product that cost as much as one node value gathered, on a GPU: a gather is bound by memory (each
# value read, written and read again by its product, 12 bytes at 3-5 TB/s: about 3 ps) and a product by arithmetic
# (a TF32 multiply-add, which lmtrain's trainer allows, is about 0.005 ps at 400 TFLOPS; a float32 one 0.03 ps): 500
# to 100, so 256. ``TreeWalk.dense``'s CPU factor is 16 for levels. An estimate from those rates, not yet timed
GPU_DENSE_FACTOR = 256
# levels scored whole at least (while the tree has them): at N = 700 queries and m = 100 walkers each (202 node rows
# gathered per query and level) ``TreeWalk.dense`` prefers one product to gathers, at ``GPU_DENSE_FACTOR``, up to a
# level of 37,864 nodes; 2^15 is the largest level below that. A tree of up to 2^15 buckets (10^5 RFF classes, 10^6
# quadratic ones) is not walked at all: one product with its nodes below the root, no operators per level
SCORED_LEVELS = 15


class FixedWalk:
    """``TreeWalk``'s descent and path probabilities with a fixed operator count (see the module docstring).

    It reads the store's tensors at every call, like ``TreeWalk``. The top levels are scored whole by
    ``top_reach``: the first ``scored`` levels at least, and all but the last ``walked`` at least (one query: every
    level, within ``single_reads`` node values); walkers descend the rest, a level at a time, by gathers or by one
    product with the level where ``dense_factor`` says that is cheaper (``TreeWalk.dense``)."""

    def __init__(
        self,
        store: TreeStore,
        rule: TreeWalk,
        walked: int = WALKED_LEVELS,
        scored: int = SCORED_LEVELS,
        single_reads: int = GPU_BLOCK_ELEMENTS,
        dense_factor: float = GPU_DENSE_FACTOR,
    ) -> None:
        self.store, self.rule = store, rule  # the rule: ``TreeWalk.dense``, one product per level or gathers
        self.dense_factor = dense_factor  # the rule's factor for a walked level (a GPU's, not the CPU's)
        self.walked, self.scored = walked, scored
        self.single_reads = single_reads  # node values one query's product may read to score the tree whole
        self._ancestors: dict[tuple[int, torch.device], Tensor] = {}

    def top(self, n_query: int) -> int:
        """t: the level whose nodes ``top_reach`` gives the probability of for ``n_query`` queries (0: the root,
        nothing scored whole); below ``scored`` where the reach's temporaries (N x 2^t x t) would pass the GPU
        paths' memory budget. One query (a mixture's psi) scores the whole tree, no level walked, where its product
        (a matrix-vector product) reads at most ``single_reads`` node values."""
        depth = self.store.depth
        if n_query == 1 and ((2 << depth) - 2) * self.store.nodes.shape[1] <= self.single_reads:
            return depth
        level = max(0, depth - self.walked, min(depth, self.scored))
        while level > max(0, depth - self.walked) and n_query * (level << level) > GPU_BLOCK_ELEMENTS:
            level -= 1
        return level

    def ancestors(self, level: int, device: torch.device) -> Tensor:
        """For every node of ``level`` (2^level of them), the rows of its ancestors at levels 1..level in the
        table of branch log-probabilities (heap index - 1): (2^level, level), built once per level and device."""
        key = (level, device)
        if key not in self._ancestors:
            heap = torch.arange(1 << level, device=device) + (1 << level)  # 1-based heap index of each node
            shifts = torch.arange(level - 1, -1, -1, device=device)  # (level,): from level 1 down to ``level``
            self._ancestors[key] = (heap.unsqueeze(1) >> shifts) - 2  # 1-based ancestor - 1 (root's child = 0)
        return self._ancestors[key]

    def top_reach(self, phi: Tensor) -> Tensor:
        """Log-probability (N, 2^t) that each query's walk reaches each node of level t, from one product of the
        queries phi (N, F) with the nodes of levels 1..t."""
        level = self.top(phi.shape[0])
        if level == 0:
            return phi.new_zeros(phi.shape[0], 1)
        count = (2 << level) - 1  # nodes of levels 0..t
        nodes = self.store.nodes[1:count]  # (2^(t+1) - 2, F): every node below the root, down to level t
        s = torch.maximum(phi @ nodes.T, self.store.floor[1:count]).view(phi.shape[0], -1, 2)  # (N, pairs, 2)
        branch = (s / s.sum(2, keepdim=True)).log().nan_to_num(nan=float("-inf"))  # empty pairs: 0 / 0
        table = self.ancestors(level, phi.device)  # (2^t, t)
        return branch.flatten(1).index_select(1, table.flatten()).view(phi.shape[0], -1, level).sum(2)  # (N, 2^t)

    def descend(self, phi: Tensor, k: int, top: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """k walkers per query phi (N, F), starting from ``top`` (N, 2^t), the reach of level t, and ``known``
        buckets (N, j) walked down their own paths (their turns given, not drawn), so that their path probabilities
        come from the same scores as the draws': walker w belongs to query w // (k + j), the known ones last. The
        buckets reached (W,) and each path's log-probability (W,), W = N (k + j)."""
        n_query = phi.shape[0]
        store, level = self.store, top.shape[1].bit_length() - 1  # top: (N, 2^t)
        steps = store.depth - level
        cdf = top.exp().cumsum(1)  # (N, 2^t)
        target = torch.rand(n_query, k, device=phi.device) * cdf[:, -1:]  # (N, k) uniform in [0, total]
        # the first node whose cdf reaches the target: never a node of probability 0 (its cdf equals its left
        # neighbour's), so a target rounded up to the total takes the last node of positive probability
        start = torch.searchsorted(cdf, target)  # (N, k)
        walkers = k + (0 if known is None else known.shape[1])  # per query
        # (steps, N, k + j, 2) (u - 1, u) per walker and level: go right iff (u - 1) s_L + u s_R >= 0
        split = phi.new_empty(steps, n_query, walkers, 2)
        if steps:
            split[:, :, :k, 1].uniform_()
        if known is not None and not steps:  # the known buckets are nodes of level t
            start = torch.cat([start, known], 1)  # (N, k + j)
        elif known is not None:  # u = 1 turns right ((u - 1) s_L + u s_R = s_R >= 0), u = 0 left (-s_L < 0)
            bits = known.unsqueeze(0) >> self.shifts(steps, phi.device).view(-1, 1, 1)  # (steps + 1, N, j) ancestors
            start = torch.cat([start, bits[0]], 1)  # (N, k + j): the known buckets' level-t ancestors
            split[:, :, k:, 1] = bits[1:] & 1  # the bits as 0./1. (CUDA's bitwise ops write no float out=)
        log_path = top.gather(1, start).view(-1)  # (W,)
        if steps == 0:  # level t holds the buckets
            return start.view(-1), log_path
        torch.sub(split[..., 1], 1, out=split[..., 0])
        bucket, log_walk = self._walk(phi, start.view(-1), split.view(steps, -1, 2), walkers, level)
        return bucket, log_path + log_walk

    def _walk(self, phi: Tensor, pos: Tensor, split: Tensor, k: int, level: int) -> tuple[Tensor, Tensor]:
        """Walkers (k per query phi (N, F)) on the nodes ``pos`` (W,) of level t (their index in the level) descend
        the last levels, turning right where ``split`` (levels, W, 2) . (s_L, s_R) >= 0: the buckets (W,) reached
        and the log-probability (W,) of the turns taken. A node's children are entries 2i and 2i + 1 of the next
        level, so each level is read through its own view and an index needs no offset."""
        n_query = phi.shape[0]
        steps, nodes, floors = split.shape[0], self.store.nodes, self.store.floor
        scores = phi.new_empty(pos.shape[0], steps, 2)  # (W, steps, 2) each level's children's clamped scores
        turns = torch.empty(pos.shape[0], steps, dtype=torch.long, device=pos.device)  # (W, steps) 1: right
        qrow = None  # (W,) walker -> query, made for the first level scored whole (``_level_pairs``)
        for step in range(steps):  # WALKED_LEVELS steps at most, whatever n
            width = 2 << (level + step)  # nodes on the children's level, from heap index width - 1
            children, floor = nodes[width - 1 : 2 * width - 1], floors[width - 1 : 2 * width - 1]  # (width, F)
            if self.rule.dense(width, n_query, 2 * k, self.dense_factor):  # one product beats the gathers
                qrow = torch.arange(n_query, device=phi.device).repeat_interleave(k) if qrow is None else qrow
                self._level_pairs(phi, children, floor, torch.add(pos, qrow, alpha=width // 2), scores[:, step])
            else:
                self._gathered_pairs(phi, children, floor, pos, k, scores[:, step])
            right = torch.bmm(scores[:, step].unsqueeze(1), split[step].unsqueeze(2)).view(-1)  # (W,)
            torch.ge(right, 0, out=turns[:, step])  # u >= s_L / (s_L + s_R)
            pos = torch.add(turns[:, step], pos, alpha=2)  # the chosen child's index in its level
        chosen = scores.gather(2, turns.unsqueeze(2)).squeeze(2)  # (W, steps)
        return pos, (chosen / scores.sum(2)).log().sum(1)

    @staticmethod
    def _level_pairs(phi: Tensor, children: Tensor, floor: Tensor, row: Tensor, out: Tensor) -> None:
        """Clamped scores ``out`` (W, 2) of both children of each walker's node, read from one product of the queries
        with the nodes ``children`` (width, F) of the children's level (``TreeWalk._level_scores``, unblocked);
        ``row`` (W,): query x width / 2 + the node's index in its level."""
        table = torch.maximum(phi @ children.T, floor)  # (N, width)
        torch.index_select(table.view(-1, 2), 0, row, out=out)

    @staticmethod
    def _gathered_pairs(phi: Tensor, children: Tensor, floor: Tensor, pos: Tensor, k: int, out: Tensor) -> None:
        """Clamped scores ``out`` (W, 2) of both children (of the level's nodes ``children`` (width, F)) of each
        walker's node (``pos``: its index in its level), gathered per walker (in blocks of queries only where the
        device's memory budget requires them, ``TreeStore.blocks``' budget)."""
        pairs = children.view(-1, 2 * children.shape[1])  # (width / 2, 2F) row i: both children of node i
        raw = phi.new_empty(pos.shape[0], 2)  # (W, 2)
        step = max(1, GPU_BLOCK_ELEMENTS // (2 * k * phi.shape[1]))  # queries per block
        for lo in range(0, phi.shape[0], step):
            hi = min(lo + step, phi.shape[0])
            z = pairs.index_select(0, pos[lo * k : hi * k]).view(hi - lo, 2 * k, -1)  # (b, 2k, F)
            torch.bmm(phi[lo:hi].unsqueeze(1), z.transpose(1, 2), out=raw[lo * k : hi * k].view(hi - lo, 1, 2 * k))
        torch.maximum(raw, floor.view(-1, 2).index_select(0, pos), out=out)

    def path_log_q(self, phi: Tensor, bucket: Tensor, top: Tensor) -> Tensor:
        """Log-probability (N, k) that query i's walk reaches ``bucket[i, j]`` (N, k), phi (N, F), ``top`` its
        reach of level t (N, 2^t); one query phi (1, F) with ``top`` (1, 2^t) serves buckets of any shape."""
        store, level = self.store, top.shape[1].bit_length() - 1  # top: (N, 2^t)
        steps = store.depth - level
        leaf = bucket + store.num_buckets  # 1-based heap index of each bucket
        if steps == 0:
            return self._top_of(top, leaf - (1 << level))
        shifts = self.shifts(steps, bucket.device)  # (steps + 1,): the last ``steps`` levels top down, then 0
        path = leaf.unsqueeze(-1) >> shifts  # (..., steps + 1) 1-based heap index of the path's nodes from level t
        log_q = self._top_of(top, path[..., 0] - (1 << level))  # the reach of the level-t ancestor
        parents = path[..., :-1] - 1  # (..., steps) 0-based heap index of the node left at each level
        right = (path[..., 1:] & 1).unsqueeze(-1)  # (..., steps, 1) 1 where the path goes right
        feats, per_query = phi.shape[1], phi.shape[0] > 1
        pairs, floor = store.nodes[1:].view(-1, 2, feats), store.floor[1:].view(-1, 2)
        where = parents.reshape(phi.shape[0], -1) if per_query else parents.reshape(-1, steps)  # (N or K, k steps)

        def block(lo: int, hi: int) -> Tensor:
            rows = where[lo:hi].reshape(-1)
            z = pairs.index_select(0, rows)  # (b k steps, 2, F)
            if per_query:  # one query per row of bucket: (b, k steps 2, F) against phi (b, F)
                raw = torch.bmm(z.view(hi - lo, -1, feats), phi[lo:hi].unsqueeze(2))  # (b, k steps 2, 1)
            else:
                raw = z.view(-1, feats) @ phi[0]  # (b steps 2,)
            return torch.maximum(raw.view(-1, 2), floor.index_select(0, rows))  # (b k steps, 2)

        s = store.blocks(block, where.shape[0], where.shape[1] * 2 * feats).view(*parents.shape, 2)  # (..., steps, 2)
        return log_q + (s.gather(-1, right).squeeze(-1) / s.sum(-1)).log().sum(-1)

    def shifts(self, steps: int, device: torch.device) -> Tensor:
        """(steps + 1,) right shifts from a leaf to its ancestors at levels depth - steps, ..., depth: steps..0."""
        key = (-steps, device)  # negative keys: no clash with ``ancestors``' levels
        if key not in self._ancestors:
            self._ancestors[key] = torch.arange(steps, -1, -1, device=device)
        return self._ancestors[key]

    @staticmethod
    def _top_of(top: Tensor, start: Tensor) -> Tensor:
        """``top``'s entries at level-t positions ``start``: (N, k) per query, or any shape for one query."""
        if top.shape[0] > 1:
            return top.gather(1, start)  # (N, k)
        return top[0].index_select(0, start.reshape(-1)).view(start.shape)
