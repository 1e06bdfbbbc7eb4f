"""phi(w) of every class, kept beside a kernel tree: one feature vector per changed row, cheap shared scores."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.features import FeatureMap

AUTO_BYTES = 4 << 30  # the most memory `auto` gives the cache: 10^4-10^5 RFF classes in float32, 10^6 in bfloat16


class FeatureCache(nn.Module):
    """phi(w_j) of every class j, equal at all times to the features of the weights the tree holds.

    ``table`` (B L, F) holds class j in row j; the padding rows of the last buckets stay zero, so
    ``table.view(B, L, F)`` lays the classes out bucket by bucket. It pays where phi is costly to compute and
    cheap to read (random Fourier features: d x D multiply-adds and 2D sines and cosines per vector):

    - a changed row enters its bucket as phi(new) minus the cached phi(old): one feature vector per changed row
      instead of two, and a bucket recomputed to bound float drift is a sum of cached rows, not of new features;
    - a batch-shared step scores the members of a bucket as <psi, cached phi(w_j)>: a read, not a feature vector.

    It costs n F values (82 MB at n = 10^4 with 2D = 2048 float32 features, 8.2 GB at 10^6). ``mode``
    (``sampler.feature_cache``):

    - ``full``: in the weights' dtype; the tree equals the tree built without a cache, to float rounding;
    - ``bfloat16``: half the memory. The tree then holds sums of the bfloat16-rounded features (2^-9 relative
      error per entry, far below an RFF estimate's own 1 / sqrt(D) noise) and the batch-shared scores read the
      same rounded values, so log q stays the exact log-probability of what is drawn;
    - ``auto`` (the default): for feature maps that gain from it (``FeatureMap.cache_pays``), ``full`` when that
      fits in ``AUTO_BYTES`` (4 GiB), else ``bfloat16`` when that fits, else no cache;
    - ``off``.
    """

    def __init__(self, mode: str | bool | None) -> None:
        super().__init__()
        # YAML reads off as False; KernelOptions' metadata holds the choices (checked with the options)
        self.mode = "off" if mode is None or mode is False else "full" if mode is True else str(mode)
        self.register_buffer("table", torch.empty(0), persistent=False)  # derived state: never in checkpoints
        self.register_buffer("rows", torch.empty(0), persistent=False)  # (B L, d) prepared rows (``prepared_rows``)

    @property
    def active(self) -> bool:
        return self.table.numel() > 0

    def dtype_for(self, features: FeatureMap, rows: int, feats: int, dtype: torch.dtype) -> torch.dtype | None:
        """The table's dtype for ``rows`` x ``feats`` features of weights in ``dtype``, or None for no cache."""
        if self.mode == "off" or (self.mode == "auto" and not features.cache_pays):
            return None
        if self.mode != "auto":
            return dtype if self.mode == "full" else torch.bfloat16
        fits = [choice for choice in (dtype, torch.bfloat16) if rows * feats * choice.itemsize <= AUTO_BYTES]
        return fits[0] if fits else None

    def fill(self, features: FeatureMap, weight: Tensor, padded_rows: int, chunk_elements: int) -> None:
        """Compute phi of every row of ``weight`` (n, d) into a table of ``padded_rows`` rows (or drop the table when
        the mode gives none), in chunks of about ``chunk_elements`` temporary elements."""
        n, dim = weight.shape
        self.rows = weight.new_empty(0)  # made again from these weights at its next use
        feats = features.out_features(dim)
        dtype = self.dtype_for(features, padded_rows, feats, weight.dtype)
        if dtype is None:
            self.table = weight.new_empty(0)
            return
        if self.table.shape != (padded_rows, feats) or self.table.dtype != dtype or self.table.device != weight.device:
            self.table = weight.new_empty(padded_rows, feats, dtype=dtype)
        self.table[n:].zero_()
        for lo, hi in self.chunks(n, dim, chunk_elements):
            self.table[lo:hi] = features(weight[lo:hi])

    def chunks(self, n: int, dim: int, chunk_elements: int) -> list[tuple[int, int]]:
        """The row ranges ``fill`` computes phi for at once."""
        step = max(1, chunk_elements // (dim + self.table.shape[1]))
        return [(lo, min(lo + step, n)) for lo in range(0, n, step)]

    def kept_rows(self, features: FeatureMap, weight: Tensor, chunk_elements: int) -> dict[str, Tensor]:
        """The cached rows that a ``fill`` from ``weight`` (n, d) now would not give back bit for bit, with their
        class ids: phi of a few rows (a step's changed ones) rounds differently from phi of a chunk. For a checkpoint
        that carries the tree as kept (``KernelSampler.kept_state``); ``put_rows`` writes them back over a fill."""
        if not self.active:
            return {}
        n = weight.shape[0]
        ids = [
            lo + (features(weight[lo:hi]).to(self.table.dtype) != self.table[lo:hi]).any(1).nonzero().view(-1)
            for lo, hi in self.chunks(n, weight.shape[1], chunk_elements)
        ]  # (k,) in all
        kept = {"table_ids": torch.cat(ids)}
        kept["table_rows"] = self.table.index_select(0, kept["table_ids"])  # (k, F)
        if self.rows.numel():  # the GPU paths' prepared rows, kept current row by row too
            differ = (features.prepare(weight) != self.rows[:n]).any(1).nonzero().view(-1)  # (k',)
            kept |= {"prepared_ids": differ, "prepared_rows": self.rows.index_select(0, differ)}
        return kept

    def put_rows(self, features: FeatureMap, weight: Tensor, kept: dict[str, Tensor]) -> None:
        """Write the rows ``kept_rows`` returned over a table that ``fill`` made from the same weights."""
        if "table_ids" in kept:
            self.table.index_copy_(0, kept["table_ids"].to(self.table.device), kept["table_rows"].to(self.table))
        if kept.get("prepared_ids") is not None and kept["prepared_ids"].numel():
            rows = self.prepared_rows(features, weight)  # made now from the weights, then the kept rows over them
            if rows is not None:
                rows.index_copy_(0, kept["prepared_ids"].to(rows.device), kept["prepared_rows"].to(rows))

    def bucket_sums(self, buckets: Tensor, bucket_size: int, dtype: torch.dtype) -> Tensor:
        """Sum of the cached features of each bucket's classes: buckets (c,) -> (c, F) in ``dtype``."""
        blocks = self.table.view(-1, bucket_size, self.table.shape[1])  # (B, L, F)
        return blocks.index_select(0, buckets).sum(1, dtype=dtype)

    def swap(self, features: FeatureMap, weight: Tensor, rows: Tensor, keep: Tensor) -> Tensor:
        """Cache phi(weight[rows]) for ``rows`` (c,) and return phi(new) - phi(old) (k, F) in the weights' dtype for
        ``rows[keep]``, where phi(old) is what the cache held: exactly what the tree's sums hold for those rows."""
        new = features(weight.index_select(0, rows)).to(self.table.dtype)  # (c, F), rounded as the cache stores it
        kept_new, kept_rows = (new, rows) if bool(keep.all()) else (new[keep], rows[keep])
        old = self.table.index_select(0, kept_rows)  # (k, F) before the table takes the new rows
        self.table.index_copy_(0, rows, new)
        self.rows = self.rows.new_empty(0)  # the CPU paths' update does not keep the prepared rows
        return kept_new.to(weight.dtype).sub_(old)  # in the weights' dtype (may reuse `new`'s storage: cached now)

    def prepared_rows(self, features: FeatureMap, weight: Tensor) -> Tensor | None:
        """Every class row as the kernel reads it (``features.prepare``: RFF's unit rows), (B L, d), zero on the
        padding rows like ``table``, for the GPU paths' in-bucket scores: one gather of them, with no clamp of the
        padding ids, where gathered rows took a clamp, a gather and a normalization. None without a cache or for a
        feature map that prepares nothing. Made at the first call after ``fill``, kept current by ``keep_prepared``
        (the GPU paths' update); n d more values (800 MB at 10^6 classes of 200 dimensions)."""
        if not self.active or not features.prepares:
            return None
        n, dim = weight.shape
        shape, rows = (self.table.shape[0], dim), self.rows
        if rows.shape != shape or rows.dtype != weight.dtype or rows.device != weight.device:
            with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor: the update writes into it
                self.rows = rows = weight.new_zeros(shape)
                rows[:n] = features.prepare(weight)
        return rows

    def keep_prepared(self, ids: Tensor | None, prepared: Tensor) -> None:
        """The changed classes ``ids`` (R,) (None: all n) have the prepared rows ``prepared`` (R, d) now: written
        where ``prepared_rows`` keeps them."""
        if not self.rows.numel():
            return
        if ids is None:
            self.rows[: prepared.shape[0]] = prepared
        else:
            self.rows.index_copy_(0, ids, prepared)

    def scores(self, psi: Tensor, ids: Tensor) -> Tensor:
        """<psi, cached phi(w_j)> for psi (F,) and class ids (...) -> (...)."""
        rows = self.table.index_select(0, ids.reshape(-1)).to(psi.dtype)  # (K, F)
        return (rows @ psi).view(ids.shape)
