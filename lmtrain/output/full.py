"""Full softmax: the exact, O(nd) reference strategy."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.output.base import OutputLayer, initial_bias
from lmtrain.output.chunked_softmax import exact_softmax_nll, fitting_chunk, logits_budget_mib
from lmtrain.output.infrequent_normalization import InfrequentlyNormalized
from lmtrain.output.logsumexp import class_rows, exact_log_prob
from lmtrain.output.options import FullOptions


class FullSoftmax(InfrequentlyNormalized, OutputLayer):
    """Softmax cross-entropy over all classes; training loss and exact log-prob are the same model.

    ``log_prob`` normalizes in vocabulary chunks of ``eval_chunk`` classes so that n = 10^6 fits. ``loss`` builds
    the (N, n) logits (dense) when they fit in the budget (float32: ``logits_mib`` MiB on a CPU,
    ``gpu_logits_fraction`` of the device's memory on a GPU), and otherwise trains through ``exact_softmax_nll``
    (torch's chunked ``linear_cross_entropy``, or vocabulary chunks of the most classes whose (N, chunk) logits fit
    in it); ``train_chunk`` fixes the vocabulary chunk instead (0: always dense; a chunk >= n is dense too). All are
    exact.
    ``bias_init`` is ``zero`` or ``log_unigram`` (the biases start at the log training unigram, ``counts``).
    ``self_normalize`` > 0 adds the self-normalization penalty (``InfrequentlyNormalized``; ``loss_is_nll`` is then
    false), and ``normalize_fraction`` < 1 computes Z at a drawn fraction of the positions only.
    """

    name, Options = "full", FullOptions  # output=full
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "counts")

    tie_refusal = ""  # loss_is_nll: without the self-normalization penalty (SelfNormalized)

    def __init__(self, num_classes: int, dim: int, counts: Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = opts = FullOptions(**options)  # the keys left out take their defaults
        self.num_classes, self.dim = num_classes, dim
        self.eval_chunk = opts.eval_chunk
        self.train_chunk, self.logits_mib, self.gpu_logits_fraction = (
            opts.train_chunk,
            opts.logits_mib,
            opts.gpu_logits_fraction,
        )
        self.weight = nn.Parameter(torch.empty(num_classes, dim))
        self.bias = nn.Parameter(initial_bias(opts.bias_init, num_classes, counts))
        nn.init.uniform_(self.weight, -opts.init_range, opts.init_range)

    def logits(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, n)."""
        return F.linear(hidden, self.weight, self.bias)

    def embed(self, tokens: Tensor) -> Tensor:
        # dense rows: the softmax's gradient reaches every class row anyway
        return F.embedding(tokens, self.weight)  # (..., d)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        if self.options.self_normalize:  # α = 0: the plain loss below, untouched
            return self.self_normalized_loss(hidden, target)
        if self.loss_chunk(hidden.shape[0], hidden.device) >= self.num_classes:
            return F.cross_entropy(self.logits(hidden), target)
        budget = self.loss_budget(hidden.device)
        return exact_softmax_nll(hidden, self.weight, self.bias, target, budget, self.train_chunk, reduction="mean")

    def position_nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) exact -ln p(target), differentiable: dense or chunked as ``loss``."""
        if self.loss_chunk(hidden.shape[0], hidden.device) >= self.num_classes:
            return F.cross_entropy(self.logits(hidden), target, reduction="none")
        return exact_softmax_nll(
            hidden, self.weight, self.bias, target, self.loss_budget(hidden.device), self.train_chunk
        )

    def unnormalized_log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        return (hidden * self.weight[target]).sum(1) + self.bias[target]  # (N,) s_t: one row gather

    def loss_chunk(self, num_positions: int, device: torch.device | None = None) -> int:
        """Classes per vocabulary chunk of the training loss for ``num_positions`` rows on ``device`` (None: the
        weights'); >= n means dense."""
        if self.train_chunk is not None:
            return self.train_chunk or self.num_classes
        return fitting_chunk(self.loss_budget(device), num_positions)

    def loss_budget(self, device: torch.device | None = None) -> float:
        """The MiB a step's float32 logits may take on ``device`` (None: the weights')."""
        return logits_budget_mib(self.logits_mib, self.gpu_logits_fraction, device or self.weight.device)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        def logits(start: int, end: int) -> Tensor:  # (N, end - start)
            return F.linear(hidden, class_rows(self.weight, start, end), class_rows(self.bias, start, end))

        target_logit = partial(self.unnormalized_log_prob, hidden, target)  # (N,) one row read per position
        return exact_log_prob(logits, target_logit, target, self.num_classes, self.eval_chunk)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.logits(hidden), dim=1)  # (N, n)
