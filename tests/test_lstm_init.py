"""``model.lstm_init``: the LSTM layers start as every weight (uniform in +-init_range) or as nn.LSTM starts them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmtrain.model.lstm import LSTMEncoder


def lstm_layers(encoder: LSTMEncoder) -> list[nn.LSTM]:
    return [m for m in encoder.lstm.modules() if isinstance(m, nn.LSTM)]


@pytest.mark.parametrize("locked", [False, True])  # one nn.LSTM, or a stack of single layers
def test_torch_init_bounds_each_layer_by_its_width_and_leaves_the_embedding_alone(locked: bool) -> None:
    torch.manual_seed(0)
    opts = {"emb_dim": 40, "hidden_dim": 100, "num_layers": 3, "init_range": 0.5, "lstm_init": "torch"}
    encoder = LSTMEncoder(50, **opts, locked_dropout=locked, dropout=0.2 if locked else 0.0)
    for layer in lstm_layers(encoder):
        bound = 1 / math.sqrt(layer.hidden_size)
        for p in layer.parameters():
            assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound  # the whole range, not a narrower one
    assert encoder.embedding.weight.abs().max() > 0.45  # uniform in +-0.5 as before
    uniform = LSTMEncoder(50, **{**opts, "lstm_init": "uniform"})
    assert all(p.abs().max() > 0.45 for layer in lstm_layers(uniform) for p in layer.parameters())


def test_an_unknown_lstm_init_is_refused() -> None:
    with pytest.raises(ValueError, match="lstm_init"):
        LSTMEncoder(50, lstm_init="xavier")
