"""Bigram proposal q(j | previous token) from the training stream, mixed with the unigram (per example)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.options import BigramOptions
from lmtrain.sampler.proposal import Draws, Proposal
from lmtrain.sampler.unigram import UnigramSampler

_OFFSET_BITS = 62  # successor offsets are uniform 62-bit integers modulo the row count: bias < count / 2^62


class PreviousWordSampler(Sampler):
    """A per-position proposal q(j | p) conditioned on each position's previous word p (its input token), built from
    the training stream ``train_ids`` (``sampler=bigram``, ``sampler=adaptive_ngram``)."""

    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "train_ids")

    shared = False
    per_position_only: ClassVar[bool] = True

    def __init__(self, train_ids: Tensor | None) -> None:
        super().__init__()
        if train_ids is None:
            raise ValueError(f"sampler={self.name} needs the training token ids (train_ids) to count bigrams")

    def previous(self, query: Tensor | None, inputs: Tensor | None, device: torch.device) -> Tensor:
        """The input token of each position (N,), long on ``device``; one line naming the sampler when the caller did
        not pass them, or did not pass one per query."""
        if inputs is None:
            raise ValueError(
                f"sampler={self.name} conditions on each position's previous word: pass `inputs` (N,) "
                "(OutputLayer.loss(hidden, target, inputs=...))"
            )
        if query is not None and query.shape[0] != inputs.numel():
            raise ValueError(f"inputs has {inputs.numel()} tokens but the query has {query.shape[0]} positions")
        return inputs.reshape(-1).to(device, torch.long)  # (N,)


class BigramSampler(PreviousWordSampler):
    """q(j | p) = (1 - w) c(p, j) / c(p) + w u(j), where p is the position's input token (the previous word).

    c(p, j) counts the bigram "p j" in the training stream ``train_ids``, c(p) = sum_j c(p, j), and u is the
    add-``smoothing`` unigram of the training tokens (drawn and scored exactly as ``UnigramSampler``), so every
    class keeps q > 0. w = ``unigram_weight``; a token with no successor in training uses u alone.

    Draws are O(1) each and exact: a Bernoulli(1 - w) coin picks the component; the bigram component is a
    uniformly random training occurrence of p, read from the successors of all positions sorted by their
    previous token (a CSR array: row p is ``successors[start[p] : start[p] + count[p]]``, so occurrence k is
    drawn with probability c(p, j) / c(p)); the unigram component is an alias-table draw. ``log_q`` of any ids
    finds c(p, j) by binary search in the sorted distinct bigram keys p * n + j (int64, so n up to 10^6 and
    beyond). All tables are O(training tokens), rebuilt from ``train_ids`` at construction (non-persistent
    buffers: never in checkpoints) and follow the module's device.
    """

    name, Options = "bigram", BigramOptions  # sampler=bigram

    def __init__(self, num_classes: int, train_ids: Tensor | None = None, **options: Any) -> None:
        super().__init__(train_ids)
        self.options = opts = BigramOptions(**options)  # the keys left out take their defaults
        unigram_weight, smoothing = opts.unigram_weight, opts.smoothing
        if not 2 <= num_classes < 2**31:
            raise ValueError(f"BigramSampler needs 2 <= num_classes < 2^31, got {num_classes}")
        ids = train_ids.detach().reshape(-1).cpu().long()  # (T,)
        if ids.numel() < 2 or int(ids.min()) < 0 or int(ids.max()) >= num_classes:
            raise ValueError(f"train_ids must hold at least 2 ids in [0, {num_classes}), got {ids.numel()} tokens")
        self.num_classes, self.unigram_weight = num_classes, float(unigram_weight)
        self.unigram = UnigramSampler(num_classes, torch.bincount(ids, minlength=num_classes), smoothing=smoothing)
        keys = (ids[:-1] * num_classes + ids[1:]).sort().values  # (T - 1,) p * n + j, grouped by p
        count = torch.bincount(ids[:-1], minlength=num_classes)  # (n,) c(p)
        pairs, pair_count = torch.unique_consecutive(keys, return_counts=True)  # (B,) distinct bigrams, c(p, j)
        share = torch.where(count > 0, self.unigram_weight, 1.0).double()  # (n,) the unigram's share of q(. | p)
        pair_q = (1 - share[pairs // num_classes]) * pair_count / count[pairs // num_classes]  # (B,) bigram term
        self.register_buffer("successors", (keys % num_classes).to(torch.int32), persistent=False)  # (T - 1,)
        self.register_buffer("start", count.cumsum(0) - count, persistent=False)  # (n,) row offsets
        self.register_buffer("count", count, persistent=False)  # (n,) int64 c(p)
        self.register_buffer("pairs", pairs, persistent=False)  # (B,) sorted int64 keys p * n + j
        self.register_buffer("pair_q", pair_q, persistent=False)  # (B,) float64 (1 - w) c(p, j) / c(p)
        self.register_buffer("share", share, persistent=False)  # (n,) float64
        self.register_buffer("unigram_q", self.unigram.log_probs.double().exp(), persistent=False)  # (n,) u(j)

    def propose(
        self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None
    ) -> BigramProposal:
        return BigramProposal(self, self.previous(query, inputs, self.count.device), targets)

    def draw(self, prev: Tensor, num_samples: int, bigram_weight: Tensor | None = None) -> Tensor:
        """``num_samples`` ids (N, m) from q(. | p) for each previous token ``prev`` (N,): a coin per draw picks a
        random training successor of p, else a unigram draw (always where p has no successor). The bigram's share is
        1 - ``unigram_weight`` (the upper end of the coin's range), or ``bigram_weight`` (N, 1) per position, given
        by ``sampler=adaptive_ngram`` (the lower end)."""
        shape = (prev.numel(), num_samples)
        from_bigram, count = self.successor_draws(prev, num_samples)  # (N, m), (N, 1)
        from_unigram = self.unigram.draw_ids(prev.numel() * num_samples)  # (N * m,)
        coin = torch.rand(shape, device=self.count.device, dtype=torch.float64)  # (N, m)
        heads = coin >= self.unigram_weight if bigram_weight is None else coin < bigram_weight  # (N, m)
        return torch.where(heads & (count > 0), from_bigram, from_unigram.view(shape))  # (N, m)

    def successor_draws(self, prev: Tensor, num_samples: int) -> tuple[Tensor, Tensor]:
        """``num_samples`` ids (N, m) from the bigram part alone, c(. | p) / c(p), for each previous token ``prev``
        (N,), and c(p) (N, 1): a uniformly random training occurrence of p, read from the CSR rows of successors.
        Where c(p) = 0 the ids are meaningless (the caller takes its unigram draw there)."""
        shape = (prev.numel(), num_samples)
        count = self.count[prev].unsqueeze(1)  # (N, 1) c(p)
        offset = torch.randint(1 << _OFFSET_BITS, shape, device=self.count.device) % count.clamp(min=1)  # [0, c(p))
        row = (self.start[prev].unsqueeze(1) + offset).clamp(max=self.successors.numel() - 1)  # (N, m); c(p) = 0: any
        return self.successors[row].long(), count  # (N, m), (N, 1)

    def pair_lookup(self, prev: Tensor, ids: Tensor, table: Tensor) -> Tensor:
        """``table``'s entry (one per distinct bigram, as ``pairs``) of each bigram (p, j), 0 where the training
        stream has none; ``prev`` (N,), ids (N, k) or (k,) for every position -> (N, k)."""
        keys = prev.unsqueeze(1) * self.num_classes + ids  # (N, k) p * n + j
        flat = keys.reshape(-1)  # (N * k,) a flat search is faster than a batched one
        found = torch.searchsorted(self.pairs, flat).clamp_(max=self.pairs.numel() - 1)  # (N * k,)
        return table[found].masked_fill(self.pairs[found] != flat, 0.0).view_as(keys)  # (N, k)

    def log_q_after(self, prev: Tensor, ids: Tensor) -> Tensor:
        """log q(ids | prev) after the previous tokens ``prev`` (N,): ids (N, k), or (k,) for every position."""
        bigram = self.pair_lookup(prev, ids, self.pair_q)  # (N, k) (1 - w) c(p, j) / c(p)
        q = bigram + self.share[prev].unsqueeze(1) * self.unigram_q[ids]  # (N, k) float64
        return q.log().to(self.unigram.log_probs.dtype)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, unigram_weight={self.unigram_weight}, bigrams={self.pairs.numel()}"


class BigramProposal(Proposal):
    """One step's bigram proposal, its previous tokens (N,) bound: the targets' log q is looked up with the draws',
    for the joined ids at once (one binary search and its lookups)."""

    per_position = True

    def __init__(self, sampler: BigramSampler, prev: Tensor, targets: Tensor | None) -> None:
        self.sampler, self.prev, self.targets = sampler, prev, targets
        self.positions = prev.numel()

    @property
    def device(self) -> torch.device:
        return self.prev.device

    def draw(self, num_samples: int) -> Draws:
        ids = self.sampler.draw(self.prev, num_samples)  # (N, m)
        if self.targets is None:
            return Draws(ids, self.sampler.log_q_after(self.prev, ids), None)
        joint = torch.cat([self.targets.view(-1, 1), ids], 1)  # (N, 1 + m)
        log_q = self.sampler.log_q_after(self.prev, joint)  # (N, 1 + m), one search
        return Draws(joint[:, 1:], log_q[:, 1:], log_q[:, :1], joint)

    def log_q(self, ids: Tensor) -> Tensor:
        """log q(ids | prev): ids (N, k), or (k,) for the same ids at every position -> (N, k)."""
        return self.sampler.log_q_after(self.prev, ids)
