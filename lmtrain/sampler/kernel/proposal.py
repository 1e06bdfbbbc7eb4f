"""A kernel sampler's proposal for one step: per position, or the mixture of the batch's proposals."""

from __future__ import annotations

import torch
from torch import Tensor

from lmtrain.sampler.kernel.gpu_draws import FixedStep
from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.proposal import Proposal


class KernelProposal(Proposal):
    """q_i ∝ K(h_i, .) for each of this step's queries (N, d'), mixed with the training unigram when the sampler
    has a share of it; the queries' features phi(h_i) are computed once, for the draws and the targets' log q."""

    per_example = True

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None) -> None:
        self.tree, self.query, self.unigram = tree, query, unigram
        self._phi: Tensor | None = None
        self._fixed: FixedStep | None = None

    @property
    def phi(self) -> Tensor:
        """The queries' features (N, F), computed at the first use."""
        if self._phi is None:
            self._phi = self.tree.features(self.query) if self.fixed is None else self.fixed.phi
        return self._phi

    @property
    def fixed(self) -> FixedStep | None:
        """On the GPU paths, what the step's draws and log q share (``KernelTree.fixed_step``), computed at the
        first use; None on a CPU."""
        if self._fixed is None:
            self._fixed = self.tree.fixed_step(self.query)
        return self._fixed

    def sample(self, num_samples: int) -> tuple[Tensor, Tensor]:
        tree, query, mix = self.tree, self.query, self.unigram
        num_kernel, num_unigram = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if tree.dense_draw_pays(query.shape[0], num_samples):  # small n: every class's q, then draw (same q)
            if mix is None:
                return tree.sample_dense(query, num_samples, self.phi)  # (N, m) each
            log_q = mix.mix(tree.log_q_all(query, self.phi))  # (N, n)
            ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
            return ids, log_q.gather(1, ids)
        if self.fixed is not None and self.expected is not None:  # GPU paths: the targets walk down with the draws
            return self._sample_with_expected(num_kernel, num_unigram, self.expected)
        ids, log_q = tree.sample(query, num_kernel, self.phi, self.fixed)  # (N, m_k) each
        if not num_unigram:
            return ids, log_q
        extra = mix.draw(query.shape[0], num_unigram)  # (N, m_u)
        ids = torch.cat([ids, extra], 1)  # (N, m)
        return ids, mix.mix(torch.cat([log_q, tree.log_q_many(query, extra, self.phi, self.fixed)], 1), ids)

    def _sample_with_expected(self, num_kernel: int, num_unigram: int, expected: Tensor) -> tuple[Tensor, Tensor]:
        """The GPU paths' draws with the expected ids' log q (``remember``): the unigram's ids (N, m_u) and the
        expected ones (N, j) are walked down by the kernel draws' walk (``FixedDraws.sample``), one scoring for all."""
        mix = self.unigram
        asked = expected if not num_unigram else torch.cat([mix.draw(self.query.shape[0], num_unigram), expected], 1)
        ids, log_q = self.tree.fixed.sample(self.query, self.phi, num_kernel, self.fixed, asked)  # (N, m + j) each
        log_q = log_q if mix is None else mix.mix(log_q, ids)
        num_samples = num_kernel + num_unigram
        self.remember(log_q[:, num_samples:])  # (N, j)
        return ids[:, :num_samples], log_q[:, :num_samples]

    def log_q(self, ids: Tensor) -> Tensor:
        known = self.known_log_q(ids)  # computed with the draws
        if known is not None:
            return known
        log_q = self.tree.log_q(self.query, ids, self.phi, self.fixed)  # (N, k)
        return log_q if self.unigram is None else self.unigram.mix(log_q, ids)

    def log_q_all(self) -> Tensor:
        """log q of every class for each position, (N, n)."""
        log_q = self.tree.log_q_all(self.query, self.phi)
        return log_q if self.unigram is None else self.unigram.mix(log_q)


class MixtureProposal(Proposal):
    """The mixture q-bar = (1/N) sum_i q_i of the batch's kernel proposals, drawn by one walk of the feature-space
    query psi (``KernelTree.mixture``), with its in-bucket scores kept for the step (``KernelTree.bucket_scores``)."""

    per_example = False

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None) -> None:
        self.tree, self.unigram = tree, unigram
        self.psi = tree.mixture(query)  # (F,)
        self.fixed = tree.fixed_step(phi=self.psi.unsqueeze(0))  # on the GPU paths, else None
        self.scores = tree.bucket_scores(self.psi) if self.fixed is None else None  # the CPU paths' table

    def sample(self, num_samples: int) -> tuple[Tensor, Tensor]:
        tree, psi, mix = self.tree, self.psi, self.unigram
        num_kernel, num_unigram = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if self.fixed is not None and self.expected is not None:  # GPU paths: the targets walk down with the draws
            return self._sample_with_expected(num_kernel, num_unigram, self.expected)
        ids, log_q = tree.sample_mixture(psi, num_kernel, self.scores, self.fixed)  # (m_k,) each
        if not num_unigram:  # no unigram share, or m too small for one unigram draw
            return ids, log_q
        extra = mix.draw(num_unigram)  # (m_u,)
        ids = torch.cat([ids, extra])  # (m,)
        return ids, mix.mix(torch.cat([log_q, tree.log_q_mixture(psi, extra, self.scores, self.fixed)]), ids)

    def _sample_with_expected(self, num_kernel: int, num_unigram: int, expected: Tensor) -> tuple[Tensor, Tensor]:
        """The GPU paths' draws with the expected ids' log q-bar (``remember``): the unigram's ids (m_u,) and the
        expected ones (any shape) are walked down by psi's walk (``FixedDraws.sample_mixture``), one scoring for all."""
        mix, flat = self.unigram, expected.reshape(-1)
        asked = flat if not num_unigram else torch.cat([mix.draw(num_unigram), flat])  # (m_u + K,)
        ids, log_q = self.tree.fixed.sample_mixture(self.psi, num_kernel, self.fixed, asked)  # (m + K,) each
        log_q = log_q if mix is None else mix.mix(log_q, ids)
        num_samples = num_kernel + num_unigram
        self.remember(log_q[num_samples:].view(expected.shape))
        return ids[:num_samples], log_q[:num_samples]

    def log_q(self, ids: Tensor) -> Tensor:
        known = self.known_log_q(ids)  # computed with the draws
        if known is not None:
            return known
        log_q = self.tree.log_q_mixture(self.psi, ids, self.scores, self.fixed)  # ids' shape
        return log_q if self.unigram is None else self.unigram.mix(log_q, ids)

    def log_q_all(self) -> Tensor:
        """log q-bar of every class, (n,)."""
        log_q = self.tree.log_q_all_mixture(self.psi)
        return log_q if self.unigram is None else self.unigram.mix(log_q)
