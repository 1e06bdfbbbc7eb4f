"""What one training step moves through device memory, modelled per operator: a GPU's bound where launches are not.

On a GPU a step that launches few operators can still be slow because its operators read and write a lot: gathers
of node rows, elementwise passes over (N, n) logits, the tree update. ``TrafficCounter`` counts, besides the
launches and syncs of ``DispatchCounter``, the bytes each operator must at least read and write if it streams each
of its tensors once:

- an operator reads its tensor inputs and writes its outputs (an in-place one reads and writes its ``self``); a
  tensor passed as ``out=`` is written, not read;
- a gather (``index_select``, ``index``, ``gather``, ``embedding``, ...) reads only the rows it picks (as many bytes
  as it writes), not its whole source, and its indices;
- a scatter into a tensor (``index_add_``, ``index_copy_``, ``index_put_``, ``scatter_add_``, ...) reads and writes
  only the rows it touches (the size of its source), and reads its source and indices;
- a sparse tensor counts its indices and values, not its dense shape, and a dense tensor updated in place by a
  sparse one (a sparse SGD step) reads and writes only the rows the sparse one names;
- ``nll_loss_forward`` reads only each row's target entry of its log-probabilities (a gather), and
  ``nll_loss_backward`` writes its (N, C) gradient without reading them (their shape only).

Beside the bytes it counts the multiply-adds of the products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``,
``addmv``; a sparse operand's entries, not its dense shape), the other bound a step can meet: the bytes time a GPU's
memory, the multiply-adds its arithmetic. Elementwise arithmetic is not counted (memory bounds it), nor the LSTM's
fused kernel (``mkldnn_rnn_layer`` here, cuDNN's on a GPU), the same for every output strategy.

Caches, fusion inside a library kernel (a GEMM reads a block several times from cache, not from memory) and
atomics are not modelled, so the figure is a floor on traffic, not a time. It is exact and machine-independent:
a GPU at B bytes/s needs at least bytes / B for the step's operators (``scripts/bench_traffic.py`` prints it beside
the launches), and a change that removes a pass over a large tensor shows here on any machine.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

import lmtrain
from lab.launches import Counts, DispatchCounter, counted_step

PACKAGE = os.path.dirname(lmtrain.__file__) + os.sep  # where lmtrain's own code lies
KIND = "bench_traffic"  # a scripts/bench_traffic.py record
GATHERS = {"index_select", "index", "gather", "embedding", "take", "_embedding_bag", "embedding_bag"}
SCATTERS = {
    "index_add_",
    "index_add",
    "index_copy_",
    "index_copy",
    "index_put_",
    "index_put",
    "_index_put_impl_",
    "scatter_add_",
    "scatter_add",
    "scatter_",
    "scatter",
    "index_fill_",
    "index_reduce_",
}


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor holds: for a sparse (COO or CSR) tensor its indices and values, not its dense shape."""
    if t.layout == torch.sparse_coo:
        return tensor_bytes(t._indices()) + tensor_bytes(t._values())
    if t.layout == torch.sparse_csr:
        return sum(tensor_bytes(part) for part in (t.crow_indices(), t.col_indices(), t.values()))
    return t.numel() * t.element_size()


def operator_bytes(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """The bytes the operator ``name`` reads and writes at least (the module docstring's model)."""
    written = kwargs.get("out")
    reads = [t for t in tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))[0] if _is_tensor(t)]
    outputs = [t for t in tree_flatten(out if written is None else written)[0] if _is_tensor(t)]
    if name in GATHERS:  # the picked rows (the output's size) and the indices; not the whole source
        picked = sum(tensor_bytes(t) for t in outputs)
        indices = sum(tensor_bytes(t) for t in reads[1:] if not t.is_floating_point())
        return 2 * picked + indices
    if name == "nll_loss_forward":  # the target's entry of each row of args[0], and the targets (and weights)
        picked = reads[1].numel() * reads[0].element_size()
        return picked + sum(tensor_bytes(t) for t in [*reads[1:], *outputs])
    if name == "nll_loss_backward":  # args[1], the log-probabilities, is read for its shape only
        return sum(tensor_bytes(t) for t in reads if t is not args[1]) + sum(tensor_bytes(t) for t in outputs)
    sparse = [t for t in reads if t.layout != torch.strided]
    if sparse and reads[0].layout == torch.strided and name in ("add_", "sub_", "add", "sub", "copy_"):
        # a dense tensor plus a sparse one (a sparse SGD step): the sparse rows read, the rows they touch read and
        # written (a non-in-place form writes its whole output too)
        touched = sum(tensor_bytes(t._values() if t.layout == torch.sparse_coo else t) for t in sparse)
        whole = 0 if name.endswith("_") else 2 * tensor_bytes(reads[0])
        return sum(tensor_bytes(t) for t in sparse) + 2 * touched + whole
    if name in SCATTERS:  # the touched rows of the destination read and written, the source and indices read
        source = sum(tensor_bytes(t) for t in reads[1:])
        largest = max((tensor_bytes(t) for t in reads[1:] if t.is_floating_point()), default=source)
        return source + 2 * largest
    return sum(tensor_bytes(t) for t in reads) + sum(tensor_bytes(t) for t in outputs)


PRODUCTS = {"mm": 0, "addmm": 1, "bmm": 0, "baddbmm": 1, "mv": 0, "addmv": 1}  # name -> index of the left factor


def operator_macs(name: str, args: tuple[Any, ...]) -> int:
    """The multiply-adds of a product ``name`` (0 for any other operator): (m, k) x (k, n) takes m k n, a batch of
    them B m k n, and a sparse left factor its entries x n."""
    if name not in PRODUCTS:
        return 0
    left, right = args[PRODUCTS[name]], args[PRODUCTS[name] + 1]
    columns = right.shape[-1] if right.dim() > 1 else 1
    if left.layout != torch.strided:
        return left._nnz() * columns
    return left.numel() * columns


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


@dataclass
class Traffic:
    """Bytes moved in a counted region: the total and per (operator, where in lmtrain's code it was called), and
    the products' multiply-adds."""

    bytes: int = 0
    macs: int = 0
    by_site: Counter[tuple[str, str]] = field(default_factory=Counter)

    def top(self, count: int) -> list[dict[str, Any]]:
        """The ``count`` sites that move the most, largest first."""
        return [{"op": op, "where": where, "bytes": b} for (op, where), b in self.by_site.most_common(count)]


class TrafficCounter(DispatchCounter):
    """``DispatchCounter`` that also models the bytes each operator moves (``counter.traffic``)."""

    def __init__(self) -> None:
        super().__init__()
        self.traffic = Traffic()

    def launched(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        moved = operator_bytes(name, args, kwargs, out)
        self.traffic.bytes += moved
        self.traffic.macs += operator_macs(name, args)
        self.traffic.by_site[(name, _call_site())] += moved


def _call_site() -> str:
    """The innermost frame in lmtrain's own code (the package, not this lab), as ``path:line`` under lmtrain/."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(PACKAGE):
            return f"{frame.filename[len(PACKAGE) :].replace(os.sep, '/')}:{frame.lineno}"
    return "torch"


def count_step_traffic(
    overrides: list[str], num_classes: int, batch: tuple[int, int] = (20, 35), warmup: int = 2, seed: int = 0
) -> tuple[Counts, Traffic]:
    """Launches, syncs and modelled bytes of one ``train_step`` (``launches.count_train_step``'s step)."""
    counter = counted_step(TrafficCounter, overrides, num_classes, batch, warmup, seed)
    return counter.counts, counter.traffic
