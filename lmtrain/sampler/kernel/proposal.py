"""A kernel sampler's proposal for one step: per position, or the mixture of the batch's proposals."""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.sampler.kernel.gpu_draws import FixedStep
from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.proposal import Draws, Proposal


class KernelProposal(Proposal):
    """q_i ∝ K(h_i, .) for each of this step's queries (N, d'), mixed with the training unigram when the sampler
    has a share of it; the queries' features phi(h_i) are computed once, for the draws and the targets' log q."""

    per_position = True

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None, targets: Tensor | None) -> None:
        self.tree, self.query, self.unigram, self.targets = tree, query, unigram, targets
        self.positions = query.shape[0]
        self._phi: Tensor | None = None
        self._fixed: FixedStep | None = None

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def phi(self) -> Tensor:
        """The queries' features (N, F), computed at the first use."""
        if self._phi is None:
            self._phi = self.tree.features(self.query) if self.fixed is None else self.fixed.phi
        return self._phi

    @property
    def fixed(self) -> FixedStep | None:
        """With the fixed backend, what the step's draws and log q share (``KernelTree.fixed_step``), computed at the
        first use; None with the walk."""
        if self._fixed is None:
            self._fixed = self.tree.fixed_step(self.query)
        return self._fixed

    def draw(self, num_samples: int) -> Draws:
        tree, query, mix, targets = self.tree, self.query, self.unigram, self.targets
        num_kernel, num_unigram = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if tree.dense_draw_pays(query.shape[0], num_samples):  # small n: every class's q, then draw (same q)
            log_q = self.log_q_all(tree.num_classes)  # (N, n)
            ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
            target_log_q = None if targets is None else log_q.gather(1, targets.view(-1, 1))
            return Draws(ids, log_q.gather(1, ids), target_log_q)
        if self.fixed is not None and targets is not None:  # fixed backend: the targets walk down with the draws
            return self._draw_with_targets(num_kernel, num_unigram, targets.view(-1, 1))
        ids, log_q = tree.sample(query, num_kernel, self.phi, self.fixed)  # (N, m_k) each
        if num_unigram:
            extra = mix.draw(query.shape[0], num_unigram)  # (N, m_u)
            ids = torch.cat([ids, extra], 1)  # (N, m)
            log_q = mix.mix(torch.cat([log_q, tree.log_q_many(query, extra, self.phi, self.fixed)], 1), ids)
        return Draws(ids, log_q, None if targets is None else self.log_q(targets.view(-1, 1)))

    def _draw_with_targets(self, num_kernel: int, num_unigram: int, targets: Tensor) -> Draws:
        """The fixed backend's draws with the targets' log q: the unigram's ids (N, m_u) and the targets (N, 1) are
        walked down by the kernel draws' walk (``FixedDraws.sample``), one scoring for all."""
        mix = self.unigram
        asked = targets if not num_unigram else torch.cat([mix.draw(self.positions, num_unigram), targets], 1)
        ids, log_q = self.tree.fixed.sample(self.query, self.phi, num_kernel, self.fixed, asked)  # (N, m + 1) each
        log_q = log_q if mix is None else mix.mix(log_q, ids)
        num_samples = num_kernel + num_unigram
        return Draws(ids[:, :num_samples], log_q[:, :num_samples], log_q[:, num_samples:])

    def log_q(self, ids: Tensor) -> Tensor:
        log_q = self.tree.log_q(self.query, ids, self.phi, self.fixed)  # (N, k)
        return log_q if self.unigram is None else self.unigram.mix(log_q, ids)

    def log_q_all(self, num_classes: int) -> Tensor:
        log_q = self.tree.log_q_all(self.query, self.phi)  # (N, n)
        return log_q if self.unigram is None else self.unigram.mix(log_q)


class MixtureProposal(Proposal):
    """The mixture q-bar = (1/N) sum_i q_i of the batch's kernel proposals, drawn by one walk of the feature-space
    query psi (``KernelTree.mixture``), with its in-bucket scores kept for the step (``KernelTree.bucket_scores``)."""

    shared = True

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None, targets: Tensor | None) -> None:
        self.tree, self.unigram, self.targets = tree, unigram, targets
        self.positions = query.shape[0]
        self.psi = tree.mixture(query)  # (F,)
        self.fixed = tree.fixed_step(phi=self.psi.unsqueeze(0))  # with the fixed backend, else None
        self.scores = tree.bucket_scores(self.psi) if self.fixed is None else None  # the walk's table

    @property
    def device(self) -> torch.device:
        return self.psi.device

    def draw(self, num_samples: int) -> Draws:
        tree, psi, mix, targets = self.tree, self.psi, self.unigram, self.targets
        num_kernel, num_unigram = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if self.fixed is not None and targets is not None:  # fixed backend: the targets walk down with the draws
            return self._draw_with_targets(num_kernel, num_unigram, targets.reshape(-1))
        ids, log_q = tree.sample_mixture(psi, num_kernel, self.scores, self.fixed)  # (m_k,) each
        if num_unigram:  # a unigram share, and m large enough for one unigram draw
            extra = mix.draw(num_unigram)  # (m_u,)
            ids = torch.cat([ids, extra])  # (m,)
            log_q = mix.mix(torch.cat([log_q, tree.log_q_mixture(psi, extra, self.scores, self.fixed)]), ids)
        return Draws(ids, log_q, None if targets is None else self.log_q(targets.view(-1, 1)))

    def _draw_with_targets(self, num_kernel: int, num_unigram: int, targets: Tensor) -> Draws:
        """The fixed backend's draws with the targets' log q-bar: the unigram's ids (m_u,) and the targets (N,) are
        walked down by psi's walk (``FixedDraws.sample_mixture``), one scoring for all."""
        mix = self.unigram
        asked = targets if not num_unigram else torch.cat([mix.draw(num_unigram), targets])  # (m_u + N,)
        ids, log_q = self.tree.fixed.sample_mixture(self.psi, num_kernel, self.fixed, asked)  # (m + N,) each
        log_q = log_q if mix is None else mix.mix(log_q, ids)
        num_samples = num_kernel + num_unigram
        return Draws(ids[:num_samples], log_q[:num_samples], log_q[num_samples:].unsqueeze(1))

    def log_q(self, ids: Tensor) -> Tensor:
        log_q = self.tree.log_q_mixture(self.psi, ids, self.scores, self.fixed)  # ids' shape
        return log_q if self.unigram is None else self.unigram.mix(log_q, ids)

    def log_q_all(self, num_classes: int) -> Tensor:
        log_q = self.tree.log_q_all_mixture(self.psi)  # (n,)
        return (log_q if self.unigram is None else self.unigram.mix(log_q)).expand(self.positions, -1)
