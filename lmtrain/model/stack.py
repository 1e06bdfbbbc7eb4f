"""A multi-layer LSTM run one layer at a time, for what a single ``nn.LSTM`` cannot do: layers of different widths
(a tied model's top layer is as wide as the embedding, as in AWD-LSTM) and locked dropout (one mask per sequence)
on each layer's output before the next."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lmtrain.model.weight_drop import run_lstm


def narrow(state: Tensor, layer: int, size: int) -> Tensor:
    """Layer ``layer``'s part (1, B, size) of a padded state (num_layers, B, width), contiguous: a narrow layer's
    slice is strided, and cuDNN's LSTM takes only contiguous states."""
    return state[layer : layer + 1, :, :size].contiguous()


class LayerStack(nn.Module):
    """Single-layer LSTMs of widths ``sizes`` (the first reads ``input_dim``), ``between`` (a dropout module) on the
    output of each but the last, and weight drop at rate ``weight_drop`` on each layer's hidden-to-hidden matrix in
    training. Its parameters come in the order of one ``nn.LSTM`` (layer by layer: weight_ih, weight_hh, bias_ih,
    bias_hh), and its state is shaped as that LSTM's: (h, c), each (num_layers, B, max(sizes)); a narrower layer's
    state fills the first entries of its row and the rest stay zero."""

    def __init__(self, input_dim: int, sizes: list[int], between: nn.Module, weight_drop: float) -> None:
        super().__init__()
        inputs = [input_dim, *sizes[:-1]]
        self.layers = nn.ModuleList(nn.LSTM(i, o, batch_first=True) for i, o in zip(inputs, sizes, strict=True))
        self.sizes, self.width = list(sizes), max(sizes)
        self.drop = between
        self.weight_drop = weight_drop

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, T, input_dim) -> top output (B, T, sizes[-1]), new state."""
        hs, cs = [], []
        for k, (layer, size) in enumerate(zip(self.layers, self.sizes, strict=True)):
            # a narrow layer's slice of the padded state is strided; cuDNN takes only contiguous states
            layer_state = None if state is None else (narrow(state[0], k, size), narrow(state[1], k, size))
            x, (h, c) = run_lstm(layer, x, layer_state, self.weight_drop)  # (B, T, size); h, c (1, B, size)
            hs.append(F.pad(h, (0, self.width - size)))  # (1, B, width)
            cs.append(F.pad(c, (0, self.width - size)))
            if k + 1 < len(self.layers):
                x = self.drop(x)
        return x, (torch.cat(hs), torch.cat(cs))
