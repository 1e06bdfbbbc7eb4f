"""Divide-and-conquer sampling from a kernel proposal q_i ∝ K(h, w_i), per example or batch-shared."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.walk import TreeWalk

GATHER_COST = 4.0  # a node read by a per-id path gather costs ~4x one read by a level's GEMM (PTB shape, 1 thread)
WALK_COST = 0.5  # walk cost units per dense cost unit; measured at the PTB shape (docs/strategies.md)
DENSE_MAX_ENTRIES = 1 << 26  # (N, n) log q entries a dense draw may hold (256 MiB in float32)


class BucketScores(NamedTuple):
    """One psi's in-bucket log weights (B, L), filled for the buckets marked ``done`` (B,): a step's table."""

    table: Tensor
    done: Tensor


class KernelTree(TreeWalk):
    """Draws from kernel proposals through a tree of node sums z(C) = sum of phi(w_j), j in C (``TreeStore``).

    Per example (``sample``, ``log_q``): query h descends with phi(h) (``TreeWalk``), then picks a class in the
    bucket with probability K(h, w_j) / sum over the bucket, computed exactly in the original space.

    Batch-shared (``mixture``, ``sample_mixture``, ``log_q_mixture``): one feature-space query
    psi = sum_i c_i phi(h_i), c_i ∝ 1 / Z_i with Z_i = max(<phi(h_i), z(root)>, eps) and sum_i c_i = 1, descends
    the same tree and picks in the bucket ∝ max(<psi, phi(w_j)>, eps). Since <phi(h_i), phi(w_j)> / Z_i is
    example i's proposal, psi's walk draws from the mixture (1/N) sum_i q_i of the batch's proposals (exactly
    for an exact feature map: quadratic); with estimated features (RFF) the proposal q-bar is by definition the
    product of the clamped probabilities the walk uses, which ``log_q_mixture`` returns for any ids.

    In both modes ``log_q`` follows the same branch probabilities and the same in-bucket normalization as the
    draws, so it is the exact log-probability of a draw. The per-example methods take the queries' features
    ``phi`` (``features(query)``) when the caller has them already, the batch-shared ones a ``BucketScores`` of
    psi: a step's proposal (``lmtrain.sampler.kernel.proposal``) computes each once for its draws and its targets.
    """

    # --- per example ----------------------------------------------------------------------------
    def sample(self, query: Tensor, num_samples: int, phi: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """query (N, d) -> ids (N, m) drawn per example, and their exact log q (N, m)."""
        self._check(query)
        n_query = query.shape[0]
        uniform = torch.rand(self.depth, n_query * num_samples, device=query.device)
        phi = self.features(query) if phi is None else phi
        bucket, log_path = self._descend(phi, num_samples, uniform)  # (W,) each, W = N m
        ids, log_in = self._pick(*self._kernel_log_weights(query, bucket, num_samples))  # (W,) each
        return ids.view(n_query, num_samples), (log_path + log_in).view(n_query, num_samples)

    def sample_dense(self, query: Tensor, num_samples: int, phi: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The draws of ``sample`` from the same q, made by computing every class's log q first (``log_q_all``) and
        drawing m ids per row from it: one (N, F) x (F, nodes) product per level and one (N, d) x (d, n) product,
        whatever m. Cheaper than m walks per example when n is small (``dense_draw_pays``)."""
        log_q = self.log_q_all(query, phi)  # (N, n)
        ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
        return ids, log_q.gather(1, ids)

    def dense_draw_pays(self, n_query: int, num_samples: int) -> bool:
        """Whether ``sample_dense`` costs less than ``sample`` for N queries and m draws each: dense reads every
        node once per query (2B F) and scores every class (n d); m walks read depth x 2F node values and a bucket
        of L classes each. ``WALK_COST`` converts between the two; measured at the PTB shape (N = 400, d' = 201,
        n = 10^4, one thread), the crossover is m ~ 40 for quadratic and m ~ 270 for RFF (D = 1024)."""
        in_features = self.weight.shape[1]
        feats = self.nodes.shape[1]
        dense = 2 * self.num_buckets * feats + self.num_classes * in_features
        walk = num_samples * (self.depth * 2 * feats + self.bucket_size * in_features)
        return dense <= WALK_COST * walk and n_query * self.num_classes <= DENSE_MAX_ENTRIES

    def log_q(self, query: Tensor, ids: Tensor, phi: Tensor | None = None) -> Tensor:
        """Exact log q of any ids (N, k) under the walk that ``sample`` performs, (N, k)."""
        self._check(query)
        n_query, k = ids.shape
        bucket = torch.div(ids, self.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self._kernel_log_weights(query, bucket.reshape(-1), k)  # (W, L)
        pick = (ids - bucket * self.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        if self.depth == 0:
            return log_in
        return self._path_log_q(self.features(query) if phi is None else phi, bucket) + log_in

    def log_q_many(self, query: Tensor, ids: Tensor, phi: Tensor | None = None) -> Tensor:
        """``log_q`` of ids (N, k) drawn elsewhere (a kernel proposal's unigram share), through every query's
        probability of reaching every bucket (one product per level, ``_log_reach``) when the tree has few buckets
        for the number of ids: reach reads 2B node sums per query, the paths k x depth x 2 (gathered,
        ``GATHER_COST`` times slower each)."""
        n_query, k = ids.shape
        if self.depth == 0 or self.num_buckets > GATHER_COST * k * self.depth * 2:
            return self.log_q(query, ids, phi)
        bucket = torch.div(ids, self.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self._kernel_log_weights(query, bucket.reshape(-1), k)  # (N k, L)
        pick = (ids - bucket * self.bucket_size).view(-1, 1)  # (N k, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        reach = self._log_reach(self.features(query) if phi is None else phi)  # (N, B)
        return reach.gather(1, bucket) + log_in  # (N, k)

    def log_q_all(self, query: Tensor, phi: Tensor | None = None) -> Tensor:
        """Exact log q of every class for each query, (N, n): the walk's branch probabilities for every node of
        the tree at once times the in-bucket probabilities. For diagnostics."""
        self._check(query)
        n_query, size = query.shape[0], self.bucket_size
        log_node = self._log_reach(self.features(query) if phi is None else phi)  # (N, B)
        dots = self.features.prepare(query) @ self.features.prepare(self.weight).T  # (N, n)
        logk = self.features.log_kernel_dot(dots)
        logk = nn.functional.pad(logk, (0, self.num_buckets * size - self.num_classes), value=float("-inf"))
        log_in = torch.log_softmax(logk.view(n_query, self.num_buckets, size), dim=2)  # (N, B, L)
        return (log_node.unsqueeze(2) + log_in).flatten(1)[:, : self.num_classes]

    def _kernel_log_weights(self, query: Tensor, bucket: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """log K(h, w_j) for the members of each walker's bucket (W,) -> (W, L) (-inf on padding),
        and the member ids (W, L); walker w belongs to query w // k."""
        size, n_query = self.bucket_size, query.shape[0]
        ids = self._member_ids(bucket)  # (W, L)
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

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def mixture(self, query: Tensor) -> Tensor:
        """The feature-space query psi (F,) of the batch's mixture proposal, from the queries (N, d):
        psi = sum_i c_i phi(h_i) with c_i = (1 / Z_i) / sum_k (1 / Z_k), Z_i = max(<phi(h_i), z(root)>, eps).

        psi is proportional to (1/N) sum_i phi(h_i) / Z_i, whose walk draws from the mixture; the walk does not
        depend on the scale except through the eps clamps, and with weights summing to 1 the node scores keep
        the scale of one query's (for the quadratic kernel every score is >= |C| >= 1, so no clamp binds)."""
        self._check(query)
        return self.features.mixture(query, self.nodes[0], self.floor[0])

    def bucket_scores(self, psi: Tensor) -> BucketScores:
        """An empty table of psi's in-bucket log weights, filled as buckets are asked for (``BucketScores``)."""
        done = torch.zeros(self.num_buckets, dtype=torch.bool, device=psi.device)
        return BucketScores(psi.new_empty(self.num_buckets, self.bucket_size), done)

    def sample_mixture(
        self, psi: Tensor, num_samples: int, scores: BucketScores | None = None
    ) -> tuple[Tensor, Tensor]:
        """``num_samples`` ids (m,) drawn with psi's walk (see ``mixture``) and their exact log q-bar (m,)."""
        uniform = torch.rand(self.depth, num_samples, device=psi.device)
        bucket, log_path = self._descend(psi.unsqueeze(0), num_samples, uniform)  # (m,) each
        ids, log_in = self._pick(*self._mixture_log_weights(psi, bucket, scores))  # (m,) each
        return ids, log_path + log_in

    def log_q_mixture(self, psi: Tensor, ids: Tensor, scores: BucketScores | None = None) -> Tensor:
        """Exact log q-bar of any ids (any shape) under psi's walk, the same shape."""
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.bucket_size, rounding_mode="floor")  # (K,)
        distinct, inverse = torch.unique(bucket, return_inverse=True)  # each bucket's members scored once
        logw, _ = self._mixture_log_weights(psi, distinct, scores)  # (u, L)
        log_in = torch.log_softmax(logw, 1)[inverse, flat - bucket * self.bucket_size]  # (K,)
        return (self._shared_path_log_q(psi, bucket) + log_in).view(ids.shape)

    def log_q_all_mixture(self, psi: Tensor) -> Tensor:
        """Exact log q-bar of every class, (n,): psi's branch probabilities for every node at once times the
        in-bucket probabilities. For diagnostics and tests."""
        log_node = self._log_reach(psi.unsqueeze(0))[0]  # (B,)
        logw, _ = self._mixture_log_weights(psi, torch.arange(self.num_buckets, device=psi.device))  # (B, L)
        return (log_node.unsqueeze(1) + torch.log_softmax(logw, 1)).flatten()[: self.num_classes]

    def _mixture_log_weights(
        self, psi: Tensor, bucket: Tensor, scores: BucketScores | None = None
    ) -> tuple[Tensor, Tensor]:
        """log max(<psi, phi(w_j)>, eps) for the members of each bucket (W,) -> (W, L) (-inf on padding), and the
        member ids (W, L). A step asks twice for one psi (its draws, then its targets' log q-bar), mostly for the
        same buckets: with the step's ``scores`` each bucket is scored once (B x L values), with phi(w_j) read from
        the feature cache when there is one, in memory-bounded chunks."""
        table, done = scores if scores is not None else self.bucket_scores(psi)
        distinct = torch.unique(bucket)
        todo = distinct[~done[distinct]]  # (u,) buckets not scored yet for this psi
        cached = self.cache.active

        def block(lo: int, hi: int) -> Tensor:
            if cached:  # the cache's padding rows are zero: their scores clamp to eps and are masked below
                members = self._member_ids(todo[lo:hi])  # (b, L)
                valid = members < self.num_classes
                scores = self.cache.scores(psi, members).clamp_min(self.eps)  # (b, L)
            else:
                rows, valid = self._members(todo[lo:hi])  # (b, L, d), (b, L)
                scores = self.features.inner(psi, rows).clamp_min(self.eps)  # (b, L)
            return scores.log().masked_fill(~valid, float("-inf"))

        if todo.numel():
            dim = psi.numel() if cached else self.weight.shape[1]
            per_bucket = self.bucket_size * dim if cached else self.features.sum_elements(self.bucket_size, dim)
            table[todo] = self._blocks(block, todo.numel(), per_bucket)
            done[todo] = True
        return table[bucket], self._member_ids(bucket)  # (W, L) each
