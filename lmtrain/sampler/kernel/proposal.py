"""A kernel sampler's proposal for one step: per position, or the mixture of the batch's proposals."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lmtrain.sampler.kernel.backend import mixed
from lmtrain.sampler.kernel.tree import KernelTree
from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.proposal import Draws, Proposal


class KernelProposal(Proposal):
    """q_i ∝ K(h_i, .) for each of this step's queries (N, d'), mixed with the training unigram when the sampler
    has a share of it; what the draws and the targets' log q share (the queries' features phi(h_i), and what the
    tree's backend adds: ``KernelTree.step``) is computed once."""

    per_position = True

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None, targets: Tensor | None) -> None:
        self.tree, self.query, self.unigram, self.targets = tree, query, unigram, targets
        self.positions = query.shape[0]
        self._step: Any = None

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def step(self) -> Any:
        """What the step's draws and log q share (``KernelTree.step``), computed at the first use."""
        if self._step is None:
            self._step = self.tree.step(self.query)
        return self._step

    @property
    def phi(self) -> Tensor:
        """The queries' features (N, F)."""
        return self.step.phi

    def draw(self, num_samples: int) -> Draws:
        tree, mix = self.tree, self.unigram
        counts = mix.split(num_samples) if mix is not None else (num_samples, 0)
        if tree.dense_draw_pays(self.positions, num_samples):  # small n: every class's q, then draw (same q)
            log_q = self.log_q_all(tree.num_classes)  # (N, n)
            ids = torch.multinomial(log_q.exp(), num_samples, replacement=True)  # (N, m)
            target_log_q = None if self.targets is None else log_q.gather(1, self.targets.view(-1, 1))
            return Draws(ids, log_q.gather(1, ids), target_log_q)
        return tree.backend.draw(self.query, self.phi, self.step, counts, mix, self.targets)

    def log_q(self, ids: Tensor) -> Tensor:
        return mixed(self.unigram, self.tree.log_q(self.query, ids, self.phi, self.step), ids)  # (N, k)

    def log_q_all(self, num_classes: int) -> Tensor:
        log_q = self.tree.log_q_all(self.query, self.phi)  # (N, n)
        return log_q if self.unigram is None else self.unigram.mix(log_q)


class MixtureProposal(Proposal):
    """The mixture q-bar = (1/N) sum_i q_i of the batch's kernel proposals, drawn by one walk of the feature-space
    query psi (``KernelTree.mixture``), with what its draws and log q-bar share kept for the step
    (``KernelTree.mixture_step``: the walk's table of in-bucket scores, or the fixed backend's top reach)."""

    shared = True

    def __init__(self, tree: KernelTree, query: Tensor, unigram: UnigramShare | None, targets: Tensor | None) -> None:
        self.tree, self.unigram, self.targets = tree, unigram, targets
        self.positions = query.shape[0]
        self.psi = tree.mixture(query)  # (F,)
        self.step = tree.mixture_step(self.psi)

    @property
    def device(self) -> torch.device:
        return self.psi.device

    def draw(self, num_samples: int) -> Draws:
        mix = self.unigram
        counts = mix.split(num_samples) if mix is not None else (num_samples, 0)
        return self.tree.backend.draw_mixture(self.psi, self.step, counts, mix, self.targets)

    def log_q(self, ids: Tensor) -> Tensor:
        return mixed(self.unigram, self.tree.log_q_mixture(self.psi, ids, self.step), ids)  # ids' shape

    def log_q_all(self, num_classes: int) -> Tensor:
        log_q = self.tree.log_q_all_mixture(self.psi)  # (n,)
        return (log_q if self.unigram is None else self.unigram.mix(log_q)).expand(self.positions, -1)
