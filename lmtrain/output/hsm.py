"""Hierarchical softmax over a class tree (docs/strategies.md): exact probabilities in O(log n) per position."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.output import trees
from lmtrain.output.base import PAIRS_PER_CHUNK, OutputLayer
from lmtrain.output.rows import gather_rows

TREES = ("huffman", "balanced", "two_level")


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
    arrays are non-persistent buffers rebuilt from ``counts`` in ``__init__``, never saved.
    """

    loss_is_nll = True

    def __init__(
        self,
        num_classes: int,
        dim: int,
        counts: Tensor,
        tree: Literal["huffman", "balanced", "two_level"] = "huffman",
        sparse: bool = True,
        init_range: float = 0.1,
        num_bins: int | None = None,
    ) -> None:
        super().__init__()
        if tree not in TREES:
            raise ValueError(f"output.tree must be one of {', '.join(TREES)}, got {tree!r}")
        counts = torch.as_tensor(counts)
        if counts.shape != (num_classes,):
            raise ValueError(f"counts must have one entry per class ({num_classes}), got shape {tuple(counts.shape)}")
        self.num_classes, self.dim, self.tree, self.sparse = num_classes, dim, tree, sparse
        builder = getattr(trees, f"{tree}_tree")  # huffman_tree | balanced_tree | two_level_tree
        built = builder(counts, num_bins) if tree == "two_level" else builder(counts)
        self.factorized = isinstance(built, trees.ClassBins)
        if self.factorized:  # class rows 0 .. n - 1, bin rows n .. n + K - 1
            rows = num_classes + built.num_bins
            self.num_bins = built.num_bins
            self.register_buffer("bin_of", built.bin_of, persistent=False)  # (n,)
            self.register_buffer("offset", built.offset, persistent=False)  # (n,)
            self.register_buffer("members", built.members, persistent=False)  # (K, S)
            self.register_buffer("member_mask", built.member_mask, persistent=False)  # (K, S)
            self.register_buffer("bin_rows", torch.arange(num_classes, rows), persistent=False)  # (K,)
        else:
            rows = built.num_nodes
            self.register_buffer("path_nodes", built.nodes, persistent=False)  # (n, L) int32
            self.register_buffer("path_signs", built.signs, persistent=False)  # (n, L) int8
            self.register_buffer("path_mask", built.mask, persistent=False)  # (n, L) bool
        self.weight = nn.Parameter(torch.empty(rows, dim + 1))
        nn.init.uniform_(self.weight[:, :dim], -init_range, init_range)
        nn.init.zeros_(self.weight[:, dim:])

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.weight] if self.sparse else []

    def query(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, d + 1) = [h, 1], whose dot product with a weight row is that row's score."""
        return torch.cat([hidden, hidden.new_ones(hidden.shape[0], 1)], dim=1)

    def path_lengths(self) -> Tensor:
        """(n,) number of decisions per class (binary trees: code length in bits; two_level: 2)."""
        if self.factorized:
            return torch.full((self.num_classes,), 2, dtype=torch.long, device=self.weight.device)
        return self.path_mask.sum(1)

    # --- exact log-probabilities ----------------------------------------------------------------------
    def _tree_log_prob(self, query: Tensor, target: Tensor) -> Tensor:
        nodes = self.path_nodes[target].long()  # (N, L)
        rows = gather_rows(self.weight, nodes, self.sparse)  # (N, L, d + 1)
        scores = torch.einsum("nd,nld->nl", query, rows)  # (N, L) node scores h . v_u + c_u
        signs = self.path_signs[target].to(query.dtype)  # (N, L)
        return (F.logsigmoid(signs * scores) * self.path_mask[target]).sum(1)

    def _two_level_log_prob(self, query: Tensor, target: Tensor) -> Tensor:
        bin_rows = gather_rows(self.weight, self.bin_rows, self.sparse)  # (K, d + 1)
        bin_scores = query @ bin_rows.T  # (N, K)
        target_bin = self.bin_of[target]  # (N,)
        log_p_bin = bin_scores.gather(1, target_bin.unsqueeze(1))[:, 0] - torch.logsumexp(bin_scores, 1)
        bins, inverse = torch.unique(target_bin, return_inverse=True)  # (U,), (N,)
        # each distinct bin is gathered once, so the sparse gradient has U * S rows, not N * S
        bin_members = gather_rows(self.weight, self.members[bins], self.sparse)  # (U, S, d + 1)
        rows = bin_members[inverse]  # (N, S, d + 1); duplicates are summed in the (U, S, d + 1) grad
        scores = torch.einsum("nd,nsd->ns", query, rows)  # (N, S) scores of the classes in the target's bin
        scores = scores.masked_fill(~self.member_mask[target_bin], float("-inf"))
        in_bin = scores.gather(1, self.offset[target].unsqueeze(1))[:, 0] - torch.logsumexp(scores, 1)  # (N,)
        return log_p_bin + in_bin

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        query = self.query(hidden)
        if self.factorized:
            return self._two_level_log_prob(query, target)
        return self._tree_log_prob(query, target)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        scores = self.query(hidden) @ self.weight.T  # (N, rows): every node's (or class's and bin's) score
        if self.factorized:
            class_scores, bin_scores = scores[:, : self.num_classes], scores[:, self.num_classes :]  # (N, n), (N, K)
            members = class_scores[:, self.members].masked_fill(~self.member_mask, float("-inf"))  # (N, K, S)
            log_p_bin = torch.log_softmax(bin_scores, dim=1) - torch.logsumexp(members, dim=2)  # (N, K)
            return log_p_bin[:, self.bin_of] + class_scores
        chunk = max(1, PAIRS_PER_CHUNK // max(scores.shape[0] * self.path_nodes.shape[1], 1))
        parts = []
        for start in range(0, self.num_classes, chunk):
            nodes = self.path_nodes[start : start + chunk].long()  # (k, L)
            signs = self.path_signs[start : start + chunk].to(scores.dtype)  # (k, L)
            decisions = F.logsigmoid(signs * scores[:, nodes])  # (N, k, L)
            parts.append((decisions * self.path_mask[start : start + chunk]).sum(2))  # (N, k)
        return torch.cat(parts, dim=1)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        return -self.log_prob(hidden, target).mean()
