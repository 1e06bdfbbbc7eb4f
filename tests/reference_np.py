"""An independent NumPy reference for the sampled losses, written from docs/strategies.md (not from lmtrain's code).

Everything is per position and in float64, with explicit loops over positions and draws, so that it shares no
vectorization trick (broadcast shared ids, masked fills, clamps) with lmtrain. Each function takes one position's
scores of every class ``s`` (n,), its target ``t``, the ids drawn for it ``ids`` (m,) and the proposal's
probability of every class ``q`` (n,), and returns the loss and its gradient with respect to ``s`` (n,).
``chain`` turns gradients with respect to the scores into gradients with respect to the hidden states and the
augmented class matrix [W, b] of a dot-product score s_i = [h, 1] . [w_i, b_i].

Formulas (docs/strategies.md, "uniform, unigram, bigram, exp, sampled: sampled softmax", "nce", "negative"):

- sampled softmax, exact correction with accidental hits removed: k_t = number of draws != t,
  o'_t = o_t, o'_j = o_{s_j} - ln(k_t q_{s_j} / (1 - q_t)) for the kept draws, loss = -o'_t + ln sum exp(o').
- classic correction (Bengio & Senécal; Blanc & Rendle eq. 2): o'_j = o_{s_j} - ln(m q_{s_j}), o'_t = o_t; with hit
  removal the hits are left out of the sum, without it they stay (and ``exact`` without hit removal is this too).
- the frameworks' convention (``framework_sampled_softmax``, for comparison only): the true class's logit is corrected
  as well, o'_t = o_t - ln(m q_t), and hits are removed. lmtrain's ``classic`` deliberately keeps o'_t = o_t, as its
  spec says (docs/testing.md).
- NCE: Delta_w = s_w - ln(k q_w) - ln Z, loss = softplus(-Delta_t) + sum_j softplus(Delta_{s_j}); d/d ln Z too.
- negative sampling: loss = softplus(-s_t) + sum_j softplus(s_{s_j}).
"""

from __future__ import annotations

import math

import numpy as np

Array = np.ndarray


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _softmax_over(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = sum(weights)
    return [w / total for w in weights]


def _log_sum_exp(logits: list[float]) -> float:
    top = max(logits)
    return top + math.log(sum(math.exp(v - top) for v in logits))


def sampled_softmax(s: Array, t: int, ids: Array, q: Array, correction: str, remove_hits: bool) -> tuple[float, Array]:
    """One position's sampled-softmax loss and d loss / d s (n,), for ``correction`` "exact" or "classic"."""
    m = len(ids)
    kept = [int(j) for j in ids if not (remove_hits and int(j) == t)]
    k_t = len(kept)
    entries: list[tuple[int, float]] = [(t, float(s[t]))]  # (class, corrected logit); the target first
    exact = correction == "exact" and remove_hits  # exact without hit removal is the classic correction
    for j in kept:
        shift = math.log(k_t * q[j] / (1.0 - q[t])) if exact else math.log(m * q[j])
        entries.append((j, float(s[j]) - shift))
    loss = _log_sum_exp([v for _, v in entries]) - float(s[t])
    grad = np.zeros_like(s, dtype=np.float64)
    for (cls, _), weight in zip(entries, _softmax_over([v for _, v in entries]), strict=True):
        grad[cls] += weight  # each corrected logit is its class's score plus a constant
    grad[t] -= 1.0
    return loss, grad


def framework_sampled_softmax(s: Array, t: int, ids: Array, q: Array) -> tuple[float, Array]:
    """The convention of the well-known framework implementations: subtract the log of the expected count m q from
    the true class's logit and from every sampled one, remove accidental hits, softmax cross-entropy on the true."""
    m = len(ids)
    entries = [(t, float(s[t]) - math.log(m * q[t]))]
    entries += [(int(j), float(s[j]) - math.log(m * q[j])) for j in ids if int(j) != t]
    loss = _log_sum_exp([v for _, v in entries]) - entries[0][1]
    grad = np.zeros_like(s, dtype=np.float64)
    for (cls, _), weight in zip(entries, _softmax_over([v for _, v in entries]), strict=True):
        grad[cls] += weight
    grad[t] -= 1.0
    return loss, grad


def nce(s: Array, t: int, ids: Array, q: Array, log_z: float) -> tuple[float, Array, float]:
    """One position's NCE loss, d loss / d s (n,) and d loss / d ln Z."""
    k = len(ids)
    grad = np.zeros_like(s, dtype=np.float64)
    delta_t = float(s[t]) - math.log(k * q[t]) - log_z
    loss = _softplus(-delta_t)
    grad[t] -= _sigmoid(-delta_t)  # d softplus(-x) / dx = -sigmoid(-x)
    for j in ids:
        delta = float(s[j]) - math.log(k * q[j]) - log_z
        loss += _softplus(delta)
        grad[j] += _sigmoid(delta)
    return loss, grad, -float(grad.sum())  # Delta depends on ln Z with slope -1 everywhere s does with +1


def negative_sampling(s: Array, t: int, ids: Array) -> tuple[float, Array]:
    """One position's negative-sampling loss and d loss / d s (n,)."""
    grad = np.zeros_like(s, dtype=np.float64)
    loss = _softplus(-float(s[t]))
    grad[t] -= _sigmoid(-float(s[t]))
    for j in ids:
        loss += _softplus(float(s[j]))
        grad[j] += _sigmoid(float(s[j]))
    return loss, grad


def chain(hidden: Array, weight: Array, score_grads: Array) -> tuple[Array, Array]:
    """Gradients of sum_i L_i with respect to the hidden states (N, d) and to [W, b] (n, d + 1) for scores
    s = [h, 1] . [w, b]^T, from d L_i / d s_i (N, n)."""
    query = np.concatenate([hidden, np.ones((hidden.shape[0], 1))], axis=1)  # (N, d + 1)
    grad_hidden = score_grads @ weight[:, :-1]
    grad_weight = score_grads.T @ query
    return grad_hidden, grad_weight
