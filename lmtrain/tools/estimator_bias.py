"""How far a proposal is from the model's softmax, and how biased the sampled-softmax gradient it gives is.

For held-out positions with hidden states h (N, d), targets t (N,) and a softmax model p = softmax(o), o = the
output layer's logits over all n classes:

- ``proposal_kl``: KL(p || q) per position, from the exact log q of every class.
- ``gradient_bias``: the relative bias || E[g'] - g || / || g || of the sampled-softmax gradient g' with respect
  to the logits o (the estimator training uses, differentiated by autograd) against the exact g = p - e_t,
  estimated from R independent draws per position (the quantity Rawat et al. 2019, Theorem 1, bound): as a
  root mean square over the positions (each position counts alike) and pooled, sqrt(sum of squared biases /
  sum of || g ||^2), which weights positions by their gradient size (confident positions have tiny g).

The plug-in || mean of g' - g || is biased upward by Monte Carlo noise (E || X_bar ||^2 = || mu ||^2 +
tr Cov / R), so each position's squared bias is estimated without that term, || X_bar ||^2 - tr Cov_hat / R,
and these unbiased squares are averaged over positions before the square root. The standard error comes from a
delete-one-group jackknife over groups of draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmtrain.output.sampled import SampledSoftmax
from lmtrain.output.sampled.estimators import joint_softmax_nll


@dataclass(frozen=True)
class BiasEstimate:
    """The relative gradient bias over the positions, two ways, with Monte Carlo standard errors and noise level."""

    bias: float  # root mean square over positions of || E[g'] - g || / || g ||: every position counts alike
    standard_error: float  # of ``bias``: jackknife over groups of draws
    pooled_bias: float  # sqrt(sum || E[g'] - g ||^2 / sum || g ||^2): positions weighted by their gradient size
    pooled_standard_error: float
    noise: float  # RMS over positions of sqrt(tr Cov(g') / R) / || g ||: the size of the MC error of the mean
    draws: int


def hidden_spread(hidden: Tensor) -> dict[str, float]:
    """How much the held-out hidden states (N, d) differ: their mean pairwise cosine (1 when all point the same way)
    and the mean over units of their standard deviation across positions (0 when the LSTM ignores its input, as a
    saturated one does). A model whose hidden state is the same everywhere predicts one distribution everywhere."""
    unit = torch.nn.functional.normalize(hidden, dim=1)
    cosine = unit @ unit.T  # (N, N)
    count = hidden.shape[0]
    pairwise = (cosine.sum() - cosine.diagonal().sum()) / max(count * (count - 1), 1)
    return {"mean_pairwise_cosine": float(pairwise), "unit_std": float(hidden.std(0).mean())}


def proposal_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) in nats per position from log p and log q over all classes, (N, n) each -> (N,)."""
    return (log_p.exp() * (log_p - log_q)).sum(1)


def all_logits(output: SampledSoftmax, hidden: Tensor) -> Tensor:
    """The model's logits over every class, (N, n): softmax of these is p."""
    return output.score(output.query(hidden), output.weight)


def sampled_logit_gradient(
    output: SampledSoftmax, hidden: Tensor, target: Tensor, logits: Tensor, inputs: Tensor | None = None
) -> Tensor:
    """One draw of the sampled-softmax estimator's gradient with respect to all logits, (N, n) (zero off the
    target and the drawn ids): ``draw`` and ``offsets`` exactly as in training (``inputs`` (N,): the input
    tokens of the positions), with the logits of the target and of the drawn ids read from ``logits``."""
    o = logits.detach().requires_grad_()
    proposal = output.propose(output.query(hidden), inputs, target)  # the step's proposal
    d = output.draw(proposal)  # ids (m,) shared or (N, m) per example
    neg_logits = o[:, d.ids] if d.ids.dim() == 1 else o.gather(1, d.ids)  # (N, m)
    scores = torch.cat([o.gather(1, target.unsqueeze(1)), neg_logits], dim=1)  # (N, 1 + m)
    loss = joint_softmax_nll(scores, output.offsets(target, d.ids, d.log_q, d.target_log_q, d.tries))
    (grad,) = torch.autograd.grad(loss.sum(), o)
    return grad


def exact_logit_gradient(logits: Tensor, target: Tensor) -> Tensor:
    """Gradient of -log softmax(o)_t with respect to o: p - e_t, (N, n)."""
    grad = torch.softmax(logits, dim=1)
    grad[torch.arange(target.numel()), target] -= 1.0
    return grad


def _relative_bias(sums: Tensor, squares: Tensor, draws: int, exact_sq: Tensor) -> Tensor:
    """From sums over R draws of X = g' - g (N, n) and of || X ||^2 (N,): [RMS relative bias, pooled relative
    bias, RMS relative MC error of the mean]. Each position's squared bias is estimated without bias and the
    squares are summed over positions before the square root, so Monte Carlo noise averages out."""
    mean = sums / draws  # (N, n)
    mean_sq = (mean * mean).sum(1)  # (N,) || X_bar ||^2
    trace_cov = (squares - draws * mean_sq) / (draws - 1)  # (N,) unbiased tr Cov(X)
    bias_sq = mean_sq - trace_cov / draws  # (N,) unbiased || E X ||^2
    rms = (bias_sq / exact_sq).mean()
    pooled = bias_sq.sum() / exact_sq.sum()
    noise = (trace_cov / draws / exact_sq).mean()
    return torch.stack([rms, pooled, noise]).clamp(min=0).sqrt()


@torch.no_grad()
def gradient_bias(
    output: SampledSoftmax,
    hidden: Tensor,
    target: Tensor,
    draws: int = 200,
    groups: int = 10,
    inputs: Tensor | None = None,
) -> BiasEstimate:
    """Monte Carlo estimate of the relative bias of ``output``'s sampled-softmax gradient at these positions
    (``inputs`` (N,): their input tokens, for proposals conditioned on them)."""
    if draws < 2 * groups or groups < 2:
        raise ValueError(f"diagnose needs groups >= 2 and draws >= 2 * groups, got draws={draws}, groups={groups}")
    logits = all_logits(output, hidden)  # (N, n)
    exact = exact_logit_gradient(logits, target).double()
    exact_sq = (exact * exact).sum(1)  # (N,) > 0: p can never equal e_t exactly
    sums = exact.new_zeros(groups, *exact.shape)  # (G, N, n) per-group sums of X = g' - g
    squares = exact.new_zeros(groups, exact.shape[0])  # (G, N) per-group sums of || X ||^2
    counts = [0] * groups
    for r in range(draws):
        with torch.enable_grad():
            x = sampled_logit_gradient(output, hidden, target, logits, inputs).double() - exact
        sums[r % groups] += x
        squares[r % groups] += (x * x).sum(1)
        counts[r % groups] += 1
    total, total_sq = sums.sum(0), squares.sum(0)
    estimate = _relative_bias(total, total_sq, draws, exact_sq)  # (3,)
    leave_one_out = torch.stack(
        [_relative_bias(total - sums[g], total_sq - squares[g], draws - counts[g], exact_sq) for g in range(groups)]
    )  # (G, 3)
    spread = ((leave_one_out - leave_one_out.mean(0)) ** 2).sum(0)  # (3,)
    error = ((groups - 1) / groups * spread).sqrt()
    return BiasEstimate(
        bias=float(estimate[0]),
        standard_error=float(error[0]),
        pooled_bias=float(estimate[1]),
        pooled_standard_error=float(error[1]),
        noise=float(estimate[2]),
        draws=draws,
    )
