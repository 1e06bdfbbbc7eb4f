"""Hierarchical softmax over a class tree (docs/strategies.md): exact probabilities in O(log n) per position."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmtrain.common.constants import with_ones_column
from lmtrain.common.precision import in_float32
from lmtrain.output.base import OutputLayer
from lmtrain.output.hsm_layouts import tree_layout
from lmtrain.output.options import HSMOptions


class HierarchicalSoftmax(OutputLayer):
    """p(c | h) factorized along a tree over the classes; training loss and evaluation are the same model.

    ``tree`` picks the factorization (built once from the training ``counts``, see ``lmtrain.output.trees``):

    - ``huffman`` (default): binary Huffman tree from the counts, log p(c | h) =
      sum over the internal nodes u on c's path of log sigmoid(+-(h . v_u + c_u)) (left = +, right = -);
      frequent classes have short paths, so the expected cost is about the unigram entropy in bits.
    - ``balanced``: complete binary tree, every path ceil/floor(log2 n) long.
    - ``two_level``: the class-factorized softmax (Goodman 2001; Mikolov et al. 2011), not a binary tree:
      p(c | h) = softmax over ~sqrt(n) frequency bins (``num_bins``, equal-size bins of consecutive
      frequency ranks) times a softmax over the classes inside c's bin; O(sqrt(n) d) per position.

    All node (or bin and class) vectors and biases live in ONE augmented parameter ``weight``
    (rows, d + 1) = [v, c], read with a sparse row gather, so a step touches only the rows on the paths
    (binary trees: n - 1 internal nodes; two_level: n class rows then K bin rows). The per-class path
    arrays are non-persistent buffers of ``self.layout`` (``lmtrain.output.hsm_layouts``), rebuilt from ``counts``
    in ``__init__``, never saved.
    """

    name, Options = "hsm", HSMOptions  # output=hsm
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "counts")

    loss_is_nll = True
    tie_refusal = "its vectors belong to the tree's inner nodes (or bins), not to the classes: no class vectors to tie"

    def __init__(self, num_classes: int, dim: int, counts: Tensor, **options: Any) -> None:
        super().__init__()
        self.options = opts = HSMOptions(**options)  # the keys left out take their defaults
        counts = torch.as_tensor(counts)
        if counts.shape != (num_classes,):
            raise ValueError(f"counts must have one entry per class ({num_classes}), got shape {tuple(counts.shape)}")
        self.num_classes, self.dim, self.tree = num_classes, dim, opts.tree
        self.sparse = opts.sparse is not False  # auto, resolved by the app from the optimizer, means on here
        self.layout = tree_layout(opts.tree, counts, opts.num_bins)  # the tree's index arrays (non-persistent buffers)
        self._mean_nll = in_float32(self.layout.mean_nll)  # the training loss, in float32 as log_prob (built once)
        self.weight = nn.Parameter(torch.empty(self.layout.num_rows, dim + 1))
        nn.init.uniform_(self.weight[:, :dim], -opts.init_range, opts.init_range)
        nn.init.zeros_(self.weight[:, dim:])

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.weight] if self.sparse else []

    def query(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, d + 1) = [h, 1], whose dot product with a weight row is that row's score."""
        return with_ones_column(hidden)

    def path_lengths(self) -> Tensor:
        """(n,) number of decisions per class (binary trees: code length in bits; two_level: 2)."""
        return self.layout.path_lengths()

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        return self.layout.log_prob(self.weight, self.query(hidden), target, self.sparse)  # (N,)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return self.layout.log_probs_all(self.query(hidden) @ self.weight.T)  # scores of every row (N, rows)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        return self._mean_nll(self.weight, self.query(hidden), target, self.sparse)  # float32 as log_prob
