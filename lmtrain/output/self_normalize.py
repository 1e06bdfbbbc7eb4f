"""Self-normalization (Devlin et al. 2014) for the exact outputs: the training loss adds α (ln Z)² per position, so
that a trained model's ln Z stays near 0 and exp(s_t), the target's score alone, approximates p(t | h).

An exact output opts in by inheriting ``SelfNormalizeOptions`` in its options dataclass and ``SelfNormalized`` in
its class (before ``OutputLayer``), by providing ``position_nll`` and ``unnormalized_log_prob``, and by returning
``self_normalized_loss`` from ``loss`` when ``self_normalize`` > 0 (``FullSoftmax`` does). With α = 0 its ``loss``
never reaches this module: the plain loss runs as it did before the option existed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lmtrain.common.ranges import Checked


@dataclass
class SelfNormalizeOptions(Checked):
    """The self-normalization key of an exact output (inherited by ``FullOptions``)."""

    # α >= 0: the loss is the mean over positions of -ln p(t | h) + α (ln Z)²; 0: the plain loss (the same code)
    self_normalize: float = field(default=0.0, metadata={"at_least": 0})


class SelfNormalized:
    """The training loss and the validation statistics of self-normalization, for an ``OutputLayer`` whose options
    inherit ``SelfNormalizeOptions``.

    The layer provides ``position_nll(hidden, target)`` -> (N,) the exact -ln p(t | h) with gradients, and
    ``unnormalized_log_prob(hidden, target)`` -> (N,) the target's score s_t (one row gather). ln Z is their sum,
    the same in the layer's dense and chunked paths, so the penalty's gradient (2α ln Z times the softmax) flows
    through the layer's own backward pass. ``loss_is_nll`` is true only without the penalty; validation and test log
    ``ppl_unnormalized`` (exp of the mean -s_t: the perplexity that assumes Z = 1), ``log_z_mean`` and ``log_z_sd``
    when α > 0.
    """

    options: SelfNormalizeOptions
    unnormalized_log_prob: Callable[[Tensor, Tensor], Tensor]  # the layer's

    def position_nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) exact -ln p(target | hidden), differentiable."""
        raise NotImplementedError

    @property
    def loss_is_nll(self) -> bool:
        """Whether ``loss`` is the exact mean -ln p (then train/ppl is logged): only without the penalty."""
        return not self.options.self_normalize

    def self_normalized_loss(self, hidden: Tensor, target: Tensor) -> Tensor:
        """mean_i [-ln p(t_i | h_i) + α (ln Z_i)²]: every position computes its Z."""
        nll = self.position_nll(hidden, target)  # (N,)
        log_z = nll + self.unnormalized_log_prob(hidden, target)  # (N,) ln Z = -ln p + s_t
        return nll.mean() + self.options.self_normalize * log_z.square().mean()

    @property
    def eval_sum_count(self) -> int:
        """Sums that ``eval_sums`` returns: Σ ln Z and Σ (ln Z)² when α > 0, else none."""
        return 2 if self.options.self_normalize else 0

    def eval_sums(self, hidden: Tensor, target: Tensor, log_p: Tensor) -> Tensor:
        """(N, d), (N,), the window's exact ln p (N,) -> (Σ ln Z, Σ (ln Z)²) in float64, or (0,) when α = 0. ln Z is
        s_t - ln p, one row gather per position beside the exact evaluation."""
        if not self.options.self_normalize:
            return log_p.new_zeros(0, dtype=torch.float64)
        log_z = self.unnormalized_log_prob(hidden, target).double() - log_p.double()  # (N,)
        return torch.stack([log_z.sum(), log_z.square().sum()])

    def eval_summary(self, sums: Tensor, tokens: Tensor, mean_nll: Tensor) -> dict[str, Tensor]:
        """The metrics of an evaluation from the summed ``eval_sums`` over ``tokens`` positions and its mean NLL."""
        if not self.options.self_normalize:
            return {}
        mean, mean_square = sums[0] / tokens.clamp(min=1), sums[1] / tokens.clamp(min=1)
        return {
            "ppl_unnormalized": (mean_nll.double() - mean).exp().float(),  # exp(mean -s_t) = exp(mean -ln p - ln Z)
            "log_z_mean": mean.float(),
            "log_z_sd": (mean_square - mean.square()).clamp(min=0).sqrt().float(),
        }


def log_z_statistics(log_z: Tensor) -> tuple[float, float]:
    """The mean and the (population) sd of ln Z over positions (N,), in float64 (the score tool)."""
    values = log_z.double()
    mean = float(values.mean()) if values.numel() else math.nan
    return mean, float(values.std(correction=0)) if values.numel() else math.nan
