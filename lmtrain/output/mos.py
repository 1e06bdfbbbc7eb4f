"""Mixture of softmaxes (Yang et al. 2018): K softmaxes over one set of class vectors, mixed per position; exact in
training and evaluation (docs/strategies.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.output.base import OutputLayer, initial_bias
from lmtrain.output.chunked_softmax import exact_softmax_nll, fitting_chunk, logits_budget_mib
from lmtrain.output.logsumexp import class_rows, exact_log_prob
from lmtrain.output.options import FRACTION, GPU_FRACTION, INIT_RANGE, BiasInit


@dataclass
class MoSOptions(Checked):
    """``output=mos``: the mixture of softmaxes, K components over shared class vectors (exact, K times full's
    products per position).

    The training loss takes the (K N, n) component logits dense when they fit in the budget (float32: ``logits_mib``
    MiB on a CPU, ``gpu_logits_fraction`` of the device's memory on a GPU), else vocabulary chunks of the most
    classes whose (K N, chunk) logits fit; ``train_chunk`` fixes the chunk (0: always dense).
    """

    components: int = field(default=15, metadata=AT_LEAST_1)  # K, the softmaxes mixed
    # d_e, the width of each component's context vector and of the class vectors; None: the hidden width d (what a
    # tied model needs: d = model.emb_dim there)
    component_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    # dropout on the components' context vectors tanh(P_k h + c_k), training loss only (evaluation never drops)
    latent_dropout: float = field(default=0.0, metadata={"at_least": 0, "below": 1})
    init_range: float = field(default=0.1, metadata=INIT_RANGE)  # uniform(-init_range, init_range): W, P, U
    bias_init: BiasInit = BiasInit.zero
    eval_chunk: int = field(default=65536, metadata=AT_LEAST_1)  # classes per chunk of exact evaluation
    train_chunk: int | None = field(default=None, metadata={"at_least": 0})
    logits_mib: float = field(default=128.0, metadata={"above": 0})  # the budget on a CPU
    gpu_logits_fraction: float = field(default=GPU_FRACTION, metadata=FRACTION)  # on a GPU; 0: logits_mib there too


class MixtureOfSoftmaxes(OutputLayer):
    """p(w | h) = sum_k pi_k(h) softmax(W h_k + b)_w with h_k = tanh(P_k h + c_k) and pi(h) = softmax(U h).

    The class vectors W (n, d_e) and biases b are shared by the K components; P (K d_e, d) and c (K d_e) make the
    components' context vectors, U (K, d) the mixture weights. The loss is the exact mean -log p, taken in log space
    (logsumexp over k of log pi_k + log softmax_k(w)); each component's log-normalizer is exact, in vocabulary chunks
    of ``eval_chunk`` in ``log_prob`` and of the logits budget in ``loss`` (``MoSOptions``). ``latent_dropout``
    drops entries of the h_k in the training loss only. Tied weights share W (``embed``), which needs d_e = d.
    """

    name, Options = "mos", MoSOptions  # output=mos
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "counts")

    loss_is_nll = True
    tie_refusal = ""

    def __init__(self, num_classes: int, dim: int, counts: Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = opts = MoSOptions(**options)  # the keys left out take their defaults
        self.num_classes, self.dim = num_classes, dim
        self.components, self.component_dim = opts.components, opts.component_dim or dim
        width = self.components * self.component_dim
        self.weight = nn.Parameter(torch.empty(num_classes, self.component_dim))  # W, shared by the components
        self.bias = nn.Parameter(initial_bias(opts.bias_init, num_classes, counts))  # b
        self.latent_weight = nn.Parameter(torch.empty(width, dim))  # P: the K projections stacked
        self.latent_bias = nn.Parameter(torch.zeros(width))  # c
        self.prior_weight = nn.Parameter(torch.empty(self.components, dim))  # U
        for param in (self.weight, self.latent_weight, self.prior_weight):
            nn.init.uniform_(param, -opts.init_range, opts.init_range)

    @staticmethod
    def tie_problems(output: Any, model: Any) -> Iterator[str]:
        """The config check's rule for ``model.tie_weights=true`` (``lmtrain.config.validate``): the tied matrix is
        W, so a component width must be the embedding's."""
        width, emb = output.get("component_dim"), model.get("emb_dim")
        if width is not None and width != emb:
            yield (
                f"model.tie_weights=true needs output.component_dim equal to model.emb_dim ({emb}), got {width}: "
                "leave output.component_dim unset (it follows the top layer, emb_dim wide when tied)"
            )

    def embed(self, tokens: Tensor) -> Tensor:
        if self.component_dim != self.dim:  # a tied encoder's top layer is emb_dim = d wide, the rows d_e
            raise ValueError(
                f"a tied output=mos needs output.component_dim equal to model.emb_dim ({self.dim}), got "
                f"{self.component_dim}: leave output.component_dim unset"
            )
        return F.embedding(tokens, self.weight)  # (..., d_e): dense rows, the softmaxes reach every row anyway

    def mixture(self, hidden: Tensor, drop: bool = False) -> tuple[Tensor, Tensor]:
        """(N, d) -> log pi (N, K), the components' context vectors (N K, d_e): row i K + k is h_k at position i;
        ``drop``: with ``latent_dropout`` applied."""
        log_prior = torch.log_softmax(F.linear(hidden, self.prior_weight), dim=1)  # (N, K)
        latent = torch.tanh(F.linear(hidden, self.latent_weight, self.latent_bias))  # (N, K d_e)
        if drop and self.options.latent_dropout:
            latent = F.dropout(latent, self.options.latent_dropout)
        return log_prior, latent.view(-1, self.component_dim)  # (N K, d_e)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        num_positions, k = hidden.shape[0], self.components
        log_prior, latent = self.mixture(hidden, drop=self.training)
        targets = target[:, None].expand(num_positions, k).reshape(-1)  # (N K,): each position's target, K times
        if self.loss_chunk(num_positions * k, hidden.device) >= self.num_classes:
            nll = F.cross_entropy(F.linear(latent, self.weight, self.bias), targets, reduction="none")  # (N K,)
        else:
            budget = self.loss_budget(hidden.device)
            nll = exact_softmax_nll(latent, self.weight, self.bias, targets, budget, self.options.train_chunk)  # (N K,)
        return -torch.logsumexp(log_prior - nll.view(num_positions, k), dim=1).mean()

    def loss_chunk(self, rows: int, device: torch.device | None = None) -> int:
        """Classes per vocabulary chunk of the training loss for ``rows`` component rows (N K) on ``device`` (None:
        the weights'); >= n means dense."""
        if self.options.train_chunk is not None:
            return self.options.train_chunk or self.num_classes
        return fitting_chunk(self.loss_budget(device), rows)

    def loss_budget(self, device: torch.device | None = None) -> float:
        """The MiB a step's float32 component logits may take on ``device`` (None: the weights')."""
        opts = self.options
        return logits_budget_mib(opts.logits_mib, opts.gpu_logits_fraction, device or self.weight.device)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        log_prior, latent = self.mixture(hidden)
        component_targets = target.repeat_interleave(self.components)  # (N K,) row (i, k) of latent predicts target i

        def logits(start: int, end: int) -> Tensor:  # (N K, end - start)
            return F.linear(latent, class_rows(self.weight, start, end), class_rows(self.bias, start, end))

        def target_logit() -> Tensor:  # (N K,)
            return (latent * self.weight[component_targets]).sum(1) + self.bias[component_targets]

        log_p = exact_log_prob(logits, target_logit, component_targets, self.num_classes, self.options.eval_chunk)
        return torch.logsumexp(log_prior + log_p.view_as(log_prior), dim=1)  # (N,) the mixture of the K components

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        log_prior, latent = self.mixture(hidden)
        log_p = torch.log_softmax(F.linear(latent, self.weight, self.bias), dim=1)  # (N K, n)
        return torch.logsumexp(log_p.view(hidden.shape[0], self.components, -1) + log_prior[:, :, None], dim=1)
