"""Large-vocabulary synthetic text: a Markov source with an exactly Zipfian marginal and an exact entropy rate.

The n types have the Zipf(s) marginal pi (rank r has probability ∝ (r + 1)^-s). Two random layouts cut [0, 1)
into intervals of length pi_i, one per type: the input layout A (types in a random order) and the output
layout B (type j cut into ceil(n pi_j) equal pieces, all pieces in a random order). [0, 1) is also cut into
K = n / topic_size equal topics R_k = [k / K, (k + 1) / K). After token i the next token is drawn as

    with probability mix:      y ~ U[0, 1)                                  (the global Zipf: j ~ pi)
    otherwise:                 x ~ U(A_i), k = topic of x, y ~ U(R_k)       (token i's topic)
    next token j = the type whose B interval holds y.

So P(j | i) = mix pi_j + (1 - mix) T_ij with T_ij = sum_k (|A_i ∩ R_k| / pi_i) K |R_k ∩ B_j|: a rare token has
one topic (a small random set of about topic_size types, mostly rare ones, plus the frequent types scattered
over every topic), a frequent token a mixture of many. pi is stationary exactly: the A intervals tile every
topic, so sum_i pi_i T_ij = sum_k |R_k ∩ B_j| = pi_j. A draw with probability mix forgets the past, so a
stream is generated exactly, with no burn-in and no joins: the first token and every "mix" token start a new
segment ~ pi, and all segments advance together, one vectorized step per position within a segment.

The entropy rate H = sum_i pi_i H(P(. | i)) is computed by exact summation: every row of T is a sparse vector
(types in the distinct topic rows, plus one row per type whose A interval crosses a topic boundary), O(n)
entries in all, and the part mix pi_j off T's support enters in closed form through sum_j pi_j log pi_j.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lmtrain.data.corpus import Corpus
from lmtrain.data.errors import DataError
from lmtrain.data.synthetic import GeneratedSplits, generated_corpus, zipf_probs


def overlaps(ends_a: Tensor, ends_b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Two partitions of [0, 1) into intervals given by their sorted right ends (float64, last = 1): the pieces
    of their common refinement as (interval of a, interval of b, length), each (p,) with p <= |a| + |b|."""
    cuts = torch.unique(torch.cat([ends_a, ends_b]))  # (c,) sorted
    lengths = torch.diff(cuts, prepend=cuts.new_zeros(1))
    keep = lengths > 0
    mid = (cuts - lengths / 2)[keep]
    a = torch.searchsorted(ends_a, mid, right=True).clamp_(max=ends_a.numel() - 1)
    b = torch.searchsorted(ends_b, mid, right=True).clamp_(max=ends_b.numel() - 1)
    return a, b, lengths[keep]


def sum_by_key(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Distinct keys (sorted) and the sum of the values of each."""
    distinct, inverse = torch.unique(keys, return_inverse=True)
    return distinct, values.new_zeros(distinct.numel()).index_add_(0, inverse, values)


class ZipfTopicSource:
    """The seeded source described in the module docstring; O(n) memory, nothing n x n.

    Attributes: ``probs`` (n,) the Zipf marginal pi by rank, also the stationary distribution; ``num_topics`` K;
    ``entropy_rate`` in nats/token, exact (float64 summation over O(n) terms), so exp(entropy_rate) is the best
    perplexity any model can reach on the source.
    """

    def __init__(self, num_classes: int, **options: Any) -> None:
        opts = ZipfTopicOptions(vocab_size=num_classes, **options)  # zipf_s, topic_size, mix, seed, else the defaults
        zipf_s, topic_size, mix, seed = opts.zipf_s, opts.topic_size, opts.mix, opts.seed
        if not 2 <= num_classes < 2**31:
            raise DataError(f"zipf num_classes is {num_classes}: set data.num_classes to at least 2.")
        if not zipf_s > 0:
            raise DataError(f"zipf zipf_s is {zipf_s}: set data.zipf_s to a positive exponent.")
        if not 1 <= topic_size <= num_classes:
            raise DataError(f"zipf topic_size is {topic_size}: set data.topic_size in [1, num_classes].")
        if not 0.0 < mix <= 1.0:
            raise DataError(f"zipf mix is {mix}: set data.mix in (0, 1] (the weight of the global Zipf).")
        n = self.num_classes = num_classes
        self.mix, self.num_topics = float(mix), max(1, round(num_classes / topic_size))
        self.probs = zipf_probs(n, zipf_s)  # (n,) float64
        gen = torch.Generator().manual_seed(seed)
        self.in_order = torch.randperm(n, generator=gen)  # (n,) the types in layout A's order
        in_ends = self.probs[self.in_order].cumsum(0)
        self.in_ends = in_ends / in_ends[-1]  # (n,) right ends in layout A
        self.in_start = torch.empty(n, dtype=torch.float64)
        self.in_start[self.in_order] = self.in_ends - self.probs[self.in_order]  # (n,) A_i = [start, start + pi_i)
        pieces = torch.ceil(self.probs * n).long()  # (n,) pieces per type in layout B: each at most 1 / n long
        token = torch.repeat_interleave(torch.arange(n), pieces)  # (P,), P <= 2n
        self.piece_token = token[torch.randperm(token.numel(), generator=gen)]  # (P,) layout B, in order
        out_ends = (self.probs / pieces)[self.piece_token].cumsum(0)
        self.piece_ends = out_ends / out_ends[-1]  # (P,) right ends in layout B
        self.entropy_rate = self._entropy_rate()

    # --- sampling -------------------------------------------------------------------------------
    def sample(self, length: int, generator: torch.Generator) -> Tensor:
        """A stationary stream of ``length`` token ids (int64 ranks), exactly from the chain."""
        restart = torch.rand(length, generator=generator, dtype=torch.float64) < self.mix  # (T,) j ~ pi here
        restart[0] = True
        u_in = torch.rand(length, generator=generator, dtype=torch.float64)  # (T,) x within A_prev
        u_out = torch.rand(length, generator=generator, dtype=torch.float64)  # (T,) y within the topic, or in [0, 1)
        step = torch.arange(length)
        depth = step - torch.cummax(torch.where(restart, step, 0), 0).values  # (T,) position within its segment
        order = torch.argsort(depth, stable=True)  # positions grouped by depth
        out = torch.empty(length, dtype=torch.int64)
        lo = 0
        for level, count in enumerate(torch.bincount(depth).tolist()):  # ~ln(T) / mix levels, each vectorized
            where, lo = order[lo : lo + count], lo + count
            y = u_out[where]
            if level > 0:
                prev = out[where - 1]  # set at the previous level
                x = self.in_start[prev] + u_in[where] * self.probs[prev]
                topic = (x * self.num_topics).floor().clamp_(max=self.num_topics - 1)
                y = (topic + y) / self.num_topics  # uniform in the topic of x
            piece = torch.searchsorted(self.piece_ends, y, right=True).clamp_(max=self.piece_ends.numel() - 1)
            out[where] = self.piece_token[piece]
        return out

    # --- the exact transition probabilities -----------------------------------------------------
    def transition_table(self) -> tuple[Tensor, Tensor, Tensor]:
        """The (1 - mix) part T of the transition matrix, sparse: (row_of (n,), keys (E,), values (E,)).

        Row r < K is topic r's distribution K |R_r ∩ B_j|, the row of every type whose A interval lies in topic
        r; rows K, K + 1, ... belong to the types whose A interval crosses topic boundaries. ``keys`` = r n + j
        sorted, ``values`` = T_rj > 0; E = O(n) (at most ~2n + K entries for the topics, plus those of the
        boundary-crossing types, about 2n times their total probability plus 4n)."""
        n, k = self.num_classes, self.num_topics
        topic_ends = torch.arange(1, k + 1, dtype=torch.float64) / k
        topic, piece, length = overlaps(topic_ends, self.piece_ends)
        topic_keys, topic_values = sum_by_key(topic * n + self.piece_token[piece], length * k)  # (E_t,) each
        row_start = torch.searchsorted(topic_keys, torch.arange(k + 1) * n)  # (K + 1,) topic r's entries

        topic, slot, length = overlaps(topic_ends, self.in_ends)  # pieces of the A intervals, in layout order
        token = self.in_order[slot]
        crossing = torch.bincount(slot, minlength=n) > 1  # (n,) by layout slot
        row_of = torch.empty(n, dtype=torch.int64)
        row_of[token] = topic  # right for the types inside one topic; crossing types are overwritten below
        cross_slots = crossing.nonzero().squeeze(1)  # (S,) in layout order
        row_of[self.in_order[cross_slots]] = k + torch.arange(cross_slots.numel())
        part = crossing[slot]  # (g,) the pieces of crossing types
        row, topic, weight = row_of[token[part]], topic[part], length[part] / self.probs[token[part]]
        counts = row_start[topic + 1] - row_start[topic]  # (g,) entries of each piece's topic row
        entry = torch.repeat_interleave(row_start[topic] - (counts.cumsum(0) - counts), counts) + torch.arange(
            int(counts.sum())
        )  # (G,) index into the topic table
        owner = torch.repeat_interleave(torch.arange(row.numel()), counts)  # (G,) piece of each entry
        cross_keys, cross_values = sum_by_key(
            row[owner] * n + topic_keys[entry] % n, weight[owner] * topic_values[entry]
        )
        return row_of, torch.cat([topic_keys, cross_keys]), torch.cat([topic_values, cross_values])

    def _entropy_rate(self) -> float:
        n, mix = self.num_classes, self.mix
        row_of, keys, values = self.transition_table()
        rows, token = keys // n, keys % n
        pi = self.probs[token]  # (E,)
        p = mix * pi + (1 - mix) * values  # (E,) P(j | row) on T's support
        num_rows = int(max(row_of.max(), rows.max())) + 1

        def per_row(x: Tensor) -> Tensor:
            return torch.zeros(num_rows, dtype=torch.float64).index_add_(0, rows, x)

        total = float((self.probs * self.probs.log()).sum())  # S = sum_j pi_j log pi_j
        # off T's support P = mix pi_j: -sum mix pi log(mix pi) = -mix log(mix) (1 - pi(supp)) - mix (S - S_supp)
        off_support = -mix * math.log(mix) * (1 - per_row(pi)) - mix * (total - per_row(pi * pi.log()))  # (R,)
        entropy = -per_row(p * p.log()) + off_support  # (R,) H(P(. | row))
        row_mass = torch.zeros(num_rows, dtype=torch.float64).index_add_(0, row_of, self.probs)  # (R,) pi of each row
        return float((row_mass * entropy).sum())

    def log_prob(self, prev: Tensor, token: Tensor) -> Tensor:
        """Exact log P(token | prev) for id pairs of one shape (ranks, not frequency-ordered ids), float64."""
        row_of, keys, values = self.transition_table()
        key = row_of[prev] * self.num_classes + token
        found = torch.searchsorted(keys, key).clamp_(max=keys.numel() - 1)
        t = torch.where(keys[found] == key, values[found], 0.0)
        return torch.log(self.mix * self.probs[token] + (1 - self.mix) * t)


@dataclass
class ZipfTopicOptions(GeneratedSplits):
    """``data=zipf``: the topic source over ``vocab_size`` types (``zipf_s``, ``topic_size``, ``mix``), its splits."""

    train_tokens: int = 1_000_000
    valid_tokens: int = 100_000
    test_tokens: int = 100_000
    vocab_size: int = 100_000
    zipf_s: float = 1.0  # Zipf exponent of the marginal: rank r (from 1) has probability ∝ r^-zipf_s
    topic_size: float = 10.0  # about this many types per topic: vocab_size / topic_size topics
    mix: float = 0.1  # weight of the global Zipf in every next-token distribution (also where the past is forgotten)


def zipf_topic_corpus(options: ZipfTopicOptions) -> Corpus:
    """Train/valid/test streams from a seeded ``ZipfTopicSource`` (independent stationary samples), ids remapped
    to train-frequency order and named ``w0, w1, ...``; no ``<eos>``."""
    o = options
    source = ZipfTopicSource(o.vocab_size, zipf_s=o.zipf_s, topic_size=o.topic_size, mix=o.mix, seed=o.seed)
    return generated_corpus("zipf", source, o)
