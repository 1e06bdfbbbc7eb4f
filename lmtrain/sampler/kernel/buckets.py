"""The weights of the classes inside a kernel tree's buckets: for per-example queries and for a mixture's psi."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmtrain.sampler.kernel.features import FeatureMap
from lmtrain.sampler.kernel.store import TreeStore
from lmtrain.sampler.kernel.walk import TreeWalk


class BucketScores(NamedTuple):
    """One psi's in-bucket log weights (B, L), filled for the buckets marked ``done`` (B,): a step's table."""

    table: Tensor
    done: Tensor


class BucketScorer:
    """Log-weights of the members of buckets, the last step of a ``KernelTree`` draw: per example, log K(h, w_j)
    computed exactly in the original space; for a batch's mixture, log max(<psi, phi(w_j)>, eps). Padding slots of
    the last buckets get -inf. It reads the store's weights (and feature cache) at every call and takes the walk's
    cost rule (``TreeWalk.dense``) for choosing one GEMM over per-walker gathers.
    """

    def __init__(self, features: FeatureMap, store: TreeStore, walk: TreeWalk) -> None:
        self.features, self.store, self.walk = features, store, walk
        self._offsets: dict[tuple[int, int, int, torch.device], Tensor] = {}  # the last ``query_offsets``

    def empty(self, psi: Tensor) -> BucketScores:
        """An empty table of psi's in-bucket log weights, filled as buckets are asked for."""
        done = torch.zeros(self.store.num_buckets, dtype=torch.bool, device=psi.device)
        return BucketScores(psi.new_empty(self.store.num_buckets, self.store.bucket_size), done)

    def kernel(self, query: Tensor, bucket: Tensor, k: int, prepared: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """log K(h, w_j) for the members of each walker's bucket (W,) -> (W, L) (-inf on padding),
        and the member ids (W, L); walker w belongs to query w // k. ``prepared``: ``features.prepare(query)``
        when the caller has it. The walk's: one GEMM with every class padded to whole buckets, or rows gathered in
        cache-sized blocks (``TreeWalk.dense`` decides)."""
        store, n_query = self.store, query.shape[0]
        size = store.bucket_size
        ids = store.member_ids(bucket)  # (W, L)
        prepared = self.features.prepare(query) if prepared is None else prepared
        if self.walk.dense(store.num_buckets, n_query, k):  # all dot products in one GEMM, then pick
            dots = prepared @ self.features.prepare(store.weight).T  # (N, n)
            dots = nn.functional.pad(dots, (0, store.num_buckets * size - store.num_classes))
            qrow = torch.arange(n_query, device=bucket.device).repeat_interleave(k)  # (W,)
            dots = dots.view(-1, size).index_select(0, bucket + qrow * store.num_buckets)  # (W, L)
        else:
            dots = self.gathered_dots(prepared, ids, k, None, query.shape[1])
        return self.log_kernel(dots, ids), ids

    def kernel_direct(
        self, query: Tensor, bucket: Tensor, k: int, prepared: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``kernel`` in the fixed backend's operators: the class rows as the kernel reads them kept beside the
        feature cache (``FeatureCache.prepared_rows``, where there is one), and the dense GEMM's entries picked with
        one ``take`` (no padding)."""
        store, n_query = self.store, query.shape[0]
        ids = store.member_ids(bucket)  # (W, L)
        prepared = self.features.prepare(query) if prepared is None else prepared
        kept = store.cache.prepared_rows(self.features, store.weight)  # (B L, d) or None
        if self.walk.dense(store.num_buckets, n_query, k):  # one GEMM, then pick (no padding)
            rows = self.features.prepare(store.weight) if kept is None else kept[: store.num_classes]  # (n, d)
            dots = prepared @ rows.T  # (N, n)
            flat = ids.clamp(max=store.num_classes - 1) + self.query_offsets(n_query, k, store.num_classes, ids.device)
            dots = dots.view(-1).take(flat)  # (W, L): entry [w // k, ids[w]] of the (N, n) products
        else:
            dots = self.gathered_dots(prepared, ids, k, kept, query.shape[1])
        return self.log_kernel(dots, ids), ids

    def gathered_dots(self, prepared: Tensor, ids: Tensor, k: int, kept: Tensor | None, dim: int) -> Tensor:
        """<prepared query, prepared row> (W, L) of every walker's members ``ids`` (W, L), rows gathered in blocks
        of queries (``TreeStore.blocks``): from ``kept`` (the prepared rows, padding rows included: no clamp) where
        given, else prepared from the weights."""
        store, size = self.store, self.store.bucket_size

        def block(lo: int, hi: int) -> Tensor:
            if kept is not None:  # padding rows too: no clamp
                rows = kept.index_select(0, ids[lo * k : hi * k].view(-1)).view(hi - lo, k * size, -1)
            else:
                where = ids[lo * k : hi * k].clamp(max=store.num_classes - 1).view(-1)
                rows = self.features.prepare(store.weight.index_select(0, where)).view(hi - lo, k * size, -1)
            return torch.bmm(prepared[lo:hi].unsqueeze(1), rows.transpose(1, 2)).view(-1, size)

        return store.blocks(block, prepared.shape[0], k * size * dim)

    def log_kernel(self, dots: Tensor, ids: Tensor) -> Tensor:
        """log K from the prepared dot products (W, L), -inf on the padding slots of the last buckets."""
        store = self.store
        logk = self.features.log_kernel_dot(dots)
        if store.num_buckets * store.bucket_size > store.num_classes:  # padding slots of the last buckets
            logk = logk.masked_fill(ids >= store.num_classes, float("-inf"))
        return logk

    def query_offsets(self, n_query: int, k: int, stride: int, device: torch.device) -> Tensor:
        """(W, 1) the first entry of walker w's query, (w // k) x ``stride``, in a flat (N, stride) table: made once
        per shape and device (``kernel_direct``'s dense scoring)."""
        key = (n_query, k, stride, device)
        if key not in self._offsets:
            self._offsets = {key: torch.arange(n_query, device=device).repeat_interleave(k).unsqueeze(1) * stride}
        return self._offsets[key]

    def mixture(self, psi: Tensor, bucket: Tensor, scores: BucketScores | None = None) -> tuple[Tensor, Tensor]:
        """log max(<psi, phi(w_j)>, eps) for the members of each bucket (W,) -> (W, L) (-inf on padding), and the
        member ids (W, L). A step asks twice for one psi (its draws, then its targets' log q-bar), mostly for the
        same buckets: with the step's ``scores`` each bucket is scored once (B x L values), with phi(w_j) read from
        the feature cache when there is one, in memory-bounded chunks."""
        store = self.store
        table, done = scores if scores is not None else self.empty(psi)
        distinct = torch.unique(bucket)
        todo = distinct[~done[distinct]]  # (u,) buckets not scored yet for this psi
        cached = store.cache.active

        def block(lo: int, hi: int) -> Tensor:
            if cached:  # the cache's padding rows are zero: their scores clamp to eps and are masked below
                members = store.member_ids(todo[lo:hi])  # (b, L)
                valid = members < store.num_classes
                scores = store.cache.scores(psi, members).clamp_min(store.eps)  # (b, L)
            else:
                rows, valid = store.members(todo[lo:hi])  # (b, L, d), (b, L)
                scores = self.features.inner(psi, rows).clamp_min(store.eps)  # (b, L)
            return scores.log().masked_fill(~valid, float("-inf"))

        if todo.numel():
            dim = psi.numel() if cached else store.weight.shape[1]
            size = store.bucket_size
            per_bucket = size * dim if cached else self.features.sum_elements(size, dim)
            table[todo] = store.blocks(block, todo.numel(), per_bucket)
            done[todo] = True
        return table[bucket], store.member_ids(bucket)  # (W, L) each

    def mixture_direct(self, psi: Tensor, bucket: Tensor) -> tuple[Tensor, Tensor]:
        """``mixture``'s log weights (W, L) and member ids (W, L) for buckets (W,), each scored where it stands
        (a bucket asked for twice is scored twice): fixed shapes, no deduplication (the fixed backend's)."""
        store = self.store
        members = store.member_ids(bucket)  # (W, L)
        if store.cache.active:  # the cache's padding rows are zero: masked below
            scores = store.cache.scores(psi, members)  # (W, L)
            padding = members >= store.num_classes
        else:
            rows, valid = store.members(bucket)  # (W, L, d)
            scores, padding = self.features.inner(psi, rows), ~valid  # (W, L) each
        return scores.clamp_min(store.eps).log().masked_fill(padding, float("-inf")), members
