"""The interface every proposal distribution implements (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from lmtrain.common.part import Part
from lmtrain.common.precision import wrap_methods
from lmtrain.sampler.proposal import BoundProposal, Proposal


class Sampler(nn.Module, Part):
    """A proposal q over the classes, used for negatives by sampled softmax, NCE and negative sampling.

    Samplers with ``per_example = False`` return ids of shape (m,) shared by the whole batch: context-free
    ones ignore ``hidden`` and ``inputs``; a batch-shared one (a kernel sampler after ``share_negatives(True)``)
    draws from one proposal built from the whole batch's context, and its ``log_q`` is that proposal's for any
    ids. Samplers with ``per_example = True`` return ids of shape (N, m), one row per position. The context is
    ``hidden``, the output layer's query vector (N, d'), e.g. [h, 1], whose dot product with a ``weight`` row
    (the vectors given to ``update``) is the logit, and ``inputs`` (N,), the input token at each position (for
    a language model the previous word: the token the LSTM read there). A sampler uses what it needs and
    ignores the rest; one that needs ``inputs`` and gets None raises ValueError. ``log_q`` is the exact
    log-probability with which each returned id was drawn.

    Under mixed precision (autocast) every subclass's ``sample``, ``log_q``, ``log_q_all`` and ``update`` run in
    float32 (``lmtrain.common.precision``): log q and a kernel tree's node sums never pass through bfloat16.
    """

    group = "sampler"  # sampler=NAME (``lmtrain.common.part``)
    # the run-time values lmtrain.training.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes",)

    per_example: bool = False
    log_q_by_lookup: bool = False  # log q of any ids is a lookup (``Proposal.log_q_by_lookup``)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        wrap_methods(cls, ("propose", "sample", "sample_ids", "log_q", "log_q_all", "update"))

    def propose(self, hidden: Tensor | None, inputs: Tensor | None = None) -> Proposal:
        """This step's proposal for the queries ``hidden`` (N, d') and input tokens ``inputs`` (N,): built once per
        step, it draws the negatives and gives the targets' log q (the default binds the context to ``sample``
        and ``log_q``; a sampler with work to share between the two returns its own ``Proposal``)."""
        return BoundProposal(self, hidden, inputs)

    def sample(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids (with replacement); return (ids, log_q) of equal shape."""
        raise NotImplementedError

    def sample_ids(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> Tensor:
        """``sample``'s ids alone, the same draws; a sampler whose log q is a lookup skips it."""
        return self.sample(hidden, num_samples, inputs=inputs)[0]

    def log_q(self, hidden: Tensor | None, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        """Exact log q of any ids: the ids' shape for shared proposals (context-free, or batch-shared given the
        batch's hidden (N, d')), (N, k) with hidden (N, d') and/or inputs (N,) for per-example ones."""
        raise NotImplementedError

    def share_negatives(self, shared: bool) -> None:
        """Choose one set of negatives per batch (``shared``) or one per position, for samplers that offer both
        (kernel samplers: the batch-shared mode draws from the mixture of the batch's proposals). The others
        keep their only mode (the default): context-free samplers always share (an output layer asking for
        per-position negatives draws N x m of them), and softmax and bigram always draw per position."""

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        """Refresh after class embeddings changed; ``rows`` = changed rows, None = all. Default no-op."""

    def follow(self, weight: Tensor) -> None:
        """The output layer's weight moved (another device or dtype: ``module.to``): samplers that keep a reference
        to it take the moved tensor. Default no-op (trees move their own buffers as submodules)."""

    def use_scores(self, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        """Receive the output layer's logit function, query (N, d') and rows (k, d') -> (N, k). Samplers whose
        proposal is the model's own softmax keep it; the others ignore it (the default)."""

    def log_q_all(self, hidden: Tensor, num_classes: int, inputs: Tensor | None = None) -> Tensor:
        """log q of every class for each query (N, d') and input token (N,) -> (N, n), for diagnostics
        (KL(p || q)); O(N n) memory."""
        ids = torch.arange(num_classes, device=hidden.device)
        if not self.per_example:  # one proposal for all positions (of this batch)
            return self.log_q(hidden, ids, inputs=inputs).expand(hidden.shape[0], -1)
        return self.log_q(hidden, ids.expand(hidden.shape[0], -1), inputs=inputs)
