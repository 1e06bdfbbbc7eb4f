"""Optimizers, gradient clipping and the mean over DDP ranks that handle sparse row gradients (docs/strategies.md,
sparse row updates): DDP itself cannot reduce sparse gradients, so ``ddp_ignored`` takes them (and the output's derived
buffers) out of its hands and ``mean_over_ranks`` averages them before the optimizer step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lmtrain.common.optim_options import OptimOptions
from lmtrain.common.ranges import require_choice

_NO_SPARSE_KEYS = ("weight_decay", "momentum")  # options that would touch every output row each step


class MixedOptimizer(torch.optim.Optimizer):
    """One ``torch.optim.Optimizer`` made of child optimizers over disjoint parameter sets.

    Used for Adam on the dense parameters beside SparseAdam (or Adagrad) on the sparse output rows.
    ``param_groups`` are the children's own group dicts (so LR schedulers that change ``group['lr']``
    reach them) and all children share one ``state`` dict, so ``state_dict`` / ``load_state_dict``
    use the standard format. ``step(closure)`` calls the closure exactly once, then steps every child.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        if not optimizers:
            raise ValueError("MixedOptimizer needs at least one child optimizer")
        params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        super().__init__(params, {})
        self.optimizers = optimizers
        self.param_groups = [group for opt in optimizers for group in opt.param_groups]
        for opt in optimizers:
            self.state.update(opt.state)  # e.g. Adagrad's accumulators, created at construction
        self._link()

    def _link(self) -> None:
        """Point the children at this optimizer's group dicts and shared state (after init or load)."""
        start = 0
        for opt in self.optimizers:
            count = len(opt.param_groups)
            opt.param_groups = self.param_groups[start : start + count]
            opt.state = self.state
            start += count

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # replaces self.state and the group dicts
        self._link()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers:
            opt.step()
        return loss


def sparse_rows_allowed(optim: Mapping[str, Any]) -> bool:
    """Whether the optimizer ``optim`` describes can keep an output's rows sparse: none of its options moves every
    row at every step (weight decay, momentum); ``output.sparse=auto`` resolves to this."""
    return not any(optim.get(key) for key in _NO_SPARSE_KEYS)


def sparse_rows_match_dense(optim: Mapping[str, Any]) -> bool:
    """Whether the optimizer ``optim`` describes applies sparse row gradients exactly as it would the dense gradient
    with zeros elsewhere: SGD and Adagrad without momentum or weight decay (the untouched rows would not move anyway).
    Adam would not (SparseAdam's moments are lazy), so a parameter made sparse under it would train differently."""
    return optim.get("name") in ("sgd", "adagrad") and sparse_rows_allowed(optim)


def build_optimizer(
    name: str, dense: Iterable[nn.Parameter], sparse: Iterable[nn.Parameter], lr: float, **kwargs: Any
) -> torch.optim.Optimizer:
    """One optimizer over dense and sparse-gradient parameters.

    - ``sgd``: torch SGD; sparse row gradients are applied natively (only the touched rows change).
    - ``adagrad``: torch Adagrad, which also applies sparse row gradients natively.
    - ``adam``: Adam on the dense parameters; the sparse ones get SparseAdam, or Adagrad with
      ``sparse_optimizer=adagrad`` (a :class:`MixedOptimizer`).
    ``sparse_lr`` sets a separate learning rate for the sparse rows (default ``lr``). Weight decay and
    momentum would change every output row at every step, so they are refused for sparse parameters.
    """
    dense, sparse = list(dense), list(sparse)
    sparse_optimizer = str(kwargs.pop("sparse_optimizer", OptimOptions.sparse_optimizer))  # the schema's default
    require_choice(OptimOptions, "name", name, "optim.name")
    require_choice(OptimOptions, "sparse_optimizer", sparse_optimizer, "optim.sparse_optimizer")
    sparse_lr = float(kwargs.pop("sparse_lr", None) or lr)
    if sparse:
        for key in _NO_SPARSE_KEYS:
            if kwargs.get(key):
                raise ValueError(
                    f"optim.{key}={kwargs[key]} would update every row of the sparse-gradient weights (the "
                    f"sampled output rows, the input embedding with model.sparse_embedding=true) at every step, "
                    f"which the sparse row path avoids; set optim.{key}=0, output.sparse=false or "
                    f"model.sparse_embedding=auto"
                )
        kwargs = {k: v for k, v in kwargs.items() if k not in _NO_SPARSE_KEYS}
    groups = [g for g in ({"params": dense}, {"params": sparse, "lr": sparse_lr}) if g["params"]]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, **kwargs)
    if name == "adagrad":
        return torch.optim.Adagrad(groups, lr=lr, **kwargs)
    # adam: the schema's choices (OptimOptions.name, checked above) leave no other name
    if not sparse:
        return torch.optim.Adam(dense, lr=lr, **kwargs)
    children: list[torch.optim.Optimizer] = [torch.optim.Adam(dense, lr=lr, **kwargs)] if dense else []
    if sparse_optimizer == "sparse_adam":
        adam_keys = {k: v for k, v in kwargs.items() if k in ("betas", "eps")}
        children.append(torch.optim.SparseAdam(sparse, lr=sparse_lr, **adam_keys))
    else:  # adagrad, the schema's other choice
        children.append(torch.optim.Adagrad(sparse, lr=sparse_lr, eps=float(kwargs.get("eps", 1e-10))))
    return MixedOptimizer(children)


def merge_repeats(grad: Tensor) -> Tensor:
    """A sparse row gradient (n, ...) whose repeated rows are added up, with the shape of its entries kept: R
    entries in, R entries out, sorted by row; each distinct row's sum sits at its first entry and the entries that
    repeat it are zero. What ``coalesce`` gives, padded to a size known before the step, so a GPU never waits to
    learn it; not marked coalesced (the zero entries repeat a row), which every consumer (norms, SGD's sparse add,
    ``changed_rows``) handles. Four operators: a sort, a search and the scatter-add into zeros."""
    ids, values = grad._indices()[0], grad._values()  # (R,), (R, ...)
    rows = ids.sort().values  # (R,) sorted
    first = torch.searchsorted(rows, ids)  # (R,) where each entry's row first appears among the sorted ones
    merged = torch.zeros_like(values).index_add_(0, first, values)  # (R, ...) one sum per distinct row
    return torch.sparse_coo_tensor(rows.unsqueeze(0), merged, grad.shape, check_invariants=False)


def _grad_tensors(params: Iterable[Tensor]) -> list[Tensor]:
    """The tensors holding each gradient's entries: dense grads, and the values of sparse ones with their repeated
    rows merged (``merge_repeats``: a view, so scaling it in place scales the sparse gradient)."""
    tensors = []
    for p in params:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            p.grad = merge_repeats(p.grad)
            tensors.append(p.grad._values())
        else:
            tensors.append(p.grad)
    return tensors


def _total_norm(tensors: list[Tensor]) -> Tensor:
    """L2 norm of all entries of ``tensors`` (fused foreach kernels); 0 for none."""
    if not tensors:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm([t.detach() for t in tensors], foreach=True)


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients (dense and sparse) so their global norm is at most ``max_norm``.

    Sparse gradients have their repeated rows merged in place first (``merge_repeats``), so only their touched rows
    are read or scaled; the norm and the scaling are fused over all gradients (foreach kernels), as in
    torch's own clipping.
    """
    tensors = _grad_tensors(params)
    total = _total_norm(tensors)
    if not tensors:
        return total
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(tensors, scale.to(tensors[0].device))  # one model: all gradients on one device
    return total


def ddp_ignored(module: nn.Module, sparse: list[nn.Parameter], output: nn.Module) -> list[str]:
    """Names in ``module`` that DDP must leave alone: the ``sparse``-gradient parameters, reduced by
    ``mean_over_ranks`` instead, and the ``output``'s derived buffers (kernel trees), which every rank keeps
    identical itself, from identical weights and identical reduced gradients, instead of broadcasting O(tree) every
    step."""
    ids = {id(p) for p in sparse}
    buffers = {id(b) for b in output.buffers()}
    ignored = [n for n, p in module.named_parameters() if id(p) in ids]
    return ignored + [n for n, b in module.named_buffers() if id(b) in buffers]


def mean_over_ranks(param: nn.Parameter, module: L.LightningModule) -> Tensor:
    """The mean over ranks of ``param``'s (sparse row) gradient, coalesced: the same tensor on every rank."""
    grad, world = param.grad, module.trainer.world_size
    if grad is None:
        empty_rows = torch.empty(1, 0, dtype=torch.long, device=param.device)
        grad = torch.sparse_coo_tensor(empty_rows, param.new_empty(0, *param.shape[1:]), param.shape)
    if not grad.is_sparse:
        return module.trainer.strategy.reduce(grad, reduce_op="mean")
    grad = grad.coalesce()
    rows, values = grad.indices()[0], grad.values()  # (k,), (k, d)
    counts = module.all_gather(torch.tensor(rows.numel(), device=param.device))  # (world,)
    most = int(counts.max())
    padded_rows = rows.new_zeros(most)
    padded_rows[: rows.numel()] = rows
    padded_values = values.new_zeros(most, *values.shape[1:])
    padded_values[: rows.numel()] = values
    all_rows, all_values = module.all_gather(padded_rows), module.all_gather(padded_values)  # (world, most[, d])
    keep = torch.arange(most, device=param.device) < counts[:, None]  # (world, most): drop the padding
    return torch.sparse_coo_tensor(all_rows[keep][None], all_values[keep] / world, param.shape).coalesce()
