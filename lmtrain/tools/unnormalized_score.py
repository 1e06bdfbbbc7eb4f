"""``python -m lmtrain.score ... normalized=false``: the unnormalized scoring pass beside the exact one.

The unnormalized pass reads the file as the exact pass does (windows of ``WINDOW``, state carried) but scores each
target by its unnormalized score s_t alone (``OutputLayer.unnormalized_log_prob``: one row gather per position, no
normalization over the vocabulary), and reports the perplexity that assumes Z = 1, exp(-mean s_t). The statistics of
ln Z come from the exact pass the tool runs anyway: ln Z_i = s_i - ln p_i at every position, so the unnormalized
pass itself never computes Z. Both passes are timed (encoder included; the output layer is where they differ),
after one untimed window of each (first-call costs: allocations, the LSTM's setup).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lmtrain.common.precision import float32_region
from lmtrain.output.self_normalize import log_z_statistics
from lmtrain.training.module import LanguageModel
from lmtrain.training.step import carry

Pass = Callable[[LanguageModel, Tensor, torch.device, int], Tensor]


@dataclass(frozen=True)
class Unnormalized:
    """The unnormalized pass over a file: Σ s_t over ``tokens`` targets, the mean and sd of ln Z (from the exact
    pass) and the seconds of each pass."""

    score: float
    tokens: int
    log_z_mean: float
    log_z_sd: float
    seconds: float
    exact_seconds: float

    @property
    def ppl(self) -> float:
        """exp(-mean s_t): the perplexity if every Z were 1."""
        return math.exp(-self.score / self.tokens)


@torch.no_grad()
def stream_scores(module: LanguageModel, stream: Tensor, device: torch.device, window: int) -> Tensor:
    """s_t of stream[1:] (float64, (L - 1,)), each given everything before it: windows with carried state, as
    ``stream_log_probs``, with the output's unnormalized score in place of its exact log-probability."""
    parts, state = [], None
    for start in range(0, stream.numel() - 1, window):
        targets = stream[start + 1 : start + window + 1]
        inputs = stream[start : start + targets.numel()]
        with float32_region():  # as window_log_prob: the float32 evaluation of the weights
            hidden, state = carry(module.encoder, inputs[None].to(device), state)  # (T, d)
            parts.append(module.output.unnormalized_log_prob(hidden, targets.to(device)).double().cpu())  # (T,)
    return torch.cat(parts)


def timed(run: Pass, module: LanguageModel, stream: Tensor, device: torch.device, window: int) -> tuple[Tensor, float]:
    """``run``'s result over the stream and its seconds; the device is idle at both ends (each window's result is
    read back on the host)."""
    start = time.perf_counter()
    result = run(module, stream, device, window)
    return result, time.perf_counter() - start


def unnormalized_score(
    module: LanguageModel, stream: Tensor, device: torch.device, window: int, exact: Pass
) -> tuple[Unnormalized, Tensor]:
    """The unnormalized pass and ``exact``, the tool's exact pass, over ``stream``: (the unnormalized totals, the
    exact ln p (L - 1,)). A strategy without an unnormalized score stops at once with its one-line ValueError."""
    head = stream[: window + 1]
    stream_scores(module, head, device, window)  # untimed first calls; refuses a strategy without s_t
    exact(module, head, device, window)
    log_p, exact_seconds = timed(exact, module, stream, device, window)
    score, seconds = timed(stream_scores, module, stream, device, window)
    mean, sd = log_z_statistics(score - log_p)  # ln Z_i = s_i - ln p_i
    totals = Unnormalized(float(score.sum()), score.numel(), mean, sd, seconds, exact_seconds)
    return totals, log_p


def normalized_flag(value: str) -> bool:
    """``normalized=true|false`` (the score tool's key) as a bool; anything else is a one-line ValueError."""
    flags = {"true": True, "false": False}
    if value.lower() not in flags:
        raise ValueError(f"normalized must be true or false, got {value!r}")
    return flags[value.lower()]


def report(result: Unnormalized) -> str:
    """The lines ``python -m lmtrain.score ... normalized=false`` prints after the exact totals."""
    return (
        f"unnormalized (Z = 1): perplexity {result.ppl:.3f}, {-result.score / result.tokens:.4f} nats/token; "
        f"ln Z over the file: mean {result.log_z_mean:.4f}, sd {result.log_z_sd:.4f} (ln Z = s - ln p, exact pass)\n"
        f"seconds: unnormalized {result.seconds:.3f}, exact {result.exact_seconds:.3f} "
        f"({result.exact_seconds / max(result.seconds, 1e-9):.2f}x)"
    )
