"""The per-position losses of the sampled family as small functions (the maths is in docs/strategies.md).

Shapes: N positions, m negatives; a target's logit is (N, 1), the negatives' logits (N, m), and their log q
(N, m) per position or (m,) shared by the batch.
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


def classic_logits(neg_logits: Tensor, log_q: Tensor, num_samples: int) -> Tensor:
    """Negatives corrected by ln(m q) (Bengio & Senecal): o_j - ln m - ln q_j."""
    return neg_logits - (math.log(num_samples) + log_q)


def exact_logits(neg_logits: Tensor, log_q: Tensor, log_q_target: Tensor, hits: Tensor, num_samples: int) -> Tensor:
    """Negatives corrected for the proposal with the target removed, q_j / (1 - q_t), over the k_t = m - hits
    negatives kept (their hits are masked by the caller); ``log_q_target`` (N,)."""
    kept = (num_samples - hits.sum(1)).clamp(min=1).to(neg_logits.dtype)  # (N,) k_t, in the logits' precision
    log_rest = torch.log(-torch.expm1(log_q_target.clamp(max=-1e-7)))  # (N,) ln(1 - q_t)
    return neg_logits - (kept.log() - log_rest).unsqueeze(1) - log_q


def exact_offsets(log_q: Tensor, log_q_target: Tensor, hits: Tensor, num_samples: int) -> Tensor:
    """What ``exact_logits`` subtracts from the negatives' logits, (N, m), +inf on the hits (which removes them): the
    GPU paths' form, ln k_t - ln(1 - q_t) as one logarithm of -(k_t) / -(1 - q_t), in fewer operators; the same
    values up to float rounding. ``log_q`` (N, m), ``log_q_target`` (N,), ``hits`` (N, m)."""
    # (N,) -k_t; no floor at k_t = 1: where every negative is a hit (k_t = 0) every offset is masked below anyway
    minus_kept = hits.sum(1, dtype=log_q.dtype).sub_(num_samples)
    minus_rest = torch.expm1(log_q_target.clamp(max=-1e-7))  # (N,) -(1 - q_t)
    offset = torch.log(minus_kept.div_(minus_rest)).unsqueeze(1) + log_q  # (N, m) ln k_t - ln(1 - q_t) + ln q_j
    return offset.masked_fill_(hits, float("inf"))


def expected_count_logits(neg_logits: Tensor, log_q: Tensor, tries: Tensor) -> Tensor:
    """Distinct negatives drawn in ``tries`` draws, corrected by their expected counts E_j = 1 - (1 - q_j)^tries."""
    log_count = torch.log(-torch.expm1(tries * torch.log1p(-log_q.exp().clamp(max=1 - 1e-7))))
    return neg_logits - log_count


def softmax_nll(target_logit: Tensor, neg_logits: Tensor) -> Tensor:
    """(N,) -log of the target's softmax among itself and the (corrected) negatives."""
    logits = torch.cat([target_logit, neg_logits], dim=1)  # (N, 1 + m)
    return torch.logsumexp(logits, dim=1) - target_logit[:, 0]


def joint_softmax_nll(scores: Tensor, offsets: Tensor, mean: bool = False) -> Tensor:
    """``softmax_nll`` from one (N, 1 + m) tensor of scores, the target's first, less the negatives' ``offsets``
    (N, m; +inf removes one), (N,), or its mean over the positions where ``mean``: the GPU paths' form, a cross
    entropy with class 0 (a log-softmax and a pick, whose backward pass is two operators where the log-sum-exp less
    the target's logit takes seven; the mean taken by the pick, none of its own)."""
    logits = scores - F.pad(offsets, (1, 0))  # (N, 1 + m), the target's logit as it is
    first = first_class(scores.shape[0], scores.device)  # (N,) class 0, made once
    return F.cross_entropy(logits, first, reduction="mean" if mean else "none")


def noise_offset(num_samples: int, log_z: Tensor | None) -> Tensor | float:
    """ln k + ln Z, what NCE subtracts from every logit; a float when ln Z is 0 (``log_z`` None: self-normalized)."""
    return math.log(num_samples) if log_z is None else log_z + math.log(num_samples)


def noise_contrast_logits(score: Tensor, log_q: Tensor, offset: Tensor | float) -> Tensor:
    """NCE's logit of "data, not noise": Δ = s - ln q - (ln k + ln Z), ``offset`` = ln k + ln Z (``noise_offset``)."""
    return score - log_q - offset


def logistic_loss(target_logit: Tensor, noise_logit: Tensor) -> Tensor:
    """(N,) logistic regression of the target (N, 1) against the noise draws (N, m): softplus(-t) + Σ softplus(n)."""
    return F.softplus(-target_logit).sum(1) + F.softplus(noise_logit).sum(1)


def logistic_nll(target_logit: Tensor, noise_logit: Tensor) -> Tensor:
    """``logistic_loss`` in fewer operators (the GPU paths), (N, 1): -ln sigmoid(t) + Σ softplus(n), the same value
    up to float rounding; ``target_logit`` (N, 1), ``noise_logit`` (N, m)."""
    return F.softplus(noise_logit).sum(1, keepdim=True) - F.logsigmoid(target_logit)


def joint_logistic_nll(logits: Tensor) -> Tensor:
    """``logistic_loss`` of one (N, 1 + m) tensor of logits, the target's first, (N,): Σ_j softplus(l_j) - l_t, as
    softplus(-t) = softplus(t) - t; one pass over the tensor, so its gradient needs no slicing. It differs from
    ``logistic_loss`` by float rounding: absolutely by about the rounding of softplus(l_t), which matters only
    when l_t is large, where the row's loss is near 0 anyway."""
    return F.softplus(logits).sum(1) - logits[:, 0]


def draw_negatives(proposal: Proposal, num_samples: int, positions: int, shared: bool) -> tuple[Tensor, Tensor]:
    """m negatives and their log q: (N, m) per position, or (m,) for the batch when ``shared`` (or a
    per-example proposal's own draws); a shared proposal draws N x m at once for per-position negatives."""
    if proposal.per_example or shared:
        return proposal.sample(num_samples)
    ids, log_q = proposal.sample(positions * num_samples)  # (N * m,) from one proposal
    return ids.view(positions, -1), log_q.view(positions, -1)  # (N, m) each


def draw_negative_ids(proposal: Proposal, num_samples: int, positions: int) -> Tensor:
    """``draw_negatives``' per-position ids alone, (N, m): the same draws, without their log q."""
    if proposal.per_example:
        return proposal.sample_ids(num_samples)
    return proposal.sample_ids(positions * num_samples).view(positions, -1)  # (N, m) from one proposal


def draw_unique(proposal: Proposal, num_samples: int) -> tuple[Tensor, Tensor, Tensor]:
    """Draw from a shared proposal (context-free, or the batch's) until ``num_samples`` distinct ids are seen.

    Returns the distinct ids (m,), their log q (m,), and the number of draws it took (scalar tensor).
    """
    drawn: list[Tensor] = []
    seen = 0
    while seen < num_samples:
        batch, _ = proposal.sample(num_samples)
        drawn.append(batch)
        seen = torch.unique(torch.cat(drawn)).numel()
    stream = torch.cat(drawn)  # (T,) all draws in order
    uniq, inverse = torch.unique(stream, return_inverse=True)
    first = torch.full((uniq.numel(),), stream.numel(), dtype=torch.long, device=stream.device)
    first.scatter_reduce_(0, inverse, torch.arange(stream.numel(), device=stream.device), "amin")
    order = first.argsort()[:num_samples]  # the first m distinct ids in draw order
    ids = uniq[order]
    tries = first[order].max() + 1  # draws needed to see m distinct ids
    return ids, proposal.log_q(ids), tries.to(torch.get_default_dtype())
