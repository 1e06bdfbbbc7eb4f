"""Kernel proposals q_i ∝ K(h, w_i), sampled from a tree kept current after every step (docs/strategies.md)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.kernel.features import FeatureMap, QuadraticFeatures, RandomFourierFeatures
from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.kernel.unigram_share import UnigramShare, kernel_log_q

log = logging.getLogger("lmtrain")


class KernelSampler(Sampler):
    """Kernel proposal q_i ∝ K(query, w_i) for a feature map K = <phi, phi>, drawn from a ``KernelTree``.

    ``hidden`` is the output layer's query vector (e.g. [h, 1]) and ``update(weight, rows)`` receives the
    class vectors whose dot product with it is the logit. Two modes (``share_negatives``):
    - per example (the default, ``per_example`` True): m ids per position, ids and log q of shape (N, m);
    - batch-shared (``shared=True``, ``per_example`` False): m ids for the whole batch, drawn from the mixture
      q-bar = (1/N) sum_i q_i of the batch's proposals by one walk of the query ``mixture_query(hidden)``;
      ``sample`` returns ids and log q-bar of shape (m,), and ``log_q(hidden, ids)`` is log q-bar of any ids
      (any shape), the same distribution for every position of that batch.

    The tree is derived state: built from the first weights it sees, refreshed for the changed rows after
    each optimizer step, rebuilt from the weights when ``rows`` is None (a dense optimizer, or a checkpoint
    load); only the feature map's own buffers (RFF frequencies) go into checkpoints.

    ``unigram_share`` s > 0 mixes the kernel proposal with the training unigram (``UnigramShare``): round(s m) of
    each position's m draws come from the unigram and every id is corrected with the mixture's exact log q.
    """

    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "counts")

    def __init__(
        self,
        features: FeatureMap,
        leaf_size: int | None = None,
        eps: float = 1e-6,
        shared: bool = False,
        refresh: int = 64,
        feature_cache: str | bool | None = "auto",
        unigram_share: float = 0.0,
        num_classes: int | None = None,
        counts: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.tree = KernelTree(features, leaf_size=leaf_size, eps=eps, refresh=refresh, feature_cache=feature_cache)
        self.unigram = UnigramShare(unigram_share, num_classes, counts) if unigram_share else None
        self.shared = bool(shared)
        self._drawn_since_rebuild = False
        self._told_dense = False
        self._mixture: tuple[Tensor, tuple, Tensor] | None = None  # (queries, their key, psi): latest mixture

    @property
    def features(self) -> FeatureMap:
        return self.tree.features

    @property
    def per_example(self) -> bool:  # type: ignore[override]  # follows the mode
        return not self.shared

    def share_negatives(self, shared: bool) -> None:
        self.shared = bool(shared)

    def mixture_query(self, hidden: Tensor) -> Tensor:
        """The feature-space query (F,) whose walk draws from the batch's mixture proposal (``KernelTree.mixture``).
        A step asks for it twice with the same queries (the draw, then log q of the targets): it is kept for the
        same queries (same storage, held here so that no other tensor can take it, and in-place version) and the
        same tree."""
        hidden = self._context(hidden)
        key = (hidden.data_ptr(), hidden.shape, hidden.stride(), hidden.dtype, hidden._version, self.tree.version)
        if self._mixture is None or self._mixture[1] != key:
            self._mixture = (hidden, key, self.tree.mixture(hidden))
        return self._mixture[2]

    def sample(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self._drawn_since_rebuild = True
        mix = self.unigram
        num_kernel, num_unigram = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if self.shared:
            psi = self.mixture_query(hidden)
            ids, log_q = self.tree.sample_mixture(psi, num_kernel)  # (m_k,) each
            if not num_unigram:  # no unigram share, or m too small for one unigram draw
                return ids, log_q
            extra = mix.draw(num_unigram)  # (m_u,)
            ids = torch.cat([ids, extra])  # (m,)
            return ids, mix.mix(torch.cat([log_q, self.tree.log_q_mixture(psi, extra)]), ids)
        query = self._context(hidden)
        if self.tree.dense_draw_pays(query.shape[0], num_samples):  # small n: every class's q, then draw (same q)
            if mix is None:
                return self.tree.sample_dense(query, num_samples)  # (N, m) each
            log_q = mix.mix(self.tree.log_q_all(query))  # (N, n)
            ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
            return ids, log_q.gather(1, ids)
        ids, log_q = self.tree.sample(query, num_kernel)  # (N, m_k) each
        if not num_unigram:
            return ids, log_q
        extra = mix.draw(query.shape[0], num_unigram)  # (N, m_u)
        ids = torch.cat([ids, extra], 1)  # (N, m)
        return ids, mix.mix(torch.cat([log_q, kernel_log_q(self.tree, query, extra)], 1), ids)

    def log_q(self, hidden: Tensor | None, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        if self.shared:
            log_q = self.tree.log_q_mixture(self.mixture_query(hidden), ids)  # ids' shape
        else:
            log_q = self.tree.log_q(self._context(hidden), ids)  # (N, k)
        return log_q if self.unigram is None else self.unigram.mix(log_q, ids)

    def log_q_all(self, hidden: Tensor, num_classes: int, inputs: Tensor | None = None) -> Tensor:
        if self.shared:
            log_q = self.tree.log_q_all_mixture(self.mixture_query(hidden)).expand(hidden.shape[0], -1)
        else:
            log_q = self.tree.log_q_all(hidden)  # (N, n)
        return log_q if self.unigram is None else self.unigram.mix(log_q)

    @staticmethod
    def _context(hidden: Tensor | None) -> Tensor:
        if hidden is None:
            raise ValueError("a kernel proposal depends on the queries: pass them (N, d') as `hidden`")
        return hidden

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        built = self.tree.weight is not None and self.tree.weight.shape == weight.shape
        if built and rows is not None:
            self.tree.update(weight, rows)
            return
        seconds = self.tree.timed_rebuild(weight)
        if built and self._drawn_since_rebuild and not self._told_dense:
            self._told_dense = True
            log.info(
                "kernel sampler: the optimizer changes every class row (dense gradients), so the tree "
                "over %d classes is rebuilt after every step; one rebuild took %.1f ms "
                "(a sparse optimizer path updates only the changed buckets)",
                self.tree.num_classes,
                1000 * seconds,
            )
        self._drawn_since_rebuild = False


class QuadraticSampler(KernelSampler):
    """Quadratic-kernel proposal K = alpha (h . w)^2 + 1 (Blanc & Rendle 2018).

    With ``leaf_size=None`` buckets hold about d / 2 classes (F / d with F = d (d + 1) / 2 + 1), and
    the tree stores about 2 * 2^ceil(log2(2 n / d)) * F floats: ~2.7 GB at n = 10^6, d = 201.
    """

    def __init__(self, alpha: float = 100.0, leaf_size: int | None = None, eps: float = 1e-6, **options: Any) -> None:
        super().__init__(
            QuadraticFeatures(alpha), leaf_size=leaf_size, eps=eps, **options
        )  # refresh, feature_cache, unigram_share


class RFFSampler(KernelSampler):
    """Random-Fourier-feature proposal K ≈ exp(nu cos(h, w)) (Rawat et al. 2019).

    ``D`` random frequencies give 2 D features; ``temperature`` T, if given, sets nu = 1 / T^2.
    With ``leaf_size=None`` buckets hold about 2 D / d classes, and the tree stores about
    2 * 2^ceil(log2(n d / 2 D)) * 2 D floats: ~2.1 GB at n = 10^6, d = 200, D = 1024.
    """

    def __init__(
        self,
        D: int = 1024,
        nu: float = 4.0,
        temperature: float | None = None,
        seed: int = 0,
        leaf_size: int | None = None,
        eps: float = 1e-6,
        projection: str = "float32",
        **options: Any,
    ) -> None:
        features = RandomFourierFeatures(D, nu, seed, temperature, projection=projection)
        super().__init__(features, leaf_size=leaf_size, eps=eps, **options)  # refresh, feature_cache, unigram_share
