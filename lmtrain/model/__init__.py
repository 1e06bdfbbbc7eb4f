"""Sequence encoders: tokens -> hidden states."""

from lmtrain.model.lstm import LSTMEncoder, State

__all__ = ["LSTMEncoder", "State"]
