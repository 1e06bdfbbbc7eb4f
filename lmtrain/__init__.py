"""lmtrain: LSTM language models with swappable softmax output strategies."""

__version__ = "0.1.0"
