"""The per-position losses of the sampled family as small functions (the maths is in docs/strategies.md).

Every loss is one form: the scores (N, 1 + m) of the target (first) and its m negatives, less an offset per negative
(the proposal's correction, +inf where a negative is removed), then one log-sum-exp (softmax); or the logistic form
of the target's score (N, 1) against the negatives' (N, m) (NCE, negative sampling). Shapes: N positions, m
negatives; log q (N, m) per position or (m,) shared by the batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lmtrain.common.constants import first_class
from lmtrain.sampler.proposal import Proposal


def accidental_hits(ids: Tensor, target: Tensor) -> Tensor:
    """(N, m) True where a negative equals its position's target; ``ids`` (m,) shared or (N, m)."""
    return ids.unsqueeze(0) == target.unsqueeze(1) if ids.dim() == 1 else ids == target.unsqueeze(1)


def classic_offsets(log_q: Tensor, num_samples: int) -> Tensor:
    """The classic correction ln(m q_j) (Bengio & Senecal), what is subtracted from each negative's logit."""
    return log_q + math.log(num_samples)


def exact_offsets(log_q: Tensor, log_q_target: Tensor, hits: Tensor, num_samples: int) -> Tensor:
    """The exact correction for a proposal with the target removed, q_j / (1 - q_t), over the k_t = m - hits
    negatives kept: ln k_t - ln(1 - q_t) + ln q_j, (N, m), +inf on the hits (which removes them). Computed as one
    logarithm of -(k_t) / -(1 - q_t). ``log_q`` (N, m), ``log_q_target`` (N,), ``hits`` (N, m)."""
    # (N,) -k_t; no floor at k_t = 1: where every negative is a hit (k_t = 0) every offset is masked below anyway
    minus_kept = hits.sum(1, dtype=log_q.dtype).sub_(num_samples)
    minus_rest = torch.expm1(log_q_target.clamp(max=-1e-7))  # (N,) -(1 - q_t)
    offset = torch.log(minus_kept.div_(minus_rest)).unsqueeze(1) + log_q  # (N, m) ln k_t - ln(1 - q_t) + ln q_j
    return offset.masked_fill_(hits, float("inf"))


def expected_count_offsets(log_q: Tensor, tries: Tensor) -> Tensor:
    """Distinct negatives drawn in ``tries`` draws, corrected by the log of their expected counts
    E_j = 1 - (1 - q_j)^tries."""
    return torch.log(-torch.expm1(tries * torch.log1p(-log_q.exp().clamp(max=1 - 1e-7))))


def joint_softmax_nll(scores: Tensor, offsets: Tensor, mean: bool = False) -> Tensor:
    """-log of the target's softmax among itself and its corrected negatives, from the scores (N, 1 + m), the
    target's first, less the negatives' ``offsets`` (N, m; +inf removes one): (N,), or its mean where ``mean``.
    A cross entropy with class 0 (a log-softmax and a pick)."""
    logits = scores - F.pad(offsets, (1, 0))  # (N, 1 + m), the target's logit as it is
    first = first_class(scores.shape[0], scores.device)  # (N,) class 0, made once
    return F.cross_entropy(logits, first, reduction="mean" if mean else "none")


def noise_offset(num_samples: int, log_z: Tensor | None) -> Tensor | float:
    """ln k + ln Z, what NCE subtracts from every logit; a float when ln Z is 0 (``log_z`` None: self-normalized)."""
    return math.log(num_samples) if log_z is None else log_z + math.log(num_samples)


def noise_contrast_logits(score: Tensor, log_q: Tensor, offset: Tensor | float) -> Tensor:
    """NCE's logit of "data, not noise": Δ = s - ln q - (ln k + ln Z), ``offset`` = ln k + ln Z (``noise_offset``)."""
    return score - log_q - offset


def logistic_nll(target_logit: Tensor, noise_logit: Tensor) -> Tensor:
    """Logistic regression of the target (N, 1) against the noise draws (N, m), (N, 1): -ln sigmoid(t) +
    Σ_j softplus(n_j) (softplus(-t) = -ln sigmoid(t))."""
    return F.softplus(noise_logit).sum(1, keepdim=True) - F.logsigmoid(target_logit)


def draw_unique(proposal: Proposal, num_samples: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Draw from a proposal shared by the batch until ``num_samples`` distinct ids are seen (host syncs: a CPU
    option, ``output.unique``).

    Returns the distinct ids (m,), their log q (m,), the targets' log q (N, 1) and the number of draws it took
    (a scalar tensor).
    """
    drawn: list[Tensor] = []
    seen, target_log_q = 0, None
    while seen < num_samples:
        batch, _, target_log_q, _ = proposal.draw(num_samples)
        if batch.shape[-1] != num_samples:
            name = type(proposal).__name__
            raise ValueError(f"output.unique=true needs a proposal that draws the m it is asked; {name} fixes its own")
        drawn.append(batch)
        seen = torch.unique(torch.cat(drawn)).numel()
    stream = torch.cat(drawn)  # (T,) all draws in order
    uniq, inverse = torch.unique(stream, return_inverse=True)
    first = torch.full((uniq.numel(),), stream.numel(), dtype=torch.long, device=stream.device)
    first.scatter_reduce_(0, inverse, torch.arange(stream.numel(), device=stream.device), "amin")
    order = first.argsort()[:num_samples]  # the first m distinct ids in draw order
    ids = uniq[order]
    tries = first[order].max() + 1  # draws needed to see m distinct ids
    return ids, proposal.log_q(ids), target_log_q, tries.to(torch.get_default_dtype())
