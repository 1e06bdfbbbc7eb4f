"""Seeded Zipf-Markov source: synthetic text whose entropy rate (best possible loss) is known exactly.

The source is an order-1 Markov chain over ``vocab_size`` tokens. Row ``i`` of its transition
matrix (the next-token distribution after token ``i``) is

    P_i = (1 - mix) * Zipf(s) laid over a token-specific random permutation + mix * Zipf(s) over ids,

so every context has its own sharp distribution, and the shared global Zipf part gives the
marginal a clear frequency order. The entropy rate is H = sum_i pi_i H(P_i) with pi the stationary
distribution, so no model can beat perplexity exp(H) on an infinite sample.

Sampling a Markov chain is sequential; the stream is laid out as independent stationary chains of
``chain_length`` tokens placed end to end, and the sampler steps all chains at once (one vectorized
step per position of a chain). At the ~length/chain_length junctions the next token follows pi
instead of P_i, which moves the best achievable loss by well under 0.01 nats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lmtrain.common.ranges import Checked
from lmtrain.data.corpus import Corpus
from lmtrain.data.errors import DataError


def zipf_probs(n: int, s: float) -> Tensor:
    """Zipf(s) over ranks 1..n as float64 probabilities, (n,)."""
    weights = torch.arange(1, n + 1, dtype=torch.float64).pow(-s)
    return weights / weights.sum()


def stationary_distribution(transition: Tensor) -> Tensor:
    """Stationary distribution pi (pi P = pi, sum pi = 1) of an irreducible chain, by one linear solve."""
    n = transition.shape[0]
    system = transition.T - torch.eye(n, dtype=transition.dtype)  # (n, n): (P^T - I) pi = 0
    system[-1] = 1.0  # replace one redundant equation by sum(pi) = 1
    rhs = torch.zeros(n, dtype=transition.dtype)
    rhs[-1] = 1.0
    pi = torch.linalg.solve(system, rhs).clamp_min(0.0)
    return pi / pi.sum()


class ZipfMarkovSource:
    """Order-1 Zipf-Markov chain with its exact entropy rate; fully determined by ``seed``.

    Attributes: ``transition`` (V, V) float64 rows P_i, ``stationary`` (V,) pi, ``entropy_rate``
    (nats/token).
    """

    def __init__(self, vocab_size: int, **options: Any) -> None:
        opts = SyntheticOptions(vocab_size=vocab_size, **options)  # zipf_s, mix, seed: the ones left out, defaults
        zipf_s, mix, seed = opts.zipf_s, opts.mix, opts.seed
        if vocab_size < 2:
            raise DataError(f"synthetic vocab_size is {vocab_size}: set data.vocab_size to at least 2.")
        if zipf_s <= 0:
            raise DataError(f"synthetic zipf_s is {zipf_s}: set data.zipf_s to a positive exponent.")
        if not 0.0 < mix <= 1.0:
            raise DataError(f"synthetic mix is {mix}: set data.mix in (0, 1] (weight of the global Zipf).")
        self.vocab_size = self.num_classes = vocab_size
        gen = torch.Generator().manual_seed(seed)
        base = zipf_probs(vocab_size, zipf_s)  # (V,) probability of rank r
        perms = torch.rand(vocab_size, vocab_size, generator=gen).argsort(dim=1)  # (V, V): row i's ranking
        local = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
        local.scatter_(1, perms, base.expand(vocab_size, -1).contiguous())  # local[i, perms[i, r]] = base[r]
        self.transition = (1.0 - mix) * local + mix * base  # (V, V), rows sum to 1
        self.stationary = stationary_distribution(self.transition)
        row_entropy = -(self.transition * self.transition.log()).sum(1)  # (V,) H(P_i); all P > 0
        self.entropy_rate = float((self.stationary * row_entropy).sum())

    def sample(self, length: int, generator: torch.Generator, chain_length: int = 1000) -> Tensor:
        """A stream of ``length`` token ids (int64): independent stationary chains placed end to end."""
        num_chains = max(1, math.ceil(length / chain_length))
        steps = math.ceil(length / num_chains)
        v = self.vocab_size
        # row i of the CDF shifted by i, flattened: one increasing array, so a single 1-D searchsorted
        # of i + u inverts row i (right=True: the first entry strictly above u; zero-mass ids never hit)
        cdf = self.transition.cumsum(1)  # (V, V)
        cdf[:, -1] = 1.0
        flat = (cdf + torch.arange(v, dtype=torch.float64).unsqueeze(1)).reshape(-1)  # (V*V,)
        start_cdf = self.stationary.cumsum(0)  # (V,)
        start_cdf[-1] = 1.0
        uniforms = torch.rand(steps, num_chains, generator=generator, dtype=torch.float64)
        state = torch.searchsorted(start_cdf, uniforms[0], right=True).clamp_max(v - 1)  # (C,) ~ pi
        out = torch.empty(steps, num_chains, dtype=torch.int64)
        out[0] = state
        for t in range(1, steps):  # sequential by nature; vectorized over the C chains
            state = torch.searchsorted(flat, state + uniforms[t], right=True) - state * v  # (C,)
            out[t] = state
        return out.T.reshape(-1)[:length]  # chain after chain


def frequency_order(train: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(remap, counts): remap[old id] = rank by descending train count (ties: lower old id first)."""
    counts = torch.bincount(train, minlength=num_classes)  # (n,)
    order = torch.sort(counts, descending=True, stable=True).indices  # (n,) old ids, most frequent first
    remap = torch.empty_like(order)
    remap[order] = torch.arange(num_classes)
    return remap, counts[order]


@dataclass
class GeneratedSplits(Checked):
    """The token counts of a generated corpus's train/valid/test streams, and the seed of its source and draws."""

    train_tokens: int = 200_000
    valid_tokens: int = 20_000
    test_tokens: int = 20_000
    seed: int = 0  # the source and the three streams; independent of the training seed


@dataclass
class SyntheticOptions(GeneratedSplits):
    """``data=synthetic``: the Zipf-Markov source over ``vocab_size`` tokens (``zipf_s``, ``mix``) and its splits."""

    vocab_size: int = 100
    zipf_s: float = 1.0  # Zipf exponent of every next-token distribution
    mix: float = 0.3  # weight of the global Zipf (shared by all contexts) in each next-token distribution


def generated_corpus(name: str, source: Any, splits: GeneratedSplits) -> Corpus:
    """Train/valid/test streams of ``splits`` tokens sampled from ``source`` (seeded per split), ids remapped to
    train-frequency order and named ``w0, w1, ...``; the source's exact ``entropy_rate`` comes along."""
    sizes = {
        "train_tokens": splits.train_tokens,
        "valid_tokens": splits.valid_tokens,
        "test_tokens": splits.test_tokens,
    }
    for key, value in sizes.items():
        if value < 2:
            raise DataError(f"{name} {key} is {value}: set data.{key} to at least 2.")
    splits_ids = [
        source.sample(length, torch.Generator().manual_seed(splits.seed + 1_000_003 * (k + 1)))
        for k, length in enumerate(sizes.values())
    ]
    num_classes = source.num_classes
    remap, counts = frequency_order(splits_ids[0], num_classes)
    train, valid, test = (remap[ids] for ids in splits_ids)
    vocab = [f"w{i}" for i in range(num_classes)]
    return Corpus(name, vocab, counts, train, valid, test, entropy_rate=source.entropy_rate)


def synthetic_corpus(options: SyntheticOptions) -> Corpus:
    """Sample train/valid/test from a seeded ZipfMarkovSource, ids remapped to train-frequency order.

    Tokens are named ``w0, w1, ...`` by frequency rank; there is no ``<eos>`` (the source has no lines).
    """
    source = ZipfMarkovSource(options.vocab_size, zipf_s=options.zipf_s, mix=options.mix, seed=options.seed)
    return generated_corpus("synthetic", source, options)
