"""A kernel tree's draws and log q with fixed shapes: the GPU path of ``KernelTree`` (``execution=gpu``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.sampler.kernel.buckets import BucketScorer
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.fixed_walk import FixedWalk
from lmtrain.sampler.kernel.store import TreeStore


class FixedStep(NamedTuple):
    """What a step's draws and log q share, computed once per step: the queries' features phi (N, F), their reach
    of the top levels (``FixedWalk.top_reach``, (N, 2^t)) and, per example, the queries as the kernel reads them
    (``prepare``)."""

    phi: Tensor
    top: Tensor
    prepared: Tensor | None = None


class FixedDraws:
    """``KernelTree``'s per-example and batch-shared draws and log q in a fixed number of operators: the descent
    of ``FixedWalk`` (top levels scored whole, the last levels walked), in-bucket scores for every walker's bucket
    (no deduplication, no per-step table), and path probabilities from the same top reach. ``top`` is a step's
    ``FixedStep`` (None: computed here)."""

    def __init__(self, store: TreeStore, scorer: BucketScorer) -> None:
        self.store, self.scorer = store, scorer
        self.walk = FixedWalk(store, scorer.walk)

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
    def pick(log_weights: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``TreeWalk.pick`` in fewer operators: Gumbel-max with -log E, E ~ Exp(1), as the Gumbel noise."""
        noise = torch.empty_like(log_weights).exponential_()  # (W, L)
        pick = (log_weights - noise.log()).argmax(1, keepdim=True)  # (W, 1)
        log_in = log_weights.gather(1, pick).squeeze(1) - torch.logsumexp(log_weights, 1)
        return ids.gather(1, pick).squeeze(1), log_in

    # --- per example ----------------------------------------------------------------------------
    def sample(self, query: Tensor, phi: Tensor, num_samples: int, step: FixedStep | None) -> tuple[Tensor, Tensor]:
        """query (N, d), its features phi (N, F) -> ids (N, m) drawn per example and their exact log q (N, m)."""
        step = self.step(phi) if step is None else step
        bucket, log_path = self.walk.descend(phi, num_samples, step.top)  # (W,) each
        ids, log_in = self.pick(*self.scorer.kernel(query, bucket, num_samples, step.prepared))  # (W,) each
        return ids.view(-1, num_samples), (log_path + log_in).view(-1, num_samples)

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
    def sample_mixture(self, psi: Tensor, num_samples: int, step: FixedStep | None) -> tuple[Tensor, Tensor]:
        """m ids (m,) drawn with psi's walk and their exact log q-bar (m,)."""
        phi = psi.unsqueeze(0)  # (1, F)
        step = self.step(phi) if step is None else step
        bucket, log_path = self.walk.descend(phi, num_samples, step.top)  # (m,) each
        ids, log_in = self.pick(*self.scorer.mixture_direct(psi, bucket))  # (m,) each
        return ids, log_path + log_in

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
