"""Multi-process (DDP) pieces: the output's sparse row gradients, which DDP itself cannot reduce, and the carried
LSTM state, saved for the global batch and split into the ranks' rows on resume."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn

from lmtrain.model import State


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


def global_state(state: State | None, module: L.LightningModule) -> State | None:
    """The carried training state for all rows of the global batch: under DDP gathered from the ranks."""
    if state is None or module.trainer.world_size <= 1:
        return state
    h, c = (module.all_gather(s) for s in state)  # (world, layers, B / world, d): rank blocks in row order
    return h.transpose(0, 1).flatten(1, 2), c.transpose(0, 1).flatten(1, 2)  # (layers, B, d)


def rank_block(state: State | None, trainer: L.Trainer) -> State | None:
    """This rank's block of rows of a global batch's carried state (``global_state`` inverted)."""
    if state is None or trainer.world_size <= 1:
        return state
    rows, rank = state[0].shape[1] // trainer.world_size, trainer.global_rank
    return state[0][:, rank * rows : (rank + 1) * rows], state[1][:, rank * rows : (rank + 1) * rows]
