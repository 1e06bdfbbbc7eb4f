"""Kernel proposals q_i ∝ K(h, w_i), sampled from a tree kept current after every step (docs/strategies.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.common.runtime import StepForms
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.kernel.features import FeatureMap, RandomFourierFeatures
from lmtrain.sampler.kernel.proposal import KernelProposal, MixtureProposal
from lmtrain.sampler.kernel.quadratic_features import QuadraticFeatures
from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.options import KernelOptions, QuadraticOptions, RFFOptions

log = logging.getLogger("lmtrain")


class KernelSampler(Sampler):
    """Kernel proposal q_i ∝ K(query, w_i) for a feature map K = <phi, phi>, drawn from a ``KernelTree``.

    ``hidden`` is the output layer's query vector (e.g. [h, 1]) and ``update(weight, rows)`` receives the
    class vectors whose dot product with it is the logit. ``propose(query, inputs, targets)`` is a step's proposal, in
    one of two modes, which the output strategy sets (``share_negatives``):
    - per position (the default, ``shared`` False): m ids per position, ids and log q of shape (N, m)
      (``KernelProposal``);
    - batch-shared (``shared`` True): m ids for the whole batch, drawn from the mixture q-bar = (1/N) sum_i
      q_i of the batch's proposals by one tree walk (``MixtureProposal``); its ``log_q`` is log q-bar of any ids
      (any shape), the same distribution for every position of that batch.
    The tree's backend (the walk, a CPU's; the fixed one, a GPU's) is chosen once, when the tree is built:
    ``KernelOptions.backend`` forces one, else (``auto``) the run's step ``forms`` (``StepForms``) decide.

    The tree is derived state: built from the first weights it sees, refreshed for the changed rows after
    each optimizer step, rebuilt from the weights when ``rows`` is None (a dense optimizer) and by ``rebuild`` (a
    checkpoint load, and every checkpoint write on the run's schedule: the refreshed sums differ from rebuilt ones
    by float rounding, so both sides of a resume rebuild); only the feature map's own buffers (RFF frequencies) go
    into the state dict. A checkpoint written off the schedule (a stop, a timed one) must not rebuild, or the run
    would part from one never stopped: it carries the tree as kept (``kept_state``), and a resume from it puts that
    back (``restore_kept_state``).

    ``unigram_share`` s > 0 mixes the kernel proposal with the training unigram (``UnigramShare``): round(s m) of
    each position's m draws come from the unigram and every id is corrected with the mixture's exact log q.
    """

    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "counts", "forms")
    Options: ClassVar[type[KernelOptions]]  # each kernel's options: the tree's keys and its feature map's

    def __init__(
        self,
        num_classes: int | None = None,
        counts: Tensor | None = None,
        forms: StepForms | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = opts = self.Options(**options)  # the keys left out take their defaults
        features = self.feature_map(opts)
        tree_options = {f.name: getattr(opts, f.name) for f in dataclasses.fields(KernelOptions)}
        self.tree = KernelTree(features, forms=forms, **tree_options)
        share = opts.unigram_share
        self.unigram = UnigramShare(share, num_classes, counts) if share else None
        self.shared = False  # the mode; the output strategy sets it (share_negatives)
        self._drawn_since_refresh = False
        self._told_dense = False

    @staticmethod
    def feature_map(options: KernelOptions) -> FeatureMap:
        """The kernel's feature map phi, K(h, w) = <phi(h), phi(w)>, from its options."""
        raise NotImplementedError

    @property
    def features(self) -> FeatureMap:
        return self.tree.features

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> KernelProposal | MixtureProposal:
        """This step's proposal for the queries (N, d'): the mixture of their proposals when the negatives are shared
        by the batch, else one per position."""
        if query is None:
            raise ValueError("a kernel proposal depends on the queries: pass them (N, d')")
        self._drawn_since_refresh = True
        proposal = MixtureProposal if self.shared else KernelProposal
        return proposal(self.tree, query, self.unigram, targets)

    def place(self, weight: Tensor) -> None:
        """The sampler's own buffers (RFF's frequencies) go where the weights are, also for a sampler used outside
        a model that was moved. The tree's backend stays the one chosen when it was built."""
        self.to(weight.device)

    def follow(self, weight: Tensor) -> None:
        self.place(weight)

    def rebuild(self, weight: Tensor) -> None:
        """Build the tree afresh from ``weight``: after a checkpoint load, and when a checkpoint is written."""
        self._drawn_since_refresh = False
        self.place(weight)
        self.tree.rebuild(weight)

    def kept_state(self) -> dict[str, Tensor]:
        """What a rebuild from the weights would not give back bit for bit: the node sums (deltas round), each
        bucket's count of deltas and the GPU paths' count of updates (when a bucket or every leaf is recomputed
        next), and the cached features that differ from a fresh computation (``FeatureCache.kept_rows``)."""
        store = self.tree.store
        if store.weight is None:
            return {}
        kept = {"nodes": store.nodes.clone(), "deltas": store.deltas.clone()}
        kept["updates"] = torch.tensor(store.updates)
        return kept | store.cache.kept_rows(store.features, store.weight, store.chunk_elements)

    def restore_kept_state(self, kept: dict[str, Tensor]) -> None:
        """Put back what ``kept_state`` returned, over the tree a load rebuilt from the same weights."""
        store = self.tree.store
        if not kept or store.weight is None:
            return
        if kept["nodes"].shape != store.nodes.shape:
            saved, now = tuple(kept["nodes"].shape), tuple(store.nodes.shape)
            raise ValueError(f"the checkpoint's kernel tree has {saved} node sums, this one {now}: its options differ")
        store.nodes.copy_(kept["nodes"])
        store.deltas.copy_(kept["deltas"])
        store.updates = int(kept["updates"])
        store.cache.put_rows(store.features, store.weight, kept)

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        built = self.tree.weight is not None and self.tree.weight.shape == weight.shape
        # draws since the last update or rebuild: a rebuild right after them is a dense step's, not a checkpoint load's
        drawn, self._drawn_since_refresh = self._drawn_since_refresh, False
        if built and rows is not None:
            self.tree.update(weight, rows)
            return
        self.place(weight)
        start = time.perf_counter()
        self.tree.rebuild(weight)
        seconds = time.perf_counter() - start
        if built and drawn and not self._told_dense:
            self._told_dense = True
            log.info(
                "kernel sampler: the optimizer changes every class row (dense gradients), so the tree "
                "over %d classes is rebuilt after every step; one rebuild took %.1f ms "
                "(a sparse optimizer path updates only the changed buckets)",
                self.tree.num_classes,
                1000 * seconds,
            )


class QuadraticSampler(KernelSampler):
    """Quadratic-kernel proposal K = alpha (h . w)^2 + 1 (Blanc & Rendle 2018).

    With ``leaf_size=None`` buckets hold about d / 2 classes (F / d with F = d (d + 1) / 2 + 1), and
    the tree stores about 2 * 2^ceil(log2(2 n / d)) * F floats: ~2.7 GB at n = 10^6, d = 201.
    """

    name, Options = "quadratic", QuadraticOptions  # sampler=quadratic

    @staticmethod
    def feature_map(options: QuadraticOptions) -> FeatureMap:
        return QuadraticFeatures(alpha=options.alpha)


class RFFSampler(KernelSampler):
    """Random-Fourier-feature proposal K ≈ exp(nu cos(h, w)) (Rawat et al. 2019).

    ``D`` random frequencies give 2 D features; ``temperature`` T, if given, sets nu = 1 / T^2.
    With ``leaf_size=None`` buckets hold about 2 D / d classes, and the tree stores about
    2 * 2^ceil(log2(n d / 2 D)) * 2 D floats: ~2.1 GB at n = 10^6, d = 200, D = 1024.
    """

    name, Options = "rff", RFFOptions  # sampler=rff

    @staticmethod
    def feature_map(options: RFFOptions) -> FeatureMap:
        return RandomFourierFeatures(**dataclasses.asdict(options))
