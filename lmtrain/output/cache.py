"""The neural cache pointer (Grave et al. 2017, the continuous cache AWD-LSTM evaluates with): an evaluation-time
addition to every output strategy.

    p(w) = (1 - λ) p_model(w) + λ p_cache(w),   p_cache(w) = Σ_{i held, y_i = w} softmax_i(θ h_t · h_i)

over the last ``window`` positions i of the stream, where h is the hidden state the output layer reads and y_i the
word that followed position i. Only the target's p_model (the strategy's exact ``log_prob``) and the cache's mass
on the target are needed, so log p = logaddexp(log(1 - λ) + log p_model, log λ + log p_cache(target)); a target
the cache does not hold has log p_cache = -inf. The cache is a ring buffer of the hidden states (window, d), their
next words (window,) and stream positions (window,): nothing grows with the vocabulary.

Warm-up (``warmup``): ``full`` mixes only once ``window`` positions are held (the reference switches the cache on
after ``window`` tokens), ``partial`` from the second position on, with the positions held so far.
θ and λ left out (null) are chosen on the validation split, the pair of ``THETAS`` x ``LAMBDAS`` with the lowest
perplexity: the mixture does not change what the model computes, so one pass over the split gives every pair.

``python -m lmtrain.score ... cache=true`` applies it (``lmtrain.tools.score_extras``); a training run's test too
with ``eval.cache.test=true``. The run config's ``eval.cache`` holds a preset's values (conf/experiment/awd_lstm_*).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lmtrain.common.ranges import AT_LEAST_1, Checked, Choice

THETAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # θ searched on the validation split
LAMBDAS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)  # λ searched on the validation split
SEGMENT = 256  # positions per forward pass of the cache's own passes (bounds the (T, window + T) scores)

# (inputs, targets) (1, T), carried state -> exact log p_model (T,), hidden states (T, d), the state to carry on
Scorer = Callable[[tuple[Tensor, Tensor], Any], tuple[Tensor, Tensor, Any]]


class Warmup(Choice):
    """Before ``window`` positions are held: ``full`` leaves the model alone (the reference), ``partial`` mixes in
    the cache of the positions held so far."""

    full = "full"
    partial = "partial"


@dataclass
class CacheOptions(Checked):
    """The neural cache's keys (``eval.cache`` of a run config, ``cache.KEY`` of ``python -m lmtrain.score``)."""

    test: bool = False  # a training run's test also with the cache (test/ppl_cache in run.json)
    window: int = field(default=500, metadata=AT_LEAST_1)  # positions held
    theta: float | None = field(default=None, metadata={"at_least": 0})  # None: searched on the validation split
    lam: float | None = field(default=None, metadata={"at_least": 0, "below": 1})  # λ; None: searched
    warmup: Warmup = Warmup.partial


@dataclass
class Setting:
    """The θ and λ a cache evaluates with, and whether each was searched (with the validation perplexity then)."""

    theta: float
    lam: float
    searched: tuple[str, ...] = ()
    val_ppl: float | None = None  # the validation perplexity of the search's best pair
    test_ppl: float | None = None  # ``cached_test``'s result


class NeuralCache:
    """The last ``window`` positions of a stream: hidden states (window, d), next words (window,) and positions
    (window,; -1: empty) in a ring buffer. ``read`` returns the cache's log mass on each target and appends the
    positions read."""

    def __init__(self, window: int, dim: int, device: torch.device | None = None, dtype: torch.dtype | None = None):
        self.window, self.seen = window, 0  # seen: positions read so far
        self.hidden = torch.zeros(window, dim, device=device, dtype=dtype)  # (W, d)
        self.ids = torch.zeros(window, dtype=torch.long, device=device)  # (W,) the word after each position
        self.position = torch.full((window,), -1, dtype=torch.long, device=device)  # (W,)

    @torch.no_grad()
    def read(self, hidden: Tensor, targets: Tensor, thetas: Sequence[float]) -> tuple[Tensor, Tensor]:
        """For the next T positions of the stream, hidden (T, d) and targets (T,): log p_cache(target) for each θ
        (K, T) float64 (-inf where the cache holds no such word, or nothing) and the positions each saw (T,)."""
        hidden, targets = hidden.detach(), targets.reshape(-1)
        here = self.seen + torch.arange(targets.numel(), device=targets.device)  # (T,) stream positions
        keys = torch.cat([self.hidden, hidden.to(self.hidden.dtype)])  # (W + T, d): held, then this chunk's
        key_ids, key_pos = torch.cat([self.ids, targets]), torch.cat([self.position, here])  # (W + T,)
        # position t reads the positions i with t - W <= i < t (a chunk's own earlier positions included)
        seen = (key_pos[None] >= 0) & (key_pos[None] < here[:, None]) & (key_pos[None] >= here[:, None] - self.window)
        held = seen.sum(1)  # (T,)
        dots = (hidden.to(keys.dtype) @ keys.T).float()  # (T, W + T): h_t · h_i
        hit = seen & (key_ids[None] == targets[:, None])  # (T, W + T): held positions followed by the target
        out = []
        for theta in thetas:  # a handful of grid values
            logits = theta * dots  # (T, W + T)
            on_target = logits.masked_fill(~hit, -math.inf).logsumexp(1)  # (T,)
            log_mass = on_target - logits.masked_fill(~seen, -math.inf).logsumexp(1)  # (T,)
            out.append(torch.where(held > 0, log_mass, -math.inf).double())  # an empty cache's nan -> -inf
        self.push(hidden, targets, here)
        return torch.stack(out), held

    def push(self, hidden: Tensor, targets: Tensor, here: Tensor) -> None:
        """Write positions ``here`` (T,) into their slots (position mod window); only the last window matter."""
        keep = min(targets.numel(), self.window)
        slots = here[-keep:] % self.window  # (keep,)
        self.hidden.index_copy_(0, slots, hidden[-keep:].to(self.hidden.dtype))
        self.ids.index_copy_(0, slots, targets[-keep:])
        self.position.index_copy_(0, slots, here[-keep:])
        self.seen += targets.numel()


def mixes(held: Tensor, window: int, warmup: Warmup | str) -> Tensor:
    """Where the mixture applies (bool, like ``held``): a full window (``full``) or any position held."""
    return held >= window if warmup == Warmup.full else held > 0


def mix(log_p: Tensor, log_mass: Tensor, lam: float, on: Tensor) -> Tensor:
    """log((1 - λ) p_model + λ p_cache) of the targets where ``on``, log p_model elsewhere (all (L,))."""
    if lam == 0:
        return log_p.double()
    mixed = torch.logaddexp(log_p.double() + math.log1p(-lam), log_mass + math.log(lam))
    return torch.where(on, mixed, log_p.double())


def ppl(log_p: Tensor) -> float:
    """exp of the mean negative log-probability (inf past float64's range)."""
    return float(log_p.double().mean().neg().exp())


def grid(options: CacheOptions) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The θ and λ to try: the given value, else the search grid."""
    thetas = THETAS if options.theta is None else (options.theta,)
    return thetas, LAMBDAS if options.lam is None else (options.lam,)


def choose(log_p: Tensor, log_mass: Tensor, held: Tensor, options: CacheOptions) -> Setting:
    """The (θ, λ) of the grid (``grid``; ``log_mass`` has a row per θ) with the lowest perplexity of the stream."""
    thetas, lams = grid(options)
    on = mixes(held, options.window, options.warmup)
    tried = [(ppl(mix(log_p, log_mass[k], lam, on)), theta, lam) for k, theta in enumerate(thetas) for lam in lams]
    best, theta, lam = min(tried)
    searched = tuple(name for name, value in (("theta", options.theta), ("lambda", options.lam)) if value is None)
    return Setting(theta, lam, searched, best)


def read_stream(
    score: Scorer,
    stream: Tensor,
    window: int,
    thetas: Sequence[float],
    device: torch.device,
    segment: int = SEGMENT,
    progress: Callable[[int], None] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Score ``stream`` (L,) in segments with the state carried (``score``, e.g. ``window_log_prob``) and read each
    segment through a cache: log p_model of stream[1:] (L - 1,), the cache's log mass per θ (K, L - 1) and the
    positions each saw (L - 1,); no θ: no cache. ``progress`` gets the positions done."""
    # The results go into tensors allocated once: small tensors kept per segment would sit between the big buffers
    # each step frees (dynamic evaluation's dense gradients), so glibc could not reuse those and the heap would grow.
    total = stream.numel() - 1
    log_p_all = torch.empty(total, dtype=torch.float64)  # (L - 1,)
    log_mass_all = torch.empty(len(thetas), total, dtype=torch.float64)  # (K, L - 1)
    held_all = torch.zeros(total, dtype=torch.long)  # (L - 1,)
    cache, state = None, None
    for start in range(0, total, segment):
        targets = stream[start + 1 : start + segment + 1].to(device)
        inputs = stream[start : start + targets.numel()].to(device)
        log_p, hidden, state = score((inputs[None], targets[None]), state)
        end = start + targets.numel()
        log_p_all[start:end] = log_p.detach()
        if cache is None and thetas:
            cache = NeuralCache(window, hidden.shape[-1], hidden.device, hidden.dtype)
        if cache is not None:
            log_mass, held = cache.read(hidden, targets, thetas)  # (K, T), (T,)
            log_mass_all[:, start:end], held_all[start:end] = log_mass, held
        if progress is not None:
            progress(end)
    return log_p_all, log_mass_all, held_all


def cached_test(score: Scorer, valid: Tensor, test: Tensor, options: CacheOptions, device: torch.device) -> Setting:
    """The test stream's perplexity with the cache (``Setting.val_ppl`` from the search, if any; the return's
    ``test_ppl``), θ and λ searched on ``valid`` where the options leave them out: a training run's test."""
    thetas, _ = grid(options)
    setting = Setting(thetas[0], options.lam or 0.0)
    if options.theta is None or options.lam is None:
        setting = choose(*read_stream(score, valid, options.window, thetas, device), options)
    log_p, log_mass, held = read_stream(score, test, options.window, (setting.theta,), device)
    setting.test_ppl = ppl(mix(log_p, log_mass[0], setting.lam, mixes(held, options.window, options.warmup)))
    return setting
