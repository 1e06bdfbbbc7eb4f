"""Class trees for the hierarchical softmax (docs/strategies.md): Huffman, balanced, and two-level class bins.

The binary trees (``huffman_tree``, ``balanced_tree``) return ``TreePaths``: for every class the padded
root-to-leaf path of internal node ids, the branch sign taken at each node (+1 = left, -1 = right) and a
mask of the real steps, so that log p(c | h) = sum_l mask[c, l] * log sigmoid(signs[c, l] * s(nodes[c, l]))
is one batched gather. Internal nodes are numbered 0 .. n - 2 with the root at 0 and every parent before
its children. ``two_level_tree`` returns ``ClassBins``: about sqrt(n) frequency bins of equal size, for
the class-factorized softmax p(c | h) = p(bin(c) | h) p(c | bin(c), h).

Every builder takes the training counts (n,) and is O(n log n); n = 10^6 builds in about a second.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class TreePaths(NamedTuple):
    """Padded root-to-leaf paths of a binary tree over n classes."""

    nodes: Tensor  # (n, L) int32 internal node ids (padding: 0)
    signs: Tensor  # (n, L) int8, +1 = left branch, -1 = right branch (padding: +1)
    mask: Tensor  # (n, L) bool, True for the real steps of the path
    num_nodes: int  # internal nodes, n - 1


class ClassBins(NamedTuple):
    """Classes split into frequency bins for the two-level (class-factorized) softmax."""

    bin_of: Tensor  # (n,) int64 bin of every class
    offset: Tensor  # (n,) int64 position of every class inside its bin
    members: Tensor  # (K, S) int64 classes of every bin, padded with the bin's first class
    member_mask: Tensor  # (K, S) bool, True for real members
    num_bins: int  # K


def _check_counts(counts: Tensor) -> np.ndarray:
    weights = torch.as_tensor(counts).detach().cpu().reshape(-1).numpy()
    if weights.size < 2:
        raise ValueError(f"a class tree needs at least 2 classes, got {weights.size}; check num_classes")
    if (weights < 0).any():
        raise ValueError("training counts must be non-negative; check the counts passed to the output")
    return weights


def frequency_rank(counts: Tensor) -> np.ndarray:
    """Classes ordered by descending count, ties by id (the identity for a frequency-ordered vocabulary)."""
    weights = _check_counts(counts)
    return np.argsort(-weights, kind="stable")


def paths_from_parents(parent: np.ndarray, is_right: np.ndarray, num_classes: int) -> TreePaths:
    """Padded paths of a binary tree whose node i < n - 1 is internal, leaf n - 1 + c holds class c.

    ``parent`` (2n - 1,) gives every node's parent (the root 0 points to itself); ``is_right`` (2n - 1,)
    says whether a node is its parent's right child. Two vectorized walks leaf -> root (one per level).
    """
    n = num_classes
    parent = parent.astype(np.int32)
    leaves = np.arange(n - 1, 2 * n - 1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int32)
    cur = leaves
    while (active := cur != 0).any():
        depth += active
        cur = parent[cur]
    width = int(depth.max())
    # one spare column (index `width`) absorbs the writes of leaves whose walk has already ended
    nodes = np.zeros((n, width + 1), dtype=np.int32)
    right = np.zeros((n, width + 1), dtype=bool)
    rows = np.arange(n)
    cur = leaves
    for step in range(width):
        pos = np.where(cur != 0, depth - 1 - step, width)  # (n,) root-first column of this step
        nodes[rows, pos] = parent[cur]
        right[rows, pos] = is_right[cur]
        cur = parent[cur]
    nodes, right = np.ascontiguousarray(nodes[:, :width]), np.ascontiguousarray(right[:, :width])
    mask = np.arange(width)[None, :] < depth[:, None]  # (n, L)
    signs = np.where(right, -1, 1).astype(np.int8)
    return TreePaths(torch.from_numpy(nodes), torch.from_numpy(signs), torch.from_numpy(mask), n - 1)


def huffman_tree(counts: Tensor) -> TreePaths:
    """Huffman tree over the counts (zero counts are raised to 1 so every class gets a finite code).

    Two-queue construction: leaves sorted by count, merged nodes appear in non-decreasing weight order;
    on ties a leaf is taken first, which keeps the tree as shallow as possible. Internal node k merged
    (k = 0 .. n - 2) gets id n - 2 - k, so the last merge is the root 0 and parents precede children.
    """
    weights = np.maximum(_check_counts(counts).astype(np.float64), 1.0)
    n = weights.size
    order = np.argsort(weights, kind="stable")  # ascending counts
    leaf_w = weights[order].tolist()
    leaf_node = (order + (n - 1)).tolist()  # node id of the leaf at each sorted position
    parent = [0] * (2 * n - 1)
    is_right = [False] * (2 * n - 1)
    merged_w: list[float] = []
    merged_node: list[int] = []
    i = j = 0  # heads of the leaf queue and of the merged queue
    for k in range(n - 1):
        node = n - 2 - k
        total = 0.0
        for side in (False, True):  # left child first, then right child
            if i < n and (j >= len(merged_w) or leaf_w[i] <= merged_w[j]):
                child, weight, i = leaf_node[i], leaf_w[i], i + 1
            else:
                child, weight, j = merged_node[j], merged_w[j], j + 1
            parent[child], is_right[child] = node, side
            total += weight
        merged_w.append(total)
        merged_node.append(node)
    return paths_from_parents(np.asarray(parent), np.asarray(is_right), n)


def balanced_tree(counts: Tensor) -> TreePaths:
    """Complete binary tree (depths floor/ceil of log2 n); more frequent classes get the shallower leaves.

    Heap layout: node i has children 2i + 1 and 2i + 2; leaves fill positions n - 1 .. 2n - 2 in order of
    descending count, and the earlier positions are never deeper than the later ones.
    """
    rank = frequency_rank(counts)
    n = rank.size
    heap = np.arange(2 * n - 1)
    parent = np.maximum(heap - 1, 0) // 2  # root 0 points to itself
    is_right = (heap > 0) & (heap % 2 == 0)
    # class rank[r] sits at heap position n - 1 + r; relabel so that leaf n - 1 + c holds class c
    perm = heap.copy()
    perm[n - 1 + rank] = heap[n - 1 :]  # node id (layout of paths_from_parents) -> heap position
    return paths_from_parents(parent[perm], is_right[perm], n)


def two_level_tree(counts: Tensor, num_bins: int | None = None) -> ClassBins:
    """Equal-size bins of consecutive frequency ranks: bin 0 holds the most frequent classes.

    ``num_bins`` defaults to round(sqrt(n)); every bin holds ceil(n / num_bins) classes (the last may hold
    fewer), so both softmax levels cost O(sqrt(n)) per position.
    """
    rank = frequency_rank(counts)
    n = rank.size
    bins = round(math.sqrt(n)) if num_bins is None else num_bins
    if not 1 <= bins <= n:
        raise ValueError(f"output.num_bins must be between 1 and the vocabulary size {n}, got {num_bins}")
    size = math.ceil(n / bins)
    bins = math.ceil(n / size)  # drop bins that would be empty
    pos = np.arange(bins * size)
    padded = rank[np.minimum(pos, n - 1)].reshape(bins, size)  # (K, S)
    member_mask = (pos < n).reshape(bins, size)  # (K, S)
    members = np.where(member_mask, padded, padded[:, :1])  # (K, S) padding points at the bin's first class
    bin_of = np.empty(n, dtype=np.int64)
    offset = np.empty(n, dtype=np.int64)
    bin_of[rank] = np.arange(n) // size
    offset[rank] = np.arange(n) % size
    return ClassBins(
        torch.from_numpy(bin_of),
        torch.from_numpy(offset),
        torch.from_numpy(members.astype(np.int64)),
        torch.from_numpy(member_mask),
        bins,
    )
