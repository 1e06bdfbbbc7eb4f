"""A multi-layer LSTM run one layer at a time, for what a single ``nn.LSTM`` cannot do between its layers: locked
dropout (one mask per sequence) on each layer's output before the next."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmtrain.model.dropout import LockedDropout
from lmtrain.model.weight_drop import run_lstm


class LayerStack(nn.Module):
    """``num_layers`` single-layer LSTMs, locked dropout at rate ``between`` on the output of each but the last, and
    weight drop at rate ``weight_drop`` on each layer's hidden-to-hidden matrix in training. Its parameters come in
    the order of one ``nn.LSTM`` of the same sizes (layer by layer: weight_ih, weight_hh, bias_ih, bias_hh), and
    its state is shaped as that LSTM's: (h, c), each (num_layers, B, hidden_dim)."""

    def __init__(self, input_dim: int, hidden_dim: int, num_layers: int, between: float, weight_drop: float) -> None:
        super().__init__()
        sizes = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.LSTM(size, hidden_dim, batch_first=True) for size in sizes)
        self.drop = LockedDropout(between)
        self.weight_drop = weight_drop

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, T, input_dim) -> top output (B, T, hidden_dim), new state."""
        hs, cs = [], []
        for k, layer in enumerate(self.layers):
            layer_state = None if state is None else (state[0][k : k + 1], state[1][k : k + 1])
            x, (h, c) = run_lstm(layer, x, layer_state, self.weight_drop)  # (B, T, hidden_dim)
            hs.append(h)
            cs.append(c)
            if k + 1 < len(self.layers):
                x = self.drop(x)
        return x, (torch.cat(hs), torch.cat(cs))
