"""A kernel tree's draws and log q with fixed shapes: the GPU path of ``KernelTree`` (``execution=gpu``)."""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.sampler.kernel.buckets import BucketScorer
from lmtrain.sampler.kernel.fixed_walk import FixedWalk
from lmtrain.sampler.kernel.store import TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk


class FixedDraws:
    """``KernelTree``'s per-example and batch-shared draws and log q in a fixed number of operators: the descent
    of ``FixedWalk`` (top levels scored whole, the last levels walked), in-bucket scores for every walker's bucket
    (no deduplication, no per-step table), and path probabilities from the same top reach. ``top`` is a step's
    ``FixedWalk.top_reach`` of its queries, computed once for its draws and its targets (None: computed here)."""

    def __init__(self, store: TreeStore, scorer: BucketScorer) -> None:
        self.store, self.scorer = store, scorer
        self.walk = FixedWalk(store)

    def top_reach(self, phi: Tensor) -> Tensor:
        return self.walk.top_reach(phi)

    # --- per example ----------------------------------------------------------------------------
    def sample(self, query: Tensor, phi: Tensor, num_samples: int, top: Tensor | None) -> tuple[Tensor, Tensor]:
        """query (N, d), its features phi (N, F) -> ids (N, m) drawn per example and their exact log q (N, m)."""
        top = self.walk.top_reach(phi) if top is None else top
        bucket, log_path = self.walk.descend(phi, num_samples, top)  # (W,) each
        ids, log_in = TreeWalk.pick(*self.scorer.kernel(query, bucket, num_samples))  # (W,) each
        return ids.view(-1, num_samples), (log_path + log_in).view(-1, num_samples)

    def log_q(self, query: Tensor, phi: Tensor, ids: Tensor, top: Tensor | None) -> Tensor:
        """Exact log q (N, k) of any ids (N, k)."""
        n_query, k = ids.shape
        bucket = torch.div(ids, self.store.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel(query, bucket.reshape(-1), k)  # (W, L)
        pick = (ids - bucket * self.store.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        top = self.walk.top_reach(phi) if top is None else top
        return self.walk.path_log_q(phi, bucket, top) + log_in

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def sample_mixture(self, psi: Tensor, num_samples: int, top: Tensor | None) -> tuple[Tensor, Tensor]:
        """m ids (m,) drawn with psi's walk and their exact log q-bar (m,)."""
        phi = psi.unsqueeze(0)  # (1, F)
        top = self.walk.top_reach(phi) if top is None else top
        bucket, log_path = self.walk.descend(phi, num_samples, top)  # (m,) each
        ids, log_in = TreeWalk.pick(*self.scorer.mixture_direct(psi, bucket))  # (m,) each
        return ids, log_path + log_in

    def log_q_mixture(self, psi: Tensor, ids: Tensor, top: Tensor | None) -> Tensor:
        """Exact log q-bar of any ids (any shape), the same shape: every id's bucket scored where it stands."""
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.store.bucket_size, rounding_mode="floor")  # (K,)
        logw, _ = self.scorer.mixture_direct(psi, bucket)  # (K, L)
        pick = (flat - bucket * self.store.bucket_size).unsqueeze(1)  # (K, 1)
        log_in = logw.gather(1, pick).squeeze(1) - torch.logsumexp(logw, 1)  # (K,)
        phi = psi.unsqueeze(0)
        top = self.walk.top_reach(phi) if top is None else top
        return (self.walk.path_log_q(phi, bucket, top) + log_in).view(ids.shape)
