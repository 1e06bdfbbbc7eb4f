"""Divide-and-conquer sampling from a kernel proposal q_i ∝ K(h, w_i), per example or batch-shared."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.buckets import BucketScorer, BucketScores
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.gpu_draws import FixedDraws, FixedStep
from lmtrain.sampler.kernel.store import TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk
from lmtrain.sampler.options import KernelOptions

# the cost of a node read by a per-id path gather (scattered rows, a small product each) in units of one read by a
# level's GEMM (one streamed product), and of a walk's work in units of a dense draw's: both measured constants of
# the cost rules below (docs/architecture.md, measured design choices)
GATHER_COST = 4.0
WALK_COST = 0.5
DENSE_MAX_ENTRIES = 1 << 26  # (N, n) log q entries a dense draw may hold (256 MiB in float32)


class KernelTree(nn.Module):
    """Draws from kernel proposals through a tree of node sums z(C) = sum of phi(w_j), j in C.

    It is composed of parts with one job each, which the methods below put together: the feature map ``features``
    (phi; the only part with checkpointed state, RFF's frequencies), the ``store`` (``TreeStore``: the node sums,
    built and updated from the weights), the ``walk`` (``TreeWalk``: the descent through the store's sums and the
    probability of its paths) and the ``scorer`` (``BucketScorer``: the weights of the classes inside a bucket).

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

    Two backends, chosen for the device (``use_fixed_backend``): the walk (a CPU's: cache-sized blocks, distinct rows
    once) and the fixed one (a GPU's: ``FixedDraws``, fixed operators, no host sync; the step's ``FixedStep``).
    """

    def __init__(
        self, features: FeatureMap, dense_factor: float = 64, chunk_elements: int = 1 << 22, **options: Any
    ) -> None:
        super().__init__()
        self.fixed_backend = False  # the backend, chosen by the sampler for the device (KernelTree.use_fixed_backend)
        opts = KernelOptions(**options)  # leaf_size, eps, refresh, ...: the keys left out take their defaults
        self.features = features  # registered here only: its state-dict keys stay `...tree.features.*`
        self.store = TreeStore(features, opts, chunk_elements)  # the node sums and their update (no persistent state)
        self.walk = TreeWalk(self.store, dense_factor)  # not a module (nor the scorer): they hold no tensors
        self.scorer = BucketScorer(features, self.store, self.walk)
        self.fixed = FixedDraws(self.store, self.scorer, opts.scored_levels)

    def fixed_step(self, query: Tensor | None = None, phi: Tensor | None = None) -> FixedStep | None:
        """On the GPU paths, what a step's draws and log q share (``FixedStep``): for the queries (N, d) their
        kernel form, features and reach of the top levels, or for features ``phi`` (1, F) (a mixture's psi) the
        reach; None on a CPU."""
        if not self.fixed_backend:
            return None
        if query is not None:
            self._check(query)
        return self.fixed.step_of(self.features, query, phi)

    # --- the store: building and the shape of the tree --------------------------------------------
    def rebuild(self, weight: Tensor) -> None:
        """Recompute every node from ``weight`` (n, d)."""
        self.store.rebuild(weight)

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the buckets holding the changed ``rows`` up to the current ``weight`` (``TreeStore.update``)."""
        self.store.update(weight, rows)

    @property
    def weight(self) -> Tensor | None:
        """The class vectors (n, d) of the last rebuild or update, None before the first."""
        return self.store.weight

    @property
    def nodes(self) -> Tensor:
        """The node sums (2B - 1, F), a heap array."""
        return self.store.nodes

    @property
    def num_classes(self) -> int:
        return self.store.num_classes

    @property
    def num_buckets(self) -> int:
        return self.store.num_buckets

    @property
    def bucket_size(self) -> int:
        return self.store.bucket_size

    @property
    def depth(self) -> int:
        return self.store.depth

    def use_fixed_backend(self, on: bool) -> None:
        """Switch the tree and its parts (the store and its cache, the scorer's blocks) to the fixed backend (a GPU's)
        or to the walk (a CPU's)."""
        self.fixed_backend = self.store.fixed_backend = bool(on)

    def _check(self, query: Tensor) -> None:
        if self.weight is None:
            raise RuntimeError("KernelTree is empty: call update(weight) (or rebuild) before sampling")
        if query.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"query has {query.shape[-1]} features, class vectors {self.weight.shape[1]}")

    # --- per example ----------------------------------------------------------------------------
    def sample(
        self, query: Tensor, num_samples: int, phi: Tensor | None = None, fixed: FixedStep | None = None
    ) -> tuple[Tensor, Tensor]:
        """query (N, d) -> ids (N, m) drawn per example, and their exact log q (N, m)."""
        self._check(query)
        if self.fixed_backend:
            return self.fixed.sample(query, self.features(query) if phi is None else phi, num_samples, fixed)
        n_query = query.shape[0]
        uniform = torch.rand(self.depth, n_query * num_samples, device=query.device)
        phi = self.features(query) if phi is None else phi
        bucket, log_path = self.walk.descend(phi, num_samples, uniform)  # (W,) each, W = N m
        ids, log_in = self.walk.pick(*self.scorer.kernel(query, bucket, num_samples))  # (W,) each
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
        of L classes each. ``WALK_COST`` converts between the two (a walk's reads are scattered, a dense draw's
        streamed; the crossover it gives is in docs/strategies.md)."""
        in_features = self.weight.shape[1]
        feats = self.nodes.shape[1]
        dense = 2 * self.num_buckets * feats + self.num_classes * in_features
        walk = num_samples * (self.depth * 2 * feats + self.bucket_size * in_features)
        if self.fixed_backend:  # the fixed walk: the same operators whatever n
            return False
        return dense <= WALK_COST * walk and n_query * self.num_classes <= DENSE_MAX_ENTRIES

    def log_q(self, query: Tensor, ids: Tensor, phi: Tensor | None = None, fixed: FixedStep | None = None) -> Tensor:
        """Exact log q of any ids (N, k) under the walk that ``sample`` performs, (N, k)."""
        self._check(query)
        if self.fixed_backend:
            return self.fixed.log_q(query, self.features(query) if phi is None else phi, ids, fixed)
        n_query, k = ids.shape
        bucket = torch.div(ids, self.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k)  # (W, L)
        pick = (ids - bucket * self.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        if self.depth == 0:
            return log_in
        return self.walk.path_log_q(self.features(query) if phi is None else phi, bucket) + log_in

    def log_q_many(
        self, query: Tensor, ids: Tensor, phi: Tensor | None = None, fixed: FixedStep | None = None
    ) -> Tensor:
        """``log_q`` of ids (N, k) drawn elsewhere (a kernel proposal's unigram share), through every query's
        probability of reaching every bucket (one product per level, ``TreeWalk.log_reach``) when the tree has few
        buckets for the number of ids: reach reads 2B node sums per query, the paths k x depth x 2 (gathered,
        ``GATHER_COST`` times slower each)."""
        n_query, k = ids.shape
        if self.fixed_backend or self.depth == 0 or self.num_buckets > GATHER_COST * k * self.depth * 2:
            return self.log_q(query, ids, phi, fixed)
        bucket = torch.div(ids, self.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k)  # (N k, L)
        pick = (ids - bucket * self.bucket_size).view(-1, 1)  # (N k, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        reach = self.walk.log_reach(self.features(query) if phi is None else phi)  # (N, B)
        return reach.gather(1, bucket) + log_in  # (N, k)

    def log_q_all(self, query: Tensor, phi: Tensor | None = None) -> Tensor:
        """Exact log q of every class for each query, (N, n): the walk's branch probabilities for every node of
        the tree at once times the in-bucket probabilities. For diagnostics."""
        self._check(query)
        n_query, size = query.shape[0], self.bucket_size
        log_node = self.walk.log_reach(self.features(query) if phi is None else phi)  # (N, B)
        dots = self.features.prepare(query) @ self.features.prepare(self.weight).T  # (N, n)
        logk = self.features.log_kernel_dot(dots)
        logk = nn.functional.pad(logk, (0, self.num_buckets * size - self.num_classes), value=float("-inf"))
        log_in = torch.log_softmax(logk.view(n_query, self.num_buckets, size), dim=2)  # (N, B, L)
        return (log_node.unsqueeze(2) + log_in).flatten(1)[:, : self.num_classes]

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def mixture(self, query: Tensor) -> Tensor:
        """The feature-space query psi (F,) of the batch's mixture proposal, from the queries (N, d):
        psi = sum_i c_i phi(h_i) with c_i = (1 / Z_i) / sum_k (1 / Z_k), Z_i = max(<phi(h_i), z(root)>, eps).

        psi is proportional to (1/N) sum_i phi(h_i) / Z_i, whose walk draws from the mixture; the walk does not
        depend on the scale except through the eps clamps, and with weights summing to 1 the node scores keep
        the scale of one query's (for the quadratic kernel every score is >= |C| >= 1, so no clamp binds)."""
        self._check(query)
        return self.features.mixture(query, self.nodes[0], self.store.floor[0])

    def bucket_scores(self, psi: Tensor) -> BucketScores:
        """An empty table of psi's in-bucket log weights, filled as buckets are asked for (``BucketScores``)."""
        return self.scorer.empty(psi)

    def sample_mixture(
        self, psi: Tensor, num_samples: int, scores: BucketScores | None = None, fixed: FixedStep | None = None
    ) -> tuple[Tensor, Tensor]:
        """``num_samples`` ids (m,) drawn with psi's walk (see ``mixture``) and their exact log q-bar (m,)."""
        if self.fixed_backend:
            return self.fixed.sample_mixture(psi, num_samples, fixed)
        uniform = torch.rand(self.depth, num_samples, device=psi.device)
        bucket, log_path = self.walk.descend(psi.unsqueeze(0), num_samples, uniform)  # (m,) each
        ids, log_in = self.walk.pick(*self.scorer.mixture(psi, bucket, scores))  # (m,) each
        return ids, log_path + log_in

    def log_q_mixture(
        self, psi: Tensor, ids: Tensor, scores: BucketScores | None = None, fixed: FixedStep | None = None
    ) -> Tensor:
        """Exact log q-bar of any ids (any shape) under psi's walk, the same shape."""
        if self.fixed_backend:
            return self.fixed.log_q_mixture(psi, ids, fixed)
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.bucket_size, rounding_mode="floor")  # (K,)
        distinct, inverse = torch.unique(bucket, return_inverse=True)  # each bucket's members scored once
        logw, _ = self.scorer.mixture(psi, distinct, scores)  # (u, L)
        log_in = torch.log_softmax(logw, 1)[inverse, flat - bucket * self.bucket_size]  # (K,)
        return (self.walk.shared_path_log_q(psi, bucket) + log_in).view(ids.shape)

    def log_q_all_mixture(self, psi: Tensor) -> Tensor:
        """Exact log q-bar of every class, (n,): psi's branch probabilities for every node at once times the
        in-bucket probabilities. For diagnostics and tests."""
        log_node = self.walk.log_reach(psi.unsqueeze(0))[0]  # (B,)
        logw, _ = self.scorer.mixture(psi, torch.arange(self.num_buckets, device=psi.device))  # (B, L)
        return (log_node.unsqueeze(1) + torch.log_softmax(logw, 1)).flatten()[: self.num_classes]
