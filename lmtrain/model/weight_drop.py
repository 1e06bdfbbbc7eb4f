"""Weight drop (DropConnect on the hidden-to-hidden matrices, Wan et al. 2013; Merity et al. 2017): an LSTM run
with its ``weight_hh_l*`` matrices dropped, one mask per matrix and forward pass, shared by the batch and every
time step."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def dropped_recurrent_weights(lstm: nn.LSTM, p: float) -> dict[str, Tensor]:
    """Each ``weight_hh_l*`` of ``lstm`` with entries zeroed with probability ``p`` and the rest scaled by
    1 / (1 - p): new tensors computed from the parameters, so the gradient reaches them through the mask."""
    return {name: F.dropout(w, p) for name, w in lstm.named_parameters() if name.startswith("weight_hh")}


def run_lstm(
    lstm: nn.LSTM, inputs: Tensor, state: tuple[Tensor, Tensor] | None, weight_drop: float
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``lstm`` over ``inputs`` (B, T, d) from ``state``; in training with ``weight_drop`` > 0 its hidden-to-hidden
    matrices dropped for this call. The dropped matrices stand in for the parameters only inside the call
    (``torch.func.functional_call``): the parameters stay registered and unchanged, and nn.LSTM, finding other
    weights than at its last call, packs the ones it is given into cuDNN's flat buffer on a GPU, so cuDNN still
    runs the layers."""
    if not lstm.training or weight_drop == 0:
        return lstm(inputs, state)
    dropped = dropped_recurrent_weights(lstm, weight_drop)
    return torch.func.functional_call(lstm, dropped, (inputs, state))
