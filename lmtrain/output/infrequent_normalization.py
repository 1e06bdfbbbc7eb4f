"""Infrequent normalization (Andreas & Klein 2015) of a self-normalized exact output: with γ < 1 only a γ-fraction
of a step's positions compute Z; every position scores its target alone, through one row gather.

With s_i the target's score at position i and D_γ the K = max(1, round(γ N)) positions drawn this step,

    loss = (1/N) [ -Σ_i s_i + (α / γ) Σ_{i ∈ D_γ} (ln Z_i)² ]

(the likelihood term is unnormalized: the penalty alone keeps ln Z near 0). The positions are drawn afresh each
step, without replacement, from the torch generator of the hidden states' device (the CPU's is in every
checkpoint, so a resumed run draws the same positions); K is fixed by N, so the step has fixed shapes and no host
sync. γ = 1 is plain self-normalization (``lmtrain.output.self_normalize``), whose likelihood term is normalized.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lmtrain.output.self_normalize import SelfNormalized, SelfNormalizeOptions


@dataclass
class InfrequentNormalizationOptions(SelfNormalizeOptions):
    """The self-normalization keys of an exact output with infrequent normalization (inherited by
    ``FullOptions``)."""

    # γ in (0, 1]: below 1, only round(γ N) positions of a step (at least one) compute ln Z, and the penalty is
    # scaled by α / γ; needs self_normalize > 0
    normalize_fraction: float = field(default=1.0, metadata={"above": 0, "at_most": 1})

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = fraction_problem(self.self_normalize, self.normalize_fraction, "output")
        if problem:
            raise ValueError(problem)

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """The config check's rule across keys: ``normalize_fraction`` below 1 only with ``self_normalize`` > 0."""
        try:
            alpha, gamma = node.get("self_normalize"), node.get("normalize_fraction")
        except Exception:  # an interpolation only a Hydra app resolves: the build checks it again
            return
        problem = fraction_problem(alpha, gamma, path)
        if problem:
            yield problem


def fraction_problem(alpha: Any, gamma: Any, path: str) -> str:
    """The one-line refusal of γ < 1 without α > 0 ('' when the pair is fine or not numbers yet)."""
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (alpha, gamma)):
        return ""
    if gamma < 1 and not alpha > 0:
        return (
            f"{path}.normalize_fraction={gamma} samples the self-normalization penalty, which is off "
            f"({path}.self_normalize={alpha}): set {path}.self_normalize > 0 or leave normalize_fraction at 1"
        )
    return ""


def normalized_count(num_positions: int, fraction: float) -> int:
    """K = max(1, round(γ N)): the positions of a step that compute Z (fixed by the step's shape)."""
    return max(1, round(fraction * num_positions))


def draw_positions(num_positions: int, count: int, device: torch.device) -> Tensor:
    """``count`` distinct positions of ``num_positions``, uniformly, from the global generator of ``device``: (K,)."""
    return torch.randperm(num_positions, device=device)[:count]  # (K,)


class InfrequentlyNormalized(SelfNormalized):
    """``SelfNormalized`` with ``normalize_fraction`` (options inherit ``InfrequentNormalizationOptions``): below 1
    the loss is the module docstring's, and only the drawn positions reach ``position_nll``."""

    options: InfrequentNormalizationOptions

    def self_normalized_loss(self, hidden: Tensor, target: Tensor) -> Tensor:
        fraction = self.options.normalize_fraction
        if fraction >= 1:
            return super().self_normalized_loss(hidden, target)
        num_positions = hidden.shape[0]
        score = self.unnormalized_log_prob(hidden, target)  # (N,) s_t, one row gather each
        picked = draw_positions(num_positions, normalized_count(num_positions, fraction), hidden.device)  # (K,)
        log_z = self.position_nll(hidden[picked], target[picked]) + score[picked]  # (K,) ln Z = -ln p + s_t
        penalty = (self.options.self_normalize / fraction) * log_z.square().sum()
        return (penalty - score.sum()) / num_positions
