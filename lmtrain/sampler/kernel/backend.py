"""The interface of a kernel tree's two backends: a step's draws with their exact log q, the log q of any ids, and
the tree's update after an optimizer step.

``WalkBackend`` (``walk_backend.py``) is a CPU's: cache-sized blocks, each distinct row or bucket once (``unique``,
whose output size depends on the data: a host sync on a GPU). ``FixedBackend`` (``fixed_backend.py``) is a GPU's: a
fixed number of operators whatever the data, no host sync. Both draw from the same proposal (the same clamped branch
probabilities, the same in-bucket weights), so they differ only in how they use their random numbers and in speed.
A ``KernelTree`` holds one, chosen once when it is built (``sampler.backend``, else the run's step forms,
``lmtrain.common.runtime.StepForms``). Neither backend imports the other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.kernel.unigram_share import UnigramShare
from lmtrain.sampler.proposal import Draws


def mixed(unigram: UnigramShare | None, log_kernel: Tensor, ids: Tensor) -> Tensor:
    """The proposal's log q of ``ids`` from the kernel's ``log_kernel`` (same shape): mixed with the unigram share
    where the sampler has one."""
    return log_kernel if unigram is None else unigram.mix(log_kernel, ids)


class TreeBackend(ABC):
    """How a ``KernelTree`` draws, scores and updates (see the module docstring). A backend computes with the
    tree's parts (the store's node sums, the bucket scorer), which it borrows: it holds no state a checkpoint needs.

    Per position a method takes the queries (N, d), their features ``phi`` (N, F; None: computed from the queries)
    and the step's ``step``: what the draws and log q of one step share, made once by ``step(query)`` (its ``phi``,
    and what the backend adds); None: made where it is needed. Batch-shared it takes the mixture's query psi (F,) and
    its step (``mixture_step(psi)``). ``draw`` and ``draw_mixture`` are a proposal's whole draw: the kernel's ids, a
    unigram share's, and the targets' log q."""

    name: ClassVar[str]  # the sampler.backend that forces it: walk | fixed
    # the store's blocks: None: cache-sized (``TreeStore.chunk_elements``); else only bounding memory, at this many
    # elements of temporaries
    block_limit: ClassVar[int | None] = None

    @abstractmethod
    def step(self, query: Tensor) -> Any:
        """What the per-position draws and log q of the queries (N, d) share in one step (``.phi``: (N, F))."""

    @abstractmethod
    def mixture_step(self, psi: Tensor) -> Any:
        """What the batch-shared draws and log q-bar of the mixture's psi (F,) share in one step."""

    @abstractmethod
    def sample(self, query: Tensor, phi: Tensor | None, num_samples: int, step: Any = None) -> tuple[Tensor, Tensor]:
        """m = ``num_samples`` ids per query drawn from the kernel proposal (N, m), and their exact log q (N, m)."""

    @abstractmethod
    def log_q(self, query: Tensor, phi: Tensor | None, ids: Tensor, step: Any = None) -> Tensor:
        """Exact log q (N, k) of any ids (N, k) under the kernel proposal that ``sample`` draws from."""

    def log_q_many(self, query: Tensor, phi: Tensor | None, ids: Tensor, step: Any = None) -> Tensor:
        """``log_q`` of ids drawn elsewhere (a unigram share's), by whichever way costs less; default ``log_q``."""
        return self.log_q(query, phi, ids, step)

    @abstractmethod
    def sample_mixture(self, psi: Tensor, num_samples: int, step: Any = None) -> tuple[Tensor, Tensor]:
        """m ids (m,) drawn with psi's walk (the batch's mixture q-bar) and their exact log q-bar (m,)."""

    @abstractmethod
    def log_q_mixture(self, psi: Tensor, ids: Tensor, step: Any = None) -> Tensor:
        """Exact log q-bar of any ids (any shape) under psi's walk, the same shape."""

    def dense_draw_pays(self, n_query: int, num_samples: int) -> bool:
        """Whether drawing from every class's q (``KernelTree.sample_dense``) costs less than ``sample``: never by
        default (a fixed operator count whatever n)."""
        return False

    @abstractmethod
    def update(self, weight: Tensor, rows: Tensor) -> None:
        """Bring the tree up to ``weight`` (n, d) after the rows ``rows`` (R,) changed (repeats allowed)."""

    def draw(
        self,
        query: Tensor,
        phi: Tensor,
        step: Any,
        counts: tuple[int, int],
        unigram: UnigramShare | None,
        targets: Tensor | None,
    ) -> Draws:
        """A step's m = sum(``counts``) ids per position (N, m) with their exact log q, and the targets' log q (N, 1)
        (None without ``targets`` (N,)): ``counts`` = (draws from the kernel, from the ``unigram`` share), the
        kernel's drawn first, then the unigram's, then the targets' log q computed alone."""
        num_kernel, num_unigram = counts
        ids, log_q = self.sample(query, phi, num_kernel, step)  # (N, m_k) each
        if num_unigram:
            extra = unigram.draw(query.shape[0], num_unigram)  # (N, m_u)
            ids = torch.cat([ids, extra], 1)  # (N, m)
            log_q = unigram.mix(torch.cat([log_q, self.log_q_many(query, phi, extra, step)], 1), ids)
        if targets is None:
            return Draws(ids, log_q, None)
        asked = targets.view(-1, 1)  # (N, 1)
        return Draws(ids, log_q, mixed(unigram, self.log_q(query, phi, asked, step), asked))

    def draw_mixture(
        self, psi: Tensor, step: Any, counts: tuple[int, int], unigram: UnigramShare | None, targets: Tensor | None
    ) -> Draws:
        """``draw`` for the batch's mixture: m ids (m,) for the whole batch with their exact log q-bar, and the
        targets' (N, 1)."""
        num_kernel, num_unigram = counts
        ids, log_q = self.sample_mixture(psi, num_kernel, step)  # (m_k,) each
        if num_unigram:  # a unigram share, and m large enough for one unigram draw
            extra = unigram.draw(num_unigram)  # (m_u,)
            ids = torch.cat([ids, extra])  # (m,)
            log_q = unigram.mix(torch.cat([log_q, self.log_q_mixture(psi, extra, step)]), ids)
        if targets is None:
            return Draws(ids, log_q, None)
        asked = targets.view(-1, 1)  # (N, 1)
        return Draws(ids, log_q, mixed(unigram, self.log_q_mixture(psi, asked, step), asked))
