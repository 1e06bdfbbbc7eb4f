"""Divide-and-conquer sampling from a kernel proposal q_i ∝ K(h, w_i), per example or batch-shared."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmtrain.common.runtime import StepForms
from lmtrain.sampler.kernel.backend import TreeBackend
from lmtrain.sampler.kernel.buckets import BucketScorer
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.fixed_backend import FixedBackend
from lmtrain.sampler.kernel.store import TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk
from lmtrain.sampler.kernel.walk_backend import WalkBackend
from lmtrain.sampler.options import KernelOptions

BACKENDS: dict[str, type[TreeBackend]] = {backend.name: backend for backend in (WalkBackend, FixedBackend)}


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
    ``phi`` (``features(query)``) when the caller has them already, and every method a step's ``step`` (``step``,
    ``mixture_step``): a step's proposal (``lmtrain.sampler.kernel.proposal``) computes each once for its draws and
    its targets.

    Draws, log q and the update after a step are the ``backend``'s (``TreeBackend``): the walk (``WalkBackend``, a
    CPU's: cache-sized blocks, distinct rows once) or the fixed one (``FixedBackend``, a GPU's: fixed operators, no
    host sync). It is chosen once, here: ``backend`` (``sampler.backend``) ``walk`` or ``fixed`` forces one, ``auto``
    takes the fixed one in a GPU's step ``forms`` (``StepForms``, decided when the model is built), else the walk.
    """

    def __init__(
        self,
        features: FeatureMap,
        dense_factor: float = 64,
        chunk_elements: int = 1 << 22,
        forms: StepForms | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = opts = KernelOptions(**options)  # leaf_size, eps, refresh, ...: the keys left out: defaults
        self.features = features  # registered here only: its state-dict keys stay `...tree.features.*`
        self.store = TreeStore(features, opts, chunk_elements)  # the node sums (no persistent state)
        self.walk = TreeWalk(self.store, dense_factor)  # not a module (nor the scorer, the backend): no tensors
        self.scorer = BucketScorer(features, self.store, self.walk)
        fixed_shapes = forms is not None and forms.fixed_shapes
        self.use_backend(str(opts.backend) if opts.backend != "auto" else "fixed" if fixed_shapes else "walk")

    def use_backend(self, name: str) -> None:
        """Draw, score and update with the backend ``name`` (``walk`` or ``fixed``); the store's blocks follow it.
        Chosen once when the tree is built; a test or benchmark switches one tree to compare both on it."""
        if getattr(self, "backend", None) is None or self.backend.name != name:
            self.backend = BACKENDS[name](self.store, self.walk, self.scorer, self.options)
            self.store.block_limit = self.backend.block_limit

    def step(self, query: Tensor) -> Any:
        """What the per-position draws and log q of the queries (N, d) share in one step (``TreeBackend.step``)."""
        self._check(query)
        return self.backend.step(query)

    def mixture_step(self, psi: Tensor) -> Any:
        """What the batch-shared draws and log q-bar of psi (F,) share in one step (``TreeBackend.mixture_step``)."""
        return self.backend.mixture_step(psi)

    # --- the store: building and the shape of the tree --------------------------------------------
    def rebuild(self, weight: Tensor) -> None:
        """Recompute every node from ``weight`` (n, d)."""
        self.store.rebuild(weight)

    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the buckets holding the changed ``rows`` up to the current ``weight`` (``TreeBackend.update``)."""
        self.backend.update(weight, rows)

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

    def _check(self, query: Tensor) -> None:
        if self.weight is None:
            raise RuntimeError("KernelTree is empty: call update(weight) (or rebuild) before sampling")
        if query.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"query has {query.shape[-1]} features, class vectors {self.weight.shape[1]}")

    # --- per example ----------------------------------------------------------------------------
    def sample(
        self, query: Tensor, num_samples: int, phi: Tensor | None = None, step: Any = None
    ) -> tuple[Tensor, Tensor]:
        """query (N, d) -> ids (N, m) drawn per example, and their exact log q (N, m)."""
        self._check(query)
        return self.backend.sample(query, phi, num_samples, step)

    def sample_dense(self, query: Tensor, num_samples: int, phi: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The draws of ``sample`` from the same q, made by computing every class's log q first (``log_q_all``) and
        drawing m ids per row from it: one (N, F) x (F, nodes) product per level and one (N, d) x (d, n) product,
        whatever m. Cheaper than m walks per example when n is small (``dense_draw_pays``)."""
        log_q = self.log_q_all(query, phi)  # (N, n)
        ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
        return ids, log_q.gather(1, ids)

    def dense_draw_pays(self, n_query: int, num_samples: int) -> bool:
        """Whether ``sample_dense`` costs less than ``sample`` for N queries and m draws each (the backend's rule:
        ``WalkBackend.dense_draw_pays``; never for the fixed backend, the same operators whatever n)."""
        return self.backend.dense_draw_pays(n_query, num_samples)

    def log_q(self, query: Tensor, ids: Tensor, phi: Tensor | None = None, step: Any = None) -> Tensor:
        """Exact log q of any ids (N, k) under the walk that ``sample`` performs, (N, k)."""
        self._check(query)
        return self.backend.log_q(query, phi, ids, step)

    def log_q_many(self, query: Tensor, ids: Tensor, phi: Tensor | None = None, step: Any = None) -> Tensor:
        """``log_q`` of ids (N, k) drawn elsewhere (a kernel proposal's unigram share), by whichever way costs the
        backend less (``WalkBackend.log_q_many``)."""
        return self.backend.log_q_many(query, phi, ids, step)

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

    def sample_mixture(self, psi: Tensor, num_samples: int, step: Any = None) -> tuple[Tensor, Tensor]:
        """``num_samples`` ids (m,) drawn with psi's walk (see ``mixture``) and their exact log q-bar (m,)."""
        return self.backend.sample_mixture(psi, num_samples, step)

    def log_q_mixture(self, psi: Tensor, ids: Tensor, step: Any = None) -> Tensor:
        """Exact log q-bar of any ids (any shape) under psi's walk, the same shape."""
        return self.backend.log_q_mixture(psi, ids, step)

    def log_q_all_mixture(self, psi: Tensor) -> Tensor:
        """Exact log q-bar of every class, (n,): psi's branch probabilities for every node at once times the
        in-bucket probabilities. For diagnostics and tests."""
        log_node = self.walk.log_reach(psi.unsqueeze(0))[0]  # (B,)
        logw, _ = self.scorer.mixture(psi, torch.arange(self.num_buckets, device=psi.device))  # (B, L)
        return (log_node.unsqueeze(1) + torch.log_softmax(logw, 1)).flatten()[: self.num_classes]
