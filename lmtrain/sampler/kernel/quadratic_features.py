"""The quadratic kernel's feature map (Blanc & Rendle 2018), in node sums of second moments (docs/strategies.md)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lmtrain.common.constants import with_ones_column
from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.options import QuadraticOptions


class QuadraticFeatures(FeatureMap):
    """K(a, b) = alpha * (a . b)^2 + 1 (Blanc & Rendle 2018), used with the absolute softmax.

    phi(u) = [sqrt(alpha) * vec(u u^T), 1] in the symmetric upper-triangle vectorization (off-diagonal entries
    scaled by sqrt(2)), so phi has d (d + 1) / 2 + 1 entries (812 MB a cache at n = 10^4, d' = 201) and a node
    stores [sqrt(alpha) * vec(S(C)), |C|] with S(C) = sum of w w^T over its classes.
    """

    cache_pays = False  # node sums, bucket scores: d x d products, cheaper than reading F = d (d + 1) / 2 per class

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.alpha = float(QuadraticOptions(**options).alpha)  # the keys left out take their defaults
        self._triangles: dict[tuple, tuple[Tensor, Tensor, Tensor, Tensor]] = {}

    def out_features(self, in_features: int) -> int:
        return in_features * (in_features + 1) // 2 + 1

    def _triangle(self, dim: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Row and column of each upper-triangle entry, its index in a flattened (d, d) matrix (one flat index_select
        gathers it where (row, column) pairs take two; docs/architecture.md, measured design choices), its scale."""
        key = (dim, device, dtype)
        if key not in self._triangles:
            rows, cols = torch.triu_indices(dim, dim, device=device)  # (d (d + 1) / 2,) each
            scale = torch.where(rows == cols, math.sqrt(self.alpha), math.sqrt(2 * self.alpha)).to(dtype)
            self._triangles[key] = rows, cols, rows * dim + cols, scale
        return self._triangles[key]

    def log_kernel_dot(self, dot: Tensor) -> Tensor:
        return torch.log1p(self.alpha * dot.square())

    def forward(self, x: Tensor) -> Tensor:
        rows, cols, _, scale = self._triangle(x.shape[-1], x.device, x.dtype)
        return with_ones_column(x[..., rows] * x[..., cols] * scale)  # (..., d (d + 1) / 2 + 1)

    def node_sums(self, rows: Tensor, valid: Tensor, out: Tensor | None = None) -> Tensor:
        rows = rows * valid.unsqueeze(-1)
        second = rows.transpose(1, 2) @ rows  # (c, d, d) = S(bucket)
        out = second.new_empty(second.shape[0], self.out_features(second.shape[-1])) if out is None else out
        self._vectorize(second, out[:, :-1])  # each part written where it belongs: no join, no copy
        torch.sum(valid, 1, dtype=out.dtype, out=out[:, -1])  # (c,) the classes of each bucket
        return out

    def delta_sums(self, new: Tensor, old: Tensor, valid: Tensor) -> Tensor:
        # S(new) - S(old) = [new; old]^T [new; -old]: one (d, d) product per bucket; the counts do not change
        mask = valid.unsqueeze(-1).to(new.dtype)
        new, old = new * mask, old * mask
        second = torch.cat([new, old], 1).transpose(1, 2) @ torch.cat([new, -old], 1)  # (c, d, d) over 2L rows
        return torch.cat([self._vectorize(second), second.new_zeros(second.shape[0], 1)], dim=1)

    def _vectorize(self, second: Tensor, out: Tensor | None = None) -> Tensor:
        """(c, d, d) matrices -> (c, d (d + 1) / 2) scaled upper triangles (into ``out`` where given)."""
        _, _, flat, scale = self._triangle(second.shape[-1], second.device, second.dtype)
        return torch.mul(second.flatten(1).index_select(1, flat), scale, out=out)

    def inner(self, psi: Tensor, x: Tensor) -> Tensor:
        # psi = [sqrt(alpha) vec(A), c] in the triangle layout: <psi, phi(x)> = x^T A' x + c, A' upper triangular
        _, _, flat, scale = self._triangle(x.shape[-1], x.device, x.dtype)
        upper = x.new_zeros(x.shape[-1] ** 2)
        upper[flat] = psi[:-1] * scale
        upper = upper.view(x.shape[-1], x.shape[-1])  # (d, d): no (..., F) features of x are formed
        return ((x @ upper) * x).sum(-1) + psi[-1]

    def weighted_sum(self, x: Tensor, weights: Tensor) -> Tensor:
        second = (x * weights.unsqueeze(1)).T @ x  # (d, d) = sum_i weights_i x_i x_i^T: no (N, F) features
        return torch.cat([self._vectorize(second.unsqueeze(0))[0], weights.sum().view(1)])

    def sum_elements(self, bucket_size: int, in_features: int) -> int:
        return bucket_size * in_features + 2 * self.out_features(in_features)

    def mixture(self, x: Tensor, root: Tensor, floor: Tensor) -> Tensor:
        inv_z = torch.maximum(self.inner(root, x), floor).reciprocal()  # (N,): no (N, F) features of x formed
        return self.weighted_sum(x, inv_z / inv_z.sum())

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"
