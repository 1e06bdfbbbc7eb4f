"""What one training step asks of the device, counted: the operators that launch work and the host syncs.

On a GPU every operator that does work is a kernel launch (5-20 us of host time each) and every host sync stalls
the queue until the device catches up, so a step's cost there is bounded below by these counts whatever its
arithmetic. Counts are exact and machine-independent, so they can be asserted by tests and compared across code
versions, unlike timings. ``DispatchCounter`` counts the aten operators dispatched while it is active:

- a **launch** is an operator that does work: not a view (``view``, ``transpose``, ``expand``, ``_unsafe_view``, ...),
  not a metadata query, not an allocation without a fill (``empty``), not host-side bookkeeping (the profiler's
  markers, a sparse tensor wrapped around existing tensors), and not the copy of a new sparse gradient that only the
  counting itself causes (``DispatchCounter.counting_copy``);
- a **sync** is an operator whose result the host must wait for: a tensor's value read on the host (``item``,
  ``int()``, ``bool()``, ``tolist``: ``_local_scalar_dense``), an output whose size depends on the data
  (``unique``, ``nonzero``, ``masked_select``, indexing with a boolean mask, ``repeat_interleave`` by a tensor
  without ``output_size``), or a comparison answered on the host (``equal``, ``is_nonzero``).

``count_train_step`` builds the default model with any ``output=`` / ``sampler=`` choice for a vocabulary of
``num_classes`` (Zipf counts and a random token stream, no corpus), takes warm-up steps, then counts one
``lmtrain.training.step.train_step``: forward, backward, clipping, the optimizer step and the after-step hook. On the
GPU paths the optimizer takes its multi-tensor (``foreach``) implementation, which torch picks by default for CUDA
tensors (one launch for all dense parameters instead of one each); on a CPU it would not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lab.step_fixture import step_fixture, synthetic_counts

# operators that neither launch work nor wait for the device: allocations without a fill and metadata
NO_LAUNCH = {
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "lift_fresh",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "resize_",
    "set_",
    "_has_compatible_shallow_copy_type",
    "record_stream",
    # host-side bookkeeping that launches nothing: the profiler's markers around an optimizer step, a view made
    # without autograd's view tracking, a sparse tensor wrapped around existing index and value tensors
    "_record_function_enter",
    "_record_function_enter_new",
    "_record_function_exit",
    "_unsafe_view",
    "_sparse_coo_tensor_with_dims_and_tensors",
    "is_coalesced",
}
SYNC_OPS = {
    "_local_scalar_dense",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "nonzero",
    "masked_select",
    "equal",
    "is_nonzero",
    "allclose",
    "_coalesce",  # the number of distinct rows of a sparse tensor
    "bincount",  # its length is the largest value + 1
}


def _is_view(func: Any) -> bool:
    """Whether an operator only returns aliases of its inputs (a view): it writes nothing and launches nothing."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _is_sync(name: str, overload: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if name in SYNC_OPS:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_") and _bool_index(args):
        return True  # a boolean mask is turned into indices (nonzero) on the host
    if name == "repeat_interleave" and overload in ("Tensor", "self_Tensor"):
        return kwargs.get("output_size") is None  # the output's length is the repeats' sum
    return False


@dataclass
class Counts:
    """The operators that launch work and the host syncs of a counted region, with the count of each operator."""

    launches: int = 0
    syncs: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    sync_ops: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "launches": self.launches,
            "syncs": self.syncs,
            "by_op": dict(self.by_op.most_common()),
            "sync_ops": dict(self.sync_ops),
        }


class DispatchCounter(TorchDispatchMode):
    """Counts the aten operators dispatched inside ``with DispatchCounter() as counter:`` (``counter.counts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = Counts()
        self.recent: tuple[str, str] = ("", "")  # the last two operators dispatched, views included

    def counting_copy(self, name: str, args: tuple[Any, ...]) -> bool:
        """Whether this operator is a copy that only counting causes: autograd keeps a new sparse gradient as the
        parameter's ``.grad`` without a copy unless something else holds its indices, which it asks right before
        (``_indices``, aliased by a ``detach``). Under a Python dispatch mode the mode's own wrapper of that alias is
        such a holder, so the sparse ``clone`` that follows happens only while counting: torch.profiler, which
        holds nothing, sees no such copy in the same step (tests/test_launch_budgets.py)."""
        return name == "clone" and self.recent == ("_indices", "detach") and bool(args) and args[0].is_sparse

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        overload = func._overloadname
        if _is_sync(name, overload, args, kwargs):
            self.counts.syncs += 1
            self.counts.sync_ops[name] += 1
        out = func(*args, **kwargs)
        counting_copy = self.counting_copy(name, args)
        self.recent = (self.recent[1], name)
        if name not in NO_LAUNCH and not _is_view(func) and not counting_copy:
            self.counts.launches += 1
            self.counts.by_op[name] += 1
            self.launched(name, args, kwargs, out)
        return out

    def launched(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Called after each operator that launches work, with what it read and returned; a subclass's hook."""


C = TypeVar("C", bound=DispatchCounter)


def count_train_step(
    overrides: list[str], num_classes: int, batch: tuple[int, int] = (20, 35), warmup: int = 2, seed: int = 0
) -> Counts:
    """The counts of one ``train_step`` of the model ``overrides`` describe (the default model otherwise), for a
    vocabulary of ``num_classes``, on a random batch of ``batch`` (B, T) token ids, after ``warmup`` steps."""
    return counted_step(DispatchCounter, overrides, num_classes, batch, warmup, seed).counts


def counted_step(
    counter_type: type[C], overrides: list[str], num_classes: int, batch: tuple[int, int], warmup: int, seed: int
) -> C:
    """The ``counter_type`` counter that was active during one ``train_step`` after ``warmup`` steps
    (``count_train_step``'s step)."""
    fixture = step_fixture(overrides, num_classes, warmup + 1, batch, seed)
    state = None
    for window in fixture.batches:  # the last one is counted
        with counter_type() as counter:
            state = fixture.step(window, state).state
    return counter


def count_draw(overrides: list[str], num_classes: int, positions: int = 700, seed: int = 0) -> Counts:
    """The counts of a sampled strategy's draw alone: its sampler's proposal for ``positions`` random query vectors
    and input tokens, and the m negatives drawn from it (what ``SampledOutput.draw`` asks of the sampler). Zero
    counts for a strategy without a sampler."""
    from lmtrain.config import compose_config
    from lmtrain.run.build import build_module

    cfg = compose_config(["data=synthetic", f"data.vocab_size={num_classes}", "trainer.accelerator=cpu", *overrides])
    torch.manual_seed(seed)
    counts = synthetic_counts(num_classes)
    stream = torch.multinomial(counts.double(), 20_000, replacement=True)
    module = build_module(cfg, num_classes, counts, stream)
    output = module.output
    if not hasattr(output, "sampler"):
        return Counts()
    hidden = torch.randn(positions, cfg.model.hidden_dim)  # (N, d): the encoder's output size
    inputs = torch.multinomial(counts.double(), positions, replacement=True)  # (N,) the previous words
    target = torch.multinomial(counts.double(), positions, replacement=True)  # (N,) the targets
    with torch.no_grad():
        query = output.query(hidden)  # (N, d'), the output layer's work
        for _ in range(2):  # the last one is counted
            with DispatchCounter() as counter:
                output.draw(output.propose(query, inputs, target if output.corrects_with_log_q else None))
    return counter.counts
