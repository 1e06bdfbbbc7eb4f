"""Differentiated softmax (Chen, Grangier and Auli 2016): frequency blocks of classes with narrower output vectors
for the rarer ones, each block reading its own slice of the hidden state; exact normalization over all classes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.output.base import OutputLayer, initial_bias
from lmtrain.output.logsumexp import class_rows, target_and_log_z
from lmtrain.output.options import INIT_RANGE, BiasInit

# the derived layout: a head of min(n / 5, 2000) classes, each further cutoff GROWTH times the one before; at most
# MAX_BLOCKS blocks, and no more than halving the width leaves at least one dimension each
HEAD_CAP, GROWTH, MAX_BLOCKS = 2000, 3, 4


@dataclass
class DSoftmaxOptions(Checked):
    """``output=dsoftmax``: the differentiated softmax. Block k holds the classes [cutoffs[k-1], cutoffs[k]) (ids are
    frequency ranks: block 0 the most frequent) with output vectors of ``widths[k]`` dimensions, read from the next
    ``widths[k]`` entries of the hidden state; the widths sum to the hidden size. Exact, normalized over all
    classes. ``None`` derives either from n and d (``block_layout``)."""

    cutoffs: list[int] | None = None  # e.g. [2000, 6000]: K - 1 increasing class ids for K blocks
    widths: list[int] | None = None  # e.g. [100, 50, 50]: one per block, summing to the hidden size
    init_range: float = field(default=0.1, metadata=INIT_RANGE)  # uniform(-init_range, init_range) weights
    eval_chunk: int = field(default=65536, metadata=AT_LEAST_1)  # classes per chunk of exact evaluation
    bias_init: BiasInit = BiasInit.zero

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = next(block_problems(self.cutoffs, self.widths, "output"), None)
        if problem is not None:
            raise ValueError(problem)

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """The config check's rules across keys: the blocks' lists on their own (n and d are known at build)."""
        cutoffs, widths = node.get("cutoffs"), node.get("widths")
        yield from block_problems(
            None if cutoffs is None else list(cutoffs), None if widths is None else list(widths), path
        )


def block_problems(cutoffs: Sequence[int] | None, widths: Sequence[int] | None, path: str) -> Iterator[str]:
    """What is wrong with ``cutoffs`` and ``widths`` whatever n and d (one sentence each, naming the key)."""
    if cutoffs is not None and (any(c < 1 for c in cutoffs) or list(cutoffs) != sorted(set(cutoffs))):
        yield (
            f"{path}.cutoffs must be strictly increasing class ids >= 1 (block k holds the ids from cutoffs[k-1] "
            f"up to cutoffs[k]), got {list(cutoffs)}; or set {path}.cutoffs=null to derive them"
        )
    if widths is not None and (not widths or any(w < 1 for w in widths)):
        yield f"{path}.widths must be one width >= 1 per block, got {list(widths)}; or set {path}.widths=null"
    if cutoffs is not None and widths is not None and len(widths) != len(cutoffs) + 1:
        yield (
            f"{path}.widths has {len(widths)} entries but {path}.cutoffs makes {len(cutoffs) + 1} blocks: "
            f"give one width per block (len(cutoffs) + 1)"
        )


def most_blocks(dim: int) -> int:
    """The most blocks (at most MAX_BLOCKS) whose halved widths d/2, d/4, ... keep at least one dimension."""
    return min(MAX_BLOCKS, int(math.log2(dim)) + 1) if dim >= 1 else 1


def derive_cutoffs(num_classes: int, blocks: int) -> list[int]:
    """Up to ``blocks`` - 1 cutoffs below n: the head min(round(n / 5), 2000), then GROWTH times the previous cutoff.
    PTB (10,000) gets [2000, 6000], WikiText-2 (33,278) [2000, 6000, 18000]: the classes beyond the head fall in
    blocks that grow about as fast as halving shrinks their widths, so each block costs about the same."""
    cutoffs: list[int] = []
    cutoff = min(max(round(num_classes / 5), 1), HEAD_CAP)
    while len(cutoffs) < blocks - 1 and cutoff < num_classes:
        cutoffs.append(cutoff)
        cutoff *= GROWTH
    return cutoffs


def halved_widths(dim: int, blocks: int) -> list[int]:
    """d/2, d/4, ... for the first ``blocks`` - 1 blocks (rounded down); the last takes the rest, so they sum to d."""
    widths = [dim >> k for k in range(1, blocks)]
    return [*widths, dim - sum(widths)]


def block_layout(
    num_classes: int, dim: int, cutoffs: Sequence[int] | None = None, widths: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """(cutoffs, widths) for n classes and a hidden size d: the given ones checked, the missing ones derived
    (``derive_cutoffs``, ``halved_widths``); raises a one-line ValueError naming the key."""
    problem = next(block_problems(cutoffs, widths, "output"), None)
    if problem is None and widths is not None and sum(widths) != dim:
        problem = f"output.widths must sum to the hidden size {dim}, got {list(widths)} (sum {sum(widths)})"
    if problem is None and cutoffs is not None and cutoffs and cutoffs[-1] >= num_classes:
        problem = f"output.cutoffs must lie below the vocabulary size {num_classes}, got {list(cutoffs)}"
    if problem is not None:
        raise ValueError(problem)
    if cutoffs is not None:
        derived = [int(c) for c in cutoffs]
    else:
        derived = derive_cutoffs(num_classes, len(widths) if widths is not None else most_blocks(dim))
    blocks = len(derived) + 1
    if widths is not None and len(widths) != blocks:
        raise ValueError(
            f"output.widths has {len(widths)} entries, but {num_classes} classes give only {blocks} derived "
            f"blocks; set output.cutoffs ({len(widths) - 1} increasing class ids) or fewer widths"
        )
    if widths is None and dim >> (blocks - 1) < 1:
        raise ValueError(
            f"output.cutoffs makes {blocks} blocks, but halving the hidden size {dim} leaves a block no dimension; "
            f"set output.widths or use fewer cutoffs"
        )
    return derived, [int(w) for w in widths] if widths is not None else halved_widths(dim, blocks)


def cost_ratio(
    num_classes: int, dim: int, cutoffs: Sequence[int] | None = None, widths: Sequence[int] | None = None
) -> float:
    """sum(n_k d_k) / (n d): the multiply-adds of scoring every class against the full softmax's, for the blocks
    that ``block_layout`` gives (the numbers in docs/strategies.md)."""
    cutoffs, widths = block_layout(num_classes, dim, cutoffs, widths)
    sizes = [b - a for a, b in pairwise([0, *cutoffs, num_classes])]
    return sum(s * w for s, w in zip(sizes, widths, strict=True)) / (num_classes * dim)


class DifferentiatedSoftmax(OutputLayer):
    """The softmax over all classes of block-diagonal logits: block k's classes [c_{k-1}, c_k) score against the
    hidden slice h[:, o_k : o_k + d_k] (o_k = d_0 + ... + d_{k-1}) with vectors W_k (n_k, d_k), plus a bias per class.
    The equivalent (n, d) output matrix is zero outside the blocks; those entries are never stored or multiplied,
    so scoring every class costs sum(n_k d_k) multiply-adds per position instead of n d (``multiply_adds``).

    Relies on the frequency-ordered vocabulary (id 0 the most frequent): the first block, the frequent words, gets
    the widest vectors. ``loss`` is the exact mean NLL from the blocks' logits side by side (N, n) (fixed shapes, no
    host sync); ``log_prob`` normalizes block by block, each block's logits in vocabulary chunks of ``eval_chunk``
    classes (one product when they fit, the target's logit read from it).
    """

    name, Options = "dsoftmax", DSoftmaxOptions  # output=dsoftmax
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "counts")

    loss_is_nll = True
    tie_refusal = (
        "its blocks' class vectors have their own widths (d_k < d) and read different slices of the hidden state, "
        "so there is no (n, d) matrix of class vectors to share with the input embedding"
    )

    def __init__(self, num_classes: int, dim: int, counts: Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = opts = DSoftmaxOptions(**options)  # the keys left out take their defaults
        self.num_classes, self.dim, self.eval_chunk = num_classes, dim, opts.eval_chunk
        self.cutoffs, self.widths = block_layout(num_classes, dim, opts.cutoffs, opts.widths)
        self.bounds = [0, *self.cutoffs, num_classes]  # block k: classes [bounds[k], bounds[k + 1])
        self.offsets = [0, *accumulate(self.widths)]  # block k reads hidden[:, offsets[k] : offsets[k + 1]]
        sizes = [b - a for a, b in pairwise(self.bounds)]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(size, width)) for size, width in zip(sizes, self.widths, strict=True)
        )  # W_k (n_k, d_k)
        for weight in self.weights:
            nn.init.uniform_(weight, -opts.init_range, opts.init_range)
        self.bias = nn.Parameter(initial_bias(opts.bias_init, num_classes, counts))  # (n,)

    @property
    def multiply_adds(self) -> int:
        """Multiply-adds per position of scoring every class: sum(n_k d_k) (the full softmax: n d)."""
        return sum(w.shape[0] * w.shape[1] for w in self.weights)

    def logits(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, n): each block's product with its own slice, side by side, plus the biases."""
        # split: one view per block; its backward is one cat into the hidden state's gradient
        slices = hidden.split(self.widths, dim=1)  # (N, d_k) each
        blocks = [F.linear(h, w) for h, w in zip(slices, self.weights, strict=True)]  # (N, n_k) each
        return torch.cat(blocks, dim=1) + self.bias  # (N, n)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        return F.cross_entropy(self.logits(hidden), target)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.logits(hidden), dim=1)  # (N, n)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        target_logit: Tensor | None = None
        log_z: Tensor | None = None
        for k, (h, weight) in enumerate(zip(hidden.split(self.widths, dim=1), self.weights, strict=True)):
            start, end = self.bounds[k], self.bounds[k + 1]  # h: (N, d_k), weight: (n_k, d_k)
            bias = class_rows(self.bias, start, end)  # (n_k,)
            local = (target - start).clamp(0, end - start - 1)  # (N,) the target's row in W_k where it is inside
            own, part = self.block_terms(h, weight, bias, local)  # (N,) each
            inside = torch.where((target >= start) & (target < end), own, 0.0)  # (N,)
            target_logit = inside if target_logit is None else target_logit + inside
            log_z = part if log_z is None else torch.logaddexp(log_z, part)
        assert target_logit is not None and log_z is not None, "at least one block"
        return target_logit - log_z

    def block_terms(self, h: Tensor, weight: Tensor, bias: Tensor, local: Tensor) -> tuple[Tensor, Tensor]:
        """(N, d_k), (n_k, d_k), (n_k,), (N,) -> each position's logit of row ``local`` of the block and the block's
        logsumexp, (N,) each (``target_and_log_z``: one product when the block fits in ``eval_chunk`` classes)."""

        def logits(start: int, end: int) -> Tensor:  # (N, end - start)
            return F.linear(h, class_rows(weight, start, end), class_rows(bias, start, end))

        def row() -> Tensor:  # (N,)
            return (h * weight[local]).sum(1) + bias[local]

        return target_and_log_z(logits, row, local, weight.shape[0], self.eval_chunk)
