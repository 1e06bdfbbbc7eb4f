"""The kernel tree's descent in the same operators at every depth: the GPU path of ``TreeWalk``.

``TreeWalk`` descends level by level (a few operators per level, cache-sized blocks per level on a CPU), so a
step's operator count grows with log n and with the batch. Here the top levels are scored for every node at
once and each walker draws its last levels in one stage:

1. ``top_reach``: one product of the queries with every node of levels 1..T (T = max(depth - ``WALKED_LEVELS``,
   min(depth, ``SCORED_LEVELS``)), less where its scores would pass the memory budget: a tree of up to
   2^SCORED_LEVELS buckets is scored whole) gives each node's clamped score, hence every branch probability of
   those levels. The log-probability of reaching each node of level t is the sum of its ancestors' branch
   log-probabilities (one sparse product with a fixed 0/1 ancestor matrix): the walk's own probability of arriving
   there, not an approximation. t = T where the tree is deeper than T; where it is scored whole, t = depth -
   ``STAGE_LEVELS`` (the last levels are drawn in a stage, as in a deeper tree, so the operators are nearly the same
   at every depth). One
   query (a batch's mixture psi) takes t = T = the whole depth where its product, a matrix-vector product, reads at
   most ``single_reads`` node values (the GPU paths' budget, 2^30: at 10^6 RFF classes, 2^18 nodes of 2,048
   features, 537 M values), and draws its buckets straight from the reach.
2. ``descend``: each walker draws its level-t node from the reach (inverse CDF: a cumulative sum and a sorted
   search), then the s levels below it in stages of up to ``STAGE_LEVELS``: the clamped scores of the 2^(s+1) - 2
   nodes under its node (read from the product where the tree was scored whole; else its 2^s deepest nodes gathered
   and scored, their parents' scores their sums) give the log-probability of each of the 2^s paths, and a Gumbel-max
   picks one. Known buckets (a step's targets, or any ids whose log q is asked for) walk down with the draws, their
   paths given by their index's bits instead of drawn, so their probabilities come from the same scores.

Draws and log q follow the same branch probabilities as ``TreeWalk`` (the same clamps max(<phi, z>, floor)), so
the proposal is the same distribution; only its random numbers are used differently. Where the tree is scored
whole the stage reads nothing new; a gathered stage of two levels reads as many node rows per walker as ``TreeWalk``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.sampler.kernel.heap_paths import ancestor_matrix
from lmtrain.sampler.kernel.store import GPU_BLOCK_ELEMENTS, TreeStore
from lmtrain.sampler.options import KernelOptions

# levels below the product that walkers descend by gathered stages at most (two stages): the levels above are scored
# for all of their nodes by one product, however deep the tree, so the operator count is bounded
WALKED_LEVELS = 4
# levels one stage draws at most. A gathered stage reads the 2^s nodes of its last level per walker (their parents'
# scores are their sums): 2 levels read 4 rows, as walking them one at a time does, 3 levels 8 rows for 6, 4 levels
# 16 for 8; deeper walks take more stages
STAGE_LEVELS = 3
# levels scored whole at least (while the tree has them). At N = 700 queries and m = 100 walkers each, one product
# with a level costs less than gathering its walkers' rows, at a GPU's 256 multiply-adds per gathered value (a gather
# is bound by memory: about 3 ps a value; a TF32 multiply-add about 0.005 ps), up to a level of 37,864 nodes; 2^15 is
# the largest level below that. A tree of up to 2^15 buckets (10^5 RFF classes, 10^6 quadratic ones) is scored whole.
# More levels were timed against this default on a GPU: docs/bench/gpu_h200_scored_levels.md
SCORED_LEVELS = KernelOptions.scored_levels
# the log-probability of a branch of probability 0 (an empty node's): finite, so that no product meets -inf (one that
# multiplied its zeros too would make NaN of it); its exp, and that of a path's sum of them, is 0, as -inf's
NEVER = -1e30


class Reach(NamedTuple):
    """What ``top_reach`` computes once per step: ``log_reach`` (N, 2^t), the log-probability that each query's walk
    reaches each node of level t, and, where the product scored the whole tree below t, ``scores`` (N, 2^(depth+1)
    - 2): every node's clamped score below the root (None where the stages gather theirs)."""

    log_reach: Tensor
    scores: Tensor | None = None


class FixedWalk:
    """``TreeWalk``'s descent and path probabilities with a fixed operator count (see the module docstring).

    It reads the store's tensors at every call, like ``TreeWalk``. The top levels are scored whole by
    ``top_reach``: the first ``scored`` levels at least, and all but the last ``walked`` at least (one query: every
    level, within ``single_reads`` node values); walkers draw the rest in stages of ``STAGE_LEVELS``."""

    def __init__(
        self,
        store: TreeStore,
        walked: int = WALKED_LEVELS,
        scored: int = SCORED_LEVELS,
        single_reads: int = GPU_BLOCK_ELEMENTS,
    ) -> None:
        self.store = store
        self.walked, self.scored = walked, scored
        self.single_reads = single_reads  # node values one query's product may read to score the tree whole
        self._tables: dict[tuple, Tensor] = {}  # index tables, made once per (kind, level, device)

    def scored_level(self, n_query: int) -> int:
        """T: the deepest level ``top_reach``'s product scores for ``n_query`` queries (see the module docstring);
        below ``scored`` where its scores (N x 2^(T+1) values) would pass the GPU paths' memory budget."""
        depth = self.store.depth
        if n_query == 1 and ((2 << depth) - 2) * self.store.nodes.shape[1] <= self.single_reads:
            return depth
        level = max(0, depth - self.walked, min(depth, self.scored))
        while level > max(0, depth - self.walked) and n_query * (2 << level) > GPU_BLOCK_ELEMENTS:
            level -= 1
        return level

    def top(self, n_query: int) -> int:
        """t: the level whose nodes the walkers of ``n_query`` queries draw from the reach (0: the root)."""
        depth, scored = self.store.depth, self.scored_level(n_query)
        if scored < depth or n_query == 1:
            return scored
        return max(0, depth - STAGE_LEVELS)  # scored whole: the last levels drawn in a stage, as in a deeper tree

    def top_reach(self, phi: Tensor) -> Reach:
        """The ``Reach`` of queries phi (N, F), from one product with the nodes of levels 1..T."""
        n_query, depth = phi.shape[0], self.store.depth
        scored, level = self.scored_level(n_query), self.top(n_query)
        if scored == 0:
            return Reach(phi.new_zeros(n_query, 1))
        count = (2 << scored) - 1  # nodes of levels 0..T
        s = torch.maximum(phi @ self.store.nodes[1:count].T, self.store.floor[1:count])  # (N, 2^(T+1) - 2)
        table = s if level < scored == depth else None
        if level == 0:
            return Reach(phi.new_zeros(n_query, 1), table)
        pairs = s[:, : (2 << level) - 2].view(n_query, -1, 2)  # (N, 2^t - 1, 2) levels 1..t
        branch = (pairs / pairs.sum(2, keepdim=True)).log().nan_to_num(nan=NEVER, neginf=NEVER)  # empty pairs: 0 / 0
        log_reach = torch.mm(self.ancestors(level, branch), branch.flatten(1).T).T  # (N, 2^t): sums over each path
        return Reach(log_reach, table)

    def ancestors(self, level: int, like: Tensor) -> Tensor:
        """The sparse CSR matrix (2^level, 2^(level+1) - 2) of ones, of ``like``'s dtype and device, where row r (a
        node of ``level``) meets the columns of its ancestors on levels 1..level, itself included, in the table of
        branch log-probabilities (heap index - 1); made once per level, dtype and device."""
        key = ("ancestors", level, like.dtype, like.device)
        if key not in self._tables:
            self._tables[key] = ancestor_matrix(level, range(1, level + 1), 2, (2 << level) - 2, like)
        return self._tables[key]

    def descend(self, phi: Tensor, k: int, reach: Reach, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """k walkers per query phi (N, F), from the ``reach`` of level t, and ``known`` buckets (N, j) walked down
        their own paths: walker w belongs to query w // (k + j), the known ones last. The buckets reached (W,) and
        each path's log-probability (W,), W = N (k + j)."""
        n_query = phi.shape[0]
        level = reach.log_reach.shape[1].bit_length() - 1  # log_reach: (N, 2^t)
        steps = self.store.depth - level
        starts = [] if known is None else [known >> steps if steps else known]  # (N, j): their level-t ancestors
        if k:
            cdf = reach.log_reach.exp().cumsum(1)  # (N, 2^t)
            target = torch.rand(n_query, k, device=phi.device) * cdf[:, -1:]  # (N, k) uniform in [0, total]
            # the first node whose cdf reaches the target: never a node of probability 0 (its cdf equals its left
            # neighbour's), so a target rounded up to the total takes the last node of positive probability
            starts.insert(0, torch.searchsorted(cdf, target))  # (N, k)
        pos = torch.cat(starts, 1) if len(starts) > 1 else starts[0]  # (N, k + j)
        log_path = reach.log_reach.gather(1, pos)  # (N, k + j)
        for size in self.stages(steps):
            bits = None if known is None else self._bits(known, self.store.depth - level - size, size)
            pos, log_stage = self._stage(phi, pos, level, size, k, bits, reach.scores)
            log_path, level = log_path + log_stage, level + size
        return pos.view(-1), log_path.view(-1)

    @staticmethod
    def stages(steps: int) -> list[int]:
        """The levels of each stage that descends ``steps`` levels: as few stages as ``STAGE_LEVELS`` allows, of
        near-equal size (4 levels: 2 and 2)."""
        count = -(-steps // STAGE_LEVELS)
        return [steps // count + (i < steps % count) for i in range(count)]

    @staticmethod
    def _bits(known: Tensor, below: int, size: int) -> Tensor:
        """The turns (N, j) of the known buckets' paths through a stage of ``size`` levels, ``below`` levels above
        the leaves: the index of the node they reach at its end, among the 2^size under its start."""
        return (known >> below if below else known) & ((1 << size) - 1)

    def _stage(
        self, phi: Tensor, pos: Tensor, level: int, size: int, k: int, bits: Tensor | None, scores: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Walkers (N, K) on the nodes ``pos`` of ``level`` (their index in it) go ``size`` levels down: the first
        k of each query by a draw, the others by ``bits`` (N, K - k). The nodes reached (N, K) (their index in
        level + size) and the log-probability of the turns taken (N, K)."""
        n_query, walkers = pos.shape
        if scores is None:
            clamped = self._gathered_scores(phi, pos, level, size)  # (N, K, S), S = 2^(size+1) - 2
        else:
            shifts, offsets = self._subtree(level, size, pos.device)  # (S,) each
            columns = (pos.unsqueeze(2) << shifts) + offsets  # (N, K, S) each subtree node's column in ``scores``
            clamped = scores.gather(1, columns.view(n_query, -1)).view(n_query, walkers, -1)
        pairs = clamped.view(n_query, walkers, -1, 2)  # (N, K, S / 2, 2) siblings
        branch = (pairs / pairs.sum(3, keepdim=True)).log().nan_to_num(nan=float("-inf")).view(n_query, walkers, -1)
        paths = branch[..., :2]  # (N, K, 2^l): the log-probability of each path through the stage's first l levels
        for level_width in (1 << d for d in range(2, size + 1)):  # a path's log-probability: its parent's + its turn
            turns = branch[..., level_width - 2 : 2 * level_width - 2].view(n_query, walkers, -1, 2)
            paths = (paths.unsqueeze(3) + turns).flatten(2)  # (N, K, 2^l)
        pick = bits
        if k:
            noise = torch.empty_like(paths[:, :k]).exponential_()  # (N, k, 2^size): -log E is Gumbel noise
            pick = (paths[:, :k] - noise.log()).argmax(2)  # (N, k) Gumbel-max: a path drawn by its probability
            pick = pick if bits is None else torch.cat([pick, bits], 1)  # (N, K)
        log_stage = paths.gather(2, pick.unsqueeze(2)).squeeze(2)  # (N, K)
        return torch.add(pick, pos, alpha=1 << size), log_stage

    def _gathered_scores(self, phi: Tensor, pos: Tensor, level: int, size: int) -> Tensor:
        """Clamped scores (N, K, 2^(size+1) - 2) of the nodes under each walker's node (``pos`` (N, K) on
        ``level``), in subtree order (size 2: both children, then the four grandchildren), from the 2^size rows of
        its last level gathered (in blocks of queries only where the memory budget requires them)."""
        n_query, walkers = pos.shape
        store, feats, width = self.store, phi.shape[1], 1 << size
        start = ((1 << level) << size) - 1  # the heap row of the first node ``size`` levels below ``level``
        offsets = self._table("leaf", start, width, pos.device)
        rows = torch.add(offsets, pos.unsqueeze(2), alpha=width).view(n_query, -1)  # (N, K 2^size) heap rows

        def block(lo: int, hi: int) -> Tensor:
            z = store.nodes.index_select(0, rows[lo:hi].flatten()).view(hi - lo, -1, feats)  # (b, K 2^size, F)
            return torch.bmm(z, phi[lo:hi].unsqueeze(2))  # (b, K 2^size, 1)

        raw = store.blocks(block, n_query, walkers * width * feats).view(n_query, walkers, width)
        floor = store.floor.index_select(0, rows.flatten()).view(n_query, walkers, width)  # (N, K, 2^size)
        if size == 1:
            return torch.maximum(raw, floor)
        # a node's score is the sum of its children's (its node sum is theirs); its floor is eps unless it is empty,
        # and so is its leftmost leaf's (the empty buckets are the last ones)
        clamped = raw.new_empty(n_query, walkers, 2 * width - 2)
        for d in range(size, 0, -1):  # the stage's levels, bottom up: columns 2^d - 2 .. 2^(d + 1) - 3
            if d < size:
                raw = raw.view(n_query, walkers, -1, 2).sum(3)  # (N, K, 2^d)
            torch.maximum(raw, floor[..., :: 1 << size - d], out=clamped[..., (1 << d) - 2 : (2 << d) - 2])
        return clamped

    def _subtree(self, level: int, size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """For the nodes ``size`` levels under a node p of ``level``, in subtree order: the shifts (S,) and offsets
        (S,) that give their columns in ``Reach.scores`` as (p << shift) + offset (column = 1-based heap index - 2)."""
        key = ("subtree", level, size, device)
        if key not in self._tables:
            levels = range(1, size + 1)  # made on the device: no copy from the host
            relative = torch.cat([torch.full((1 << d,), d, device=device) for d in levels])  # (S,) level under p
            index = torch.cat([torch.arange(1 << d, device=device) for d in levels])  # (S,) index within it
            self._tables[key] = torch.stack([relative, ((1 << level) << relative) + index - 2])
        shifts, offsets = self._tables[key]
        return shifts, offsets

    def _table(self, kind: str, start: int, width: int, device: torch.device) -> Tensor:
        """start + arange(width) on ``device``, made once."""
        key = (kind, start, width, device)
        if key not in self._tables:
            self._tables[key] = torch.arange(start, start + width, device=device)
        return self._tables[key]

    def path_log_q(self, phi: Tensor, bucket: Tensor, reach: Reach) -> Tensor:
        """Log-probability (N, k) that query i's walk reaches ``bucket[i, j]`` (N, k), phi (N, F), from its
        ``reach``; one query phi (1, F) serves buckets of any shape. The buckets walk down as known walkers."""
        known = bucket if phi.shape[0] > 1 else bucket.reshape(1, -1)
        return self.descend(phi, 0, reach, known)[1].view(bucket.shape)
