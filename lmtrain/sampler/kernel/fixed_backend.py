"""A kernel tree's GPU backend: draws, log q and the update after a step in a fixed number of operators, with no
host sync (``sampler.backend=fixed``; a GPU's step forms take it)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmtrain.sampler.kernel.backend import TreeBackend, mixed
from lmtrain.sampler.kernel.buckets import BucketScorer
from lmtrain.sampler.kernel.fixed_update import FixedUpdate
from lmtrain.sampler.kernel.fixed_walk import FixedWalk, Reach
from lmtrain.sampler.kernel.store import GPU_BLOCK_ELEMENTS, TreeStore
from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.kernel.walk import TreeWalk
from lmtrain.sampler.options import KernelOptions
from lmtrain.sampler.proposal import Draws


class FixedStep(NamedTuple):
    """What a step's draws and log q share, computed once per step: the queries' features phi (N, F), their reach
    of the top levels (``FixedWalk.top_reach``, a ``Reach``) and, per example, the queries as the kernel reads them
    (``prepare``)."""

    phi: Tensor
    top: Reach
    prepared: Tensor | None = None


class FixedBackend(TreeBackend):
    """``KernelTree``'s per-example and batch-shared draws and log q in a fixed number of operators: the descent
    of ``FixedWalk`` (``walk``: top levels scored whole, the last ones drawn in stages), in-bucket scores for every
    walker's bucket (no deduplication, no per-step table), and path probabilities from the same top reach; a step's
    targets walk down with its draws. The update after a step is ``FixedUpdate``'s (``tree_update``). A method's
    ``step`` is a step's ``FixedStep`` (None: computed there). ``options.scored_levels``: ``FixedWalk``'s ``scored``;
    ``options.tree_update``: ``FixedUpdate``'s mode. Its blocks only bound memory (``GPU_BLOCK_ELEMENTS``)."""

    name = "fixed"
    block_limit = GPU_BLOCK_ELEMENTS

    def __init__(self, store: TreeStore, walk: TreeWalk, scorer: BucketScorer, options: KernelOptions) -> None:
        self.store, self.scorer, self.features = store, scorer, scorer.features
        self.walk = FixedWalk(store, scored=options.scored_levels)
        self.tree_update = FixedUpdate(store, str(options.tree_update))

    def _step(self, phi: Tensor, prepared: Tensor | None = None) -> FixedStep:
        """The ``FixedStep`` of queries phi (N, F) (and their ``prepared`` form, per example)."""
        return FixedStep(phi, self.walk.top_reach(phi), prepared)

    def step(self, query: Tensor) -> FixedStep:
        """The ``FixedStep`` of queries (N, d), prepared once: their features come from the prepared form."""
        prepared = self.features.prepare(query)
        return self._step(self.features.of_prepared(prepared), prepared)

    def mixture_step(self, psi: Tensor) -> FixedStep:
        """The ``FixedStep`` of a mixture's psi (F,), as features (1, F)."""
        return self._step(psi.unsqueeze(0))

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
        self,
        query: Tensor,
        phi: Tensor | None,
        num_samples: int,
        step: FixedStep | None = None,
        known: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """query (N, d), its features phi (N, F) -> ids (N, m + j): m drawn per example, then the ``known`` ids
        (N, j) (none without), and their exact log q (N, m + j): the known ids' walkers go down the same walk as
        the draws' (``FixedWalk.descend``), and one scoring serves every walker's bucket."""
        n_query = query.shape[0]
        phi = self.features(query) if phi is None else phi
        step = self._step(phi) if step is None else step
        size = self.store.bucket_size
        forced = None if known is None else torch.div(known, size, rounding_mode="floor")  # (N, j)
        bucket, log_path = self.walk.descend(phi, num_samples, step.top, forced)  # (W,) each, W = N (m + j)
        per_query = bucket.numel() // n_query
        logk, members = self.scorer.kernel_direct(query, bucket, per_query, step.prepared)  # (W, L) each
        slots = None if known is None else torch.remainder(known, size)  # (N, j)
        ids, log_in = self.pick(logk.view(n_query, per_query, -1), members.view(n_query, per_query, -1), slots)
        return ids, log_path.view(n_query, per_query) + log_in  # (N, m + j) each

    def log_q(self, query: Tensor, phi: Tensor | None, ids: Tensor, step: FixedStep | None = None) -> Tensor:
        """Exact log q (N, k) of any ids (N, k)."""
        n_query, k = ids.shape
        phi = self.features(query) if phi is None else phi
        step = self._step(phi) if step is None else step
        bucket = torch.div(ids, self.store.bucket_size, rounding_mode="floor")  # (N, k)
        logk, _ = self.scorer.kernel_direct(query, bucket.reshape(-1), k, step.prepared)  # (W, L)
        pick = (ids - bucket * self.store.bucket_size).view(-1, 1)  # (W, 1)
        log_in = (logk.gather(1, pick).squeeze(1) - torch.logsumexp(logk, 1)).view(n_query, k)
        return self.walk.path_log_q(phi, bucket, step.top) + log_in

    # --- batch-shared: the mixture of the batch's proposals -------------------------------------
    def sample_mixture(
        self, psi: Tensor, num_samples: int, step: FixedStep | None = None, known: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """ids (m + K,): m drawn with psi's walk, then the ``known`` ids (K,) (none without), and their exact log
        q-bar (m + K,): the known ids walk down the same walk."""
        phi = psi.unsqueeze(0)  # (1, F)
        step = self._step(phi) if step is None else step
        size = self.store.bucket_size
        forced = None if known is None else torch.div(known, size, rounding_mode="floor").unsqueeze(0)  # (1, K)
        bucket, log_path = self.walk.descend(phi, num_samples, step.top, forced)  # (m + K,) each
        logw, members = self.scorer.mixture_direct(psi, bucket)  # (m + K, L) each
        slots = None if known is None else torch.remainder(known, size).unsqueeze(0)  # (1, K)
        ids, log_in = self.pick(logw.unsqueeze(0), members.unsqueeze(0), slots)  # (1, m + K) each
        return ids[0], log_path + log_in[0]

    def log_q_mixture(self, psi: Tensor, ids: Tensor, step: FixedStep | None = None) -> Tensor:
        """Exact log q-bar of any ids (any shape), the same shape: every id's bucket scored where it stands."""
        flat = ids.reshape(-1)
        bucket = torch.div(flat, self.store.bucket_size, rounding_mode="floor")  # (K,)
        logw, _ = self.scorer.mixture_direct(psi, bucket)  # (K, L)
        pick = (flat - bucket * self.store.bucket_size).unsqueeze(1)  # (K, 1)
        log_in = logw.gather(1, pick).squeeze(1) - torch.logsumexp(logw, 1)  # (K,)
        phi = psi.unsqueeze(0)
        step = self._step(phi) if step is None else step
        return (self.walk.path_log_q(phi, bucket, step.top) + log_in).view(ids.shape)

    # --- a step's draws with its targets, and the update after it -----------------------------
    def draw(
        self,
        query: Tensor,
        phi: Tensor,
        step: FixedStep,
        counts: tuple[int, int],
        unigram: UnigramShare | None,
        targets: Tensor | None,
    ) -> Draws:
        """``TreeBackend.draw`` where the unigram share's ids (N, m_u), drawn first, and the targets (N, 1) walk down
        with the kernel's draws (``sample``'s known ids): one scoring for all."""
        if targets is None:
            return super().draw(query, phi, step, counts, unigram, targets)
        num_kernel, num_unigram = counts
        targets = targets.view(-1, 1)  # (N, 1)
        asked = targets if not num_unigram else torch.cat([unigram.draw(query.shape[0], num_unigram), targets], 1)
        ids, log_q = self.sample(query, phi, num_kernel, step, asked)  # (N, m + 1) each
        log_q = mixed(unigram, log_q, ids)
        num_samples = num_kernel + num_unigram
        return Draws(ids[:, :num_samples], log_q[:, :num_samples], log_q[:, num_samples:])

    def draw_mixture(
        self,
        psi: Tensor,
        step: FixedStep,
        counts: tuple[int, int],
        unigram: UnigramShare | None,
        targets: Tensor | None,
    ) -> Draws:
        """``TreeBackend.draw_mixture`` where the unigram share's ids (m_u,) and the targets (N,) walk down psi's
        walk with its draws (``sample_mixture``'s known ids): one scoring for all."""
        if targets is None:
            return super().draw_mixture(psi, step, counts, unigram, targets)
        num_kernel, num_unigram = counts
        targets = targets.reshape(-1)  # (N,)
        asked = targets if not num_unigram else torch.cat([unigram.draw(num_unigram), targets])  # (m_u + N,)
        ids, log_q = self.sample_mixture(psi, num_kernel, step, asked)  # (m + N,) each
        log_q = mixed(unigram, log_q, ids)
        num_samples = num_kernel + num_unigram
        return Draws(ids[:num_samples], log_q[:num_samples], log_q[num_samples:].unsqueeze(1))

    def update(self, weight: Tensor, rows: Tensor) -> None:
        self.tree_update.update(weight, rows)
