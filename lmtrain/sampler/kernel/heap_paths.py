"""Sparse 0/1 matrices between the nodes of one level of a heap-ordered binary tree and their ancestors.

The GPU paths use them so that one sparse product replaces a gather of every node's path and a sum over it: the
walk's log-probability of reaching each node (the sum of its ancestors' branch log-probabilities,
``FixedWalk.ancestors``) and the tree update's re-sum of every node above a level from that level's nodes (each
node the sum of its descendants there, ``FixedUpdate.descendants``, the transpose).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor


def ancestor_matrix(level: int, levels: range, offset: int, width: int, like: Tensor) -> Tensor:
    """The sparse CSR matrix (2^level, width) of ones, of ``like``'s dtype and device, where row r (node r of
    ``level``) meets one column for each level l of ``levels`` (ascending, at most ``level``): its ancestor on l
    (itself on ``level``), at the column of that node's 1-based heap index minus ``offset``."""
    device = like.device
    heap = torch.arange(1 << level, device=device) + (1 << level)  # (2^level,) 1-based heap index of each node
    shifts = level - torch.arange(levels.start, levels.stop, device=device)  # (L,) from the highest level down
    columns = ((heap.unsqueeze(1) >> shifts) - offset).flatten()  # (2^level L,) ascending within each row
    starts = torch.arange(0, columns.numel() + 1, len(levels), device=device)  # (2^level + 1,) each row's first
    with warnings.catch_warnings():  # torch's notes that sparse CSR tensors are in beta
        warnings.filterwarnings("ignore", "Sparse", UserWarning)
        ones = like.new_ones(columns.numel())
        return torch.sparse_csr_tensor(starts, columns, ones, (1 << level, width), check_invariants=False)


def descendant_matrix(level: int, like: Tensor) -> Tensor:
    """The sparse CSR matrix (2^level - 1, 2^level) of ones, of ``like``'s dtype and device, where row r (a node
    above ``level``, heap order) meets the columns of its descendants on ``level``: the transpose of each node's
    ancestors on levels 0..level - 1, transposed on the host (once) and moved."""
    on_host = like.new_empty(0, device="cpu")
    ancestors = ancestor_matrix(level, range(level), 1, (1 << level) - 1, on_host)  # (2^level, 2^level - 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse", UserWarning)
        return ancestors.t().to_sparse_csr().to(like.device)  # CSC transposed is CSR, each row's columns sorted
