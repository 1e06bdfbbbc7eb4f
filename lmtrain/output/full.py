"""Full softmax: the exact, O(nd) reference strategy."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.output.base import OutputLayer, initial_bias
from lmtrain.output.logsumexp import chunked_logsumexp


class FullSoftmax(OutputLayer):
    """Softmax cross-entropy over all classes; training loss and exact log-prob are the same model.

    ``log_prob`` normalizes in vocabulary chunks of ``eval_chunk`` classes so that n = 10^6 fits.
    ``bias_init`` is ``zero`` or ``log_unigram`` (the biases start at the log training unigram, ``counts``).
    """

    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "counts")

    loss_is_nll = True

    def __init__(
        self,
        num_classes: int,
        dim: int,
        init_range: float = 0.1,
        eval_chunk: int = 65536,
        bias_init: Literal["zero", "log_unigram"] = "zero",
        counts: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_classes, self.dim = num_classes, dim
        self.eval_chunk = eval_chunk
        self.weight = nn.Parameter(torch.empty(num_classes, dim))
        self.bias = nn.Parameter(initial_bias(bias_init, num_classes, counts))
        nn.init.uniform_(self.weight, -init_range, init_range)

    def logits(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, n)."""
        return F.linear(hidden, self.weight, self.bias)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        return F.cross_entropy(self.logits(hidden), target)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        target_logit = (hidden * self.weight[target]).sum(1) + self.bias[target]  # (N,)
        log_z = chunked_logsumexp(
            lambda s, e: F.linear(hidden, self.weight[s:e], self.bias[s:e]), self.num_classes, self.eval_chunk
        )
        return target_logit - log_z

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.logits(hidden), dim=1)  # (N, n)
