"""The two shapes of a hierarchical softmax's class tree, behind one small interface (``output.tree``).

``PathLayout`` is a binary tree (huffman, balanced): log p(c | h) sums log sigmoid(+-score) over the internal nodes
on c's path. ``BinLayout`` is the two-level class-factorized softmax: a softmax over frequency bins times one over
the classes inside c's bin. Both read their rows from the strategy's one parameter ``weight`` (rows, d + 1) with
a sparse gather and keep their index arrays as non-persistent buffers (rebuilt from the counts, never saved).
Their training loss keeps shapes fixed (no ``unique``, no host sync) and takes few operators.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.output import trees
from lmtrain.output.base import PAIRS_PER_CHUNK
from lmtrain.output.rows import gather_rows, row_scores
from lmtrain.output.trees import ClassBins, TreePaths


class PathLayout(nn.Module):
    """A binary tree over n classes: its n - 1 internal nodes are the weight rows."""

    def __init__(self, paths: TreePaths) -> None:
        super().__init__()
        self.num_rows = paths.num_nodes
        self.register_buffer("nodes", paths.nodes, persistent=False)  # (n, L) int32
        self.register_buffer("signs", paths.signs, persistent=False)  # (n, L) int8
        self.register_buffer("mask", paths.mask, persistent=False)  # (n, L) bool

    def path_lengths(self) -> Tensor:
        """(n,) code length of every class in bits."""
        return self.mask.sum(1)

    def log_prob(self, weight: Tensor, query: Tensor, target: Tensor, sparse: bool) -> Tensor:
        """(N,) exact log p(target | h) for query vectors [h, 1] (N, d + 1)."""
        return self.decisions(weight, query, target, sparse).sum(1)

    def mean_nll(self, weight: Tensor, query: Tensor, target: Tensor, sparse: bool) -> Tensor:
        """-mean log p(target | h) (the training loss): one sum over every decision, then a scale; the same value up
        to float rounding as -log_prob(...).mean(), two operators fewer forward and backward."""
        return self.decisions(weight, query, target, sparse).sum() * (-1.0 / target.shape[0])

    def decisions(self, weight: Tensor, query: Tensor, target: Tensor, sparse: bool) -> Tensor:
        """(N, L) log sigmoid(+-score) of every decision on the targets' paths, 0 past a path's end."""
        nodes = self.nodes[target].long()  # (N, L)
        rows = gather_rows(weight, nodes, sparse)  # (N, L, d + 1)
        scores = row_scores(query, rows)  # (N, L) node scores h . v_u + c_u
        signed = self.signs[target] * scores  # (N, L), +-1 in int8 times the scores: exact, no cast
        return F.logsigmoid(signed) * self.mask[target]

    def log_probs_all(self, scores: Tensor) -> Tensor:
        """(N, n) from every node's score (N, n - 1), in class chunks of at most ``PAIRS_PER_CHUNK`` decisions."""
        num_classes = self.nodes.shape[0]
        chunk = max(1, PAIRS_PER_CHUNK // max(scores.shape[0] * self.nodes.shape[1], 1))
        parts = []
        for start in range(0, num_classes, chunk):
            nodes = self.nodes[start : start + chunk].long()  # (k, L)
            signs = self.signs[start : start + chunk].to(scores.dtype)  # (k, L)
            decisions = F.logsigmoid(signs * scores[:, nodes])  # (N, k, L)
            parts.append((decisions * self.mask[start : start + chunk]).sum(2))  # (N, k)
        return torch.cat(parts, dim=1)


class BinLayout(nn.Module):
    """Two levels: class rows 0 .. n - 1, then one row per bin n .. n + K - 1; O(sqrt(n) d) per position."""

    def __init__(self, bins: ClassBins) -> None:
        super().__init__()
        self.num_classes, self.num_bins = bins.bin_of.numel(), bins.num_bins
        self.num_rows = self.num_classes + bins.num_bins
        self.register_buffer("bin_of", bins.bin_of, persistent=False)  # (n,)
        self.register_buffer("offset", bins.offset, persistent=False)  # (n,)
        self.register_buffer("members", bins.members, persistent=False)  # (K, S)
        self.register_buffer("member_mask", bins.member_mask, persistent=False)  # (K, S)
        self.register_buffer("bin_rows", torch.arange(self.num_classes, self.num_rows), persistent=False)  # (K,)

    def path_lengths(self) -> Tensor:
        """(n,) two decisions per class: its bin, then the class in the bin."""
        return torch.full((self.num_classes,), 2, dtype=torch.long, device=self.bin_of.device)

    def log_prob(self, weight: Tensor, query: Tensor, target: Tensor, sparse: bool) -> Tensor:
        """(N,) exact log p(bin | h) + log p(class | bin, h) for query vectors [h, 1] (N, d + 1)."""
        bin_rows = gather_rows(weight, self.bin_rows, sparse)  # (K, d + 1)
        bin_scores = query @ bin_rows.T  # (N, K)
        target_bin = self.bin_of[target]  # (N,)
        log_p_bin = bin_scores.gather(1, target_bin.unsqueeze(1))[:, 0] - torch.logsumexp(bin_scores, 1)
        # fixed shapes: every position gathers its bin (N * S rows), no unique (a host sync)
        rows = gather_rows(weight, self.members[target_bin], sparse)  # (N, S, d + 1)
        scores = row_scores(query, rows)  # (N, S) scores of the classes in the target's bin
        scores = scores.masked_fill(~self.member_mask[target_bin], float("-inf"))
        in_bin = scores.gather(1, self.offset[target].unsqueeze(1))[:, 0] - torch.logsumexp(scores, 1)  # (N,)
        return log_p_bin + in_bin

    def mean_nll(self, weight: Tensor, query: Tensor, target: Tensor, sparse: bool) -> Tensor:
        """-mean log p(target | h)."""
        return -self.log_prob(weight, query, target, sparse).mean()

    def log_probs_all(self, scores: Tensor) -> Tensor:
        """(N, n) from every class's and bin's score (N, n + K)."""
        class_scores, bin_scores = scores[:, : self.num_classes], scores[:, self.num_classes :]  # (N, n), (N, K)
        members = class_scores[:, self.members].masked_fill(~self.member_mask, float("-inf"))  # (N, K, S)
        log_p_bin = torch.log_softmax(bin_scores, dim=1) - torch.logsumexp(members, dim=2)  # (N, K)
        return log_p_bin[:, self.bin_of] + class_scores


def tree_layout(tree: str, counts: Tensor, num_bins: int | None = None) -> PathLayout | BinLayout:
    """The layout of ``output.tree`` for the training ``counts``: the two-level bins (``num_bins`` of them), or a
    binary tree's paths (``huffman_tree``, ``balanced_tree``)."""
    if tree == "two_level":
        return BinLayout(trees.two_level_tree(counts, num_bins))
    return PathLayout(getattr(trees, f"{tree}_tree")(counts))
