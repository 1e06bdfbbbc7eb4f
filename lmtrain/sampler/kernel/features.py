"""Feature maps phi with K(a, b) = <phi(a), phi(b)> for the kernel proposals (docs/strategies.md): the interface
and random Fourier features (``quadratic_features``: the quadratic kernel's)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.sampler.options import RFFOptions


class FeatureMap(nn.Module):
    """A kernel K(a, b) = <phi(a), phi(b)> (exact or in expectation) that depends on a . b only.

    ``prepare`` maps a raw vector to the space the kernel is defined on (identity, or unit norm: ``prepares``);
    ``log_kernel_dot`` is log K of the dot product of two prepared vectors; ``forward`` is phi of raw vectors
    (``of_prepared``: of prepared ones). A tree node stores the sum of phi over its classes (``node_sums``).
    ``cache_pays``: whether keeping phi(w) of every class (``FeatureCache``) saves more than reading it costs.
    """

    cache_pays, prepares = True, False  # phi costs arithmetic per vector (RFF: d x D multiply-adds, 2D sin and cos)

    def out_features(self, in_features: int) -> int:
        """Dimension of phi(x) for x of dimension ``in_features``."""
        raise NotImplementedError

    def prepare(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., d) vectors on which the kernel is a function of the dot product."""
        return x

    def of_prepared(self, prepared: Tensor, dtype: torch.dtype | None = None) -> Tensor:  # in dtype (None: theirs)
        return self(prepared).to(dtype or prepared.dtype)  # the same features, fewer operators

    def log_kernel_dot(self, dot: Tensor) -> Tensor:
        """log K(a, b) from the dot product of prepared a and b (any shape, elementwise)."""
        raise NotImplementedError

    def kernel(self, a: Tensor, b: Tensor) -> Tensor:
        """Exact K(a, b) in the original space; a (..., d) and b (..., d) broadcast to (...)."""
        dot = (self.prepare(a) * self.prepare(b)).sum(-1)
        return self.log_kernel_dot(dot).exp()

    def node_sums(self, rows: Tensor, valid: Tensor, out: Tensor | None = None) -> Tensor:
        """Sum of phi over the valid rows of each bucket: rows (c, L, d), valid (c, L) -> (c, F), written into
        ``out`` where given (e.g. the tree's leaves)."""
        return torch.sum(self(rows) * valid.unsqueeze(-1), 1, out=out)

    def delta_sums(self, new: Tensor, old: Tensor, valid: Tensor) -> Tensor:
        """node_sums(new, valid) - node_sums(old, valid): new and old rows (c, L, d) -> (c, F)."""
        both = self.node_sums(torch.cat([new, old]), valid.repeat(2, 1))  # (2c, F)
        return both[: new.shape[0]] - both[new.shape[0] :]

    def inner(self, psi: Tensor, x: Tensor) -> Tensor:
        """<psi, phi(x)> for one feature-space vector psi (F,) and raw vectors x (..., d) -> (...)."""
        return self(x) @ psi

    def weighted_sum(self, x: Tensor, weights: Tensor) -> Tensor:
        """sum_i weights_i phi(x_i) for raw vectors x (N, d) and weights (N,) -> (F,)."""
        return weights @ self(x)

    def sum_elements(self, bucket_size: int, in_features: int) -> int:
        """Temporary tensor elements ``node_sums`` needs per bucket (for memory-bounded chunks)."""
        return bucket_size * self.out_features(in_features)

    def mixture(self, x: Tensor, root: Tensor, floor: Tensor) -> Tensor:
        """sum_i c_i phi(x_i) with c_i ∝ 1 / max(<phi(x_i), root>, floor), sum_i c_i = 1 (``KernelTree.mixture``):
        phi of the N vectors (N, d) is formed once."""
        phi = self(x)  # (N, F)
        inv_z = torch.maximum(phi @ root, floor).reciprocal()  # 1 / Z_i, (N,)
        return (inv_z / inv_z.sum()) @ phi


class RandomFourierFeatures(FeatureMap):
    """Random Fourier features of the Gaussian kernel on unit vectors (Rawat et al. 2019).

    ``D`` is the number of random frequencies: Omega (D, d) has rows ~ N(0, nu I) and phi(u) = D^{-1/2}
    [cos(Omega u), sin(Omega u)] on u / |u| has 2 D entries, so that E[phi(x) . phi(y)] = exp(-nu |x - y|^2 / 2)
    = exp(nu (cos(x, y) - 1)), proportional to exp(nu cos). For a feature dimension D' (2 D entries), D = D' / 2.
    Omega is drawn once from ``seed`` when the input size is first seen and is a persistent buffer, so checkpoints
    carry it and a resumed run samples from the same features.
    ``projection="bfloat16"`` computes Omega u from bfloat16 copies of u and Omega (float32 sums and output), which
    pays only on CPUs with native bfloat16 products (AVX512-BF16): a slightly different feature map (8 significant
    bits move the kernel estimates far less than their own 1 / sqrt(D) noise; docs/strategies.md), used alike for
    queries and classes, so every q and log q is exactly that of the tree walked.
    """

    prepares = True  # to unit vectors

    def __init__(self, **options: Any) -> None:
        super().__init__()
        opts = RFFOptions(**options)  # D, nu, seed, temperature, projection; the keys left out take their defaults
        self.projection = opts.projection
        nu = opts.nu if opts.temperature is None else 1.0 / opts.temperature**2
        self.num_frequencies, self.nu, self.seed = int(opts.D), float(nu), int(opts.seed)
        self.register_buffer("omega", torch.empty(self.num_frequencies, 0))  # drawn on first use

    def out_features(self, in_features: int) -> int:
        return 2 * self.num_frequencies

    def frequencies(self, in_features: int) -> Tensor:
        """Omega (D, d); drawn from ``seed`` (not the global RNG) the first time d is seen, the same on every CPU."""
        if self.omega.shape[1] == 0:
            gen = torch.Generator().manual_seed(self.seed)
            # drawn in float64: torch's float32 normal sampler rounds differently on AVX2 CPUs, float64's is the same
            # on every CPU, so a seed gives the same frequencies on every machine
            shape = (self.num_frequencies, in_features)
            omega = torch.randn(shape, generator=gen, dtype=torch.float64) * math.sqrt(self.nu)  # (D, d)
            self.omega = omega.to(self.omega.device, self.omega.dtype)
        if self.omega.shape[1] != in_features:
            raise ValueError(
                f"RandomFourierFeatures was built for {self.omega.shape[1]}-dim vectors but got "
                f"{in_features}-dim ones; use one sampler per output layer"
            )
        return self.omega

    def prepare(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1)

    def log_kernel_dot(self, dot: Tensor) -> Tensor:
        return self.nu * (dot - 1.0)

    def project(self, x: Tensor, prepared: bool = False) -> Tensor:
        """Omega x / |x| (..., D), in float32 or from bfloat16 inputs (``projection``); ``prepared``: x is x / |x|."""
        omega = self.frequencies(x.shape[-1])
        unit = x if prepared else self.prepare(x)
        if self.projection == "bfloat16":
            return (unit.bfloat16() @ omega.bfloat16().T).to(x.dtype)
        return unit @ omega.to(x.dtype).T

    def of_prepared(self, prepared: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        return self.forward(prepared, prepared=True, dtype=dtype)

    def forward(self, x: Tensor, prepared: bool = False, dtype: torch.dtype | None = None) -> Tensor:
        proj = self.project(x, prepared)  # (..., D)
        # cos and sin written in place, then one scale in place or into ``dtype`` (one pass, not a scale and a cast):
        # fewer passes over the (..., 2D) output than cat + divide (docs/architecture.md, measured design choices)
        out = proj.new_empty(*proj.shape[:-1], 2 * self.num_frequencies)
        torch.cos(proj, out=out[..., : self.num_frequencies])
        torch.sin(proj, out=out[..., self.num_frequencies :])
        scale, cast = 1 / math.sqrt(self.num_frequencies), dtype not in (None, out.dtype)
        return torch.mul(out, scale, out=out.new_empty(out.shape, dtype=dtype)) if cast else out.mul_(scale)

    def node_sums(self, rows: Tensor, valid: Tensor, out: Tensor | None = None) -> Tensor:
        proj = self.project(rows)  # (c, L, D)
        mask = valid.to(rows.dtype).unsqueeze(1)  # (c, 1, L): sums by batched row-vector products
        sums = torch.cat([torch.bmm(mask, proj.cos()), torch.bmm(mask, proj.sin())], dim=-1)  # (c, 1, 2D)
        return torch.div(sums.squeeze(1), math.sqrt(self.num_frequencies), out=out)

    def sum_elements(self, bucket_size: int, in_features: int) -> int:
        return bucket_size * (in_features + 2 * self.num_frequencies)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        saved = state_dict.get(prefix + "omega")
        if saved is not None and saved.shape != self.omega.shape:  # adopt the checkpoint's Omega
            self.omega = torch.empty_like(saved, device=self.omega.device, dtype=self.omega.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        return f"D={self.num_frequencies}, nu={self.nu}, seed={self.seed}, projection={self.projection}"
