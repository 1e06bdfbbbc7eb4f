"""A kernel tree's draws and log q with fixed shapes: its fixed backend (``sampler.backend``; the default on a GPU)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.sampler.kernel.buckets import BucketScorer
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.fixed_walk import FixedWalk, Reach
from lmtrain.sampler.kernel.store import TreeStore


class FixedStep(NamedTuple):
    """What a step's draws and log q share, computed once per step: the queries' features phi (N, F), their reach
    of the top levels (``FixedWalk.top_reach``, a ``Reach``) and, per example, the queries as the kernel reads them
    (``prepare``)."""

    phi: Tensor
    top: Reach
    prepared: Tensor | None = None


class FixedDraws:
    """``KernelTree``'s per-example and batch-shared draws and log q in a fixed number of operators: the descent
    of ``FixedWalk`` (top levels scored whole, the last ones drawn in stages), in-bucket scores for every walker's
    bucket (no deduplication, no per-step table), and path probabilities from the same top reach. ``top`` is a step's
    ``FixedStep`` (None: computed here). ``scored_levels``: ``FixedWalk``'s ``scored``."""

    def __init__(self, store: TreeStore, scorer: BucketScorer, scored_levels: int) -> None:
        self.store, self.scorer = store, scorer
        self.walk = FixedWalk(store, scored=scored_levels)

    def step(self, phi: Tensor, prepared: Tensor | None = None) -> FixedStep:
        """The ``FixedStep`` of queries phi (N, F) (and their ``prepared`` form, per example)."""
        return FixedStep(phi, self.walk.top_reach(phi), prepared)

    def step_of(self, features: FeatureMap, query: Tensor | None, phi: Tensor | None) -> FixedStep:
        """The ``FixedStep`` of queries (N, d) (prepared once: their features come from the prepared form), or of
        features ``phi`` (1, F) (a mixture's psi)."""
        if query is None:
            return self.step(phi)
        prepared = features.prepare(query)
        return self.step(features.of_prepared(prepared), prepared)

    @staticmethod
    def pick(log_weights: Tensor, ids: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``TreeWalk.pick`` in fewer operators (Gumbel-max with -log E, E ~ Exp(1), as the Gumbel noise) for
        log weights and member ids (G, K, L) of G groups of K walkers: the ids (G, K) and the log in-bucket
        probability (G, K) of every walker's pick, where the last j walkers take the given slots ``known`` (G, j)
        instead of a draw."""
        drawn = log_weights[:, : log_weights.shape[1] - (0 if known is None else known.shape[1])]  # (G, k, L)
        noise = torch.empty_like(drawn).exponential_()  # (G, k, L)
        pick = (drawn - noise.log()).argmax(2, keepdim=True)  # (G, k, 1)
        if known is not None:
            pick = torch.cat([pick, known.unsqueeze(2)], 1)  # (G, K, 1)
        log_in = log_weights.gather(2, pick).squeeze(2) - torch.logsumexp(log_weights, 2)  # (G, K)
        return ids.gather(2, pick).squeeze(2), log_in

    # --- per example ----------------------------------------------------------------------------
    def sample(
        self, query: Tensor, phi: Tensor, num_samples: int, step: FixedStep | None, known: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """query (N, d), its features phi (N, F) -> ids (N, m + j): m drawn per example, then the ``known`` ids
        (N, j) (none without), and their exact log q (N, m + j): the known ids' walkers go down the same walk as
        the draws' (``FixedWalk.descend``), and one scoring serves every walker's bucket."""
        n_query = query.shape[0]
        step = self.step(phi) if step is None else step
        size = self.store.bucket_size
        forced = None if known is None else torch.div(known, size, rounding_mode="floor")  # (N, j)
        bucket, log_path = self.walk.descend(phi, num_samples, step.top, forced)  # (W,) each, W = N (m + j)
        per_query = bucket.numel() // n_query
        logk, members = self.scorer.kernel(query, bucket, per_query, step.prepared)  # (W, L) each
        slots = None if known is None else torch.remainder(known, size)  # (N, j)
        ids, log_in = self.pick(logk.view(n_query, per_query, -1), members.view(n_query, per_query, -1), slots)
        return ids, log_path.view(n_query, per_query) + log_in  # (N, m + j) each

    def log_q(self, query: Tensor, phi: Tensor, ids: Tensor, step: FixedStep | None) -> Tensor:
        """Exact log q (N, k) of any ids (N, k)."""
        n_query, k = ids.shape
        step = self.step(phi) if step is None else step
        bucket = torch.div(ids, self.store.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k, step.prepared)  # (W, L)
        pick = (ids - bucket * self.store.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        return self.walk.path_log_q(phi, bucket, step.top) + log_in

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def sample_mixture(
        self, psi: Tensor, num_samples: int, step: FixedStep | None, known: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """ids (m + K,): m drawn with psi's walk, then the ``known`` ids (K,) (none without), and their exact log
        q-bar (m + K,): the known ids walk down the same walk."""
        phi = psi.unsqueeze(0)  # (1, F)
        step = self.step(phi) if step is None else step
        size = self.store.bucket_size
        forced = None if known is None else torch.div(known, size, rounding_mode="floor").unsqueeze(0)  # (1, K)
        bucket, log_path = self.walk.descend(phi, num_samples, step.top, forced)  # (m + K,) each
        logw, members = self.scorer.mixture_direct(psi, bucket)  # (m + K, L) each
        slots = None if known is None else torch.remainder(known, size).unsqueeze(0)  # (1, K)
        ids, log_in = self.pick(logw.unsqueeze(0), members.unsqueeze(0), slots)  # (1, m + K) each
        return ids[0], log_path + log_in[0]

    def log_q_mixture(self, psi: Tensor, ids: Tensor, step: FixedStep | None) -> Tensor:
        """Exact log q-bar of any ids (any shape), the same shape: every id's bucket scored where it stands."""
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.store.bucket_size, rounding_mode="floor")  # (K,)
        logw, _ = self.scorer.mixture_direct(psi, bucket)  # (K, L)
        pick = (flat - bucket * self.store.bucket_size).unsqueeze(1)  # (K, 1)
        log_in = logw.gather(1, pick).squeeze(1) - torch.logsumexp(logw, 1)  # (K,)
        phi = psi.unsqueeze(0)
        step = self.step(phi) if step is None else step
        return (self.walk.path_log_q(phi, bucket, step.top) + log_in).view(ids.shape)
