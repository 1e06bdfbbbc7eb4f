"""The LSTM encoder: tokens and carried state -> top-layer hidden states (no vocabulary projection)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from lmtrain.common.part import Part
from lmtrain.common.precision import lstm_region
from lmtrain.common.ranges import AT_LEAST_1, Checked

State = tuple[Tensor, Tensor]  # (h, c), each (num_layers, B, hidden_dim)


@dataclass
class LSTMOptions(Checked):
    """``model=lstm``: the encoder's keys and their defaults (the one place of them; the config schema adds the
    class to build)."""

    emb_dim: int = field(default=200, metadata=AT_LEAST_1)
    hidden_dim: int = field(default=200, metadata=AT_LEAST_1)
    num_layers: int = field(default=2, metadata=AT_LEAST_1)
    # on the embedding output, between layers and on the top output
    dropout: float = field(default=0.0, metadata={"at_least": 0, "below": 1})
    init_range: float = field(default=0.1, metadata={"above": 0})  # uniform(-init_range, init_range), every weight
    # sparse row gradients for the input embedding: a step touches only the rows of its tokens (what makes n = 10^6
    # affordable). auto: on when the optimizer updates sparse rows exactly as it would dense ones (sgd or adagrad
    # without momentum or weight decay), off otherwise (adam would switch the embedding to SparseAdam)
    sparse_embedding: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})


class LSTMEncoder(nn.Module, Part):
    """Embedding, multi-layer LSTM and dropout; the output strategy owns the vocabulary projection.

    Dropout (Zaremba et al. 2014) is applied to the embeddings, between layers and to the top output.
    Every weight is initialised uniformly in [-init_range, init_range].

    ``sparse_embedding=True`` gives the input embedding sparse row gradients: a step then reads and writes only the
    rows of the window's tokens instead of all n x emb_dim entries (at n = 10^6 the dense gradient's zeroing,
    clipping and update cost more than the rest of the step). ``"auto"`` is resolved by the app from the optimizer
    (``lmtrain.training.optim.sparse_rows_match_dense``); constructed directly it means dense.
    """

    group, name, Options = "model", "lstm", LSTMOptions  # model=lstm (``lmtrain.common.part``)
    # the run-time values lmtrain.training.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes",)

    def __init__(self, num_classes: int, **options: Any) -> None:
        super().__init__()
        self.options = opts = self.Options(**options)  # the keys left out take their defaults
        self.hidden_dim, self.num_layers = opts.hidden_dim, opts.num_layers
        self.embedding = nn.Embedding(num_classes, opts.emb_dim, sparse=opts.sparse_embedding is True)
        dropout = opts.dropout if opts.num_layers > 1 else 0.0
        self.lstm = nn.LSTM(opts.emb_dim, opts.hidden_dim, opts.num_layers, dropout=dropout, batch_first=True)
        self.drop = nn.Dropout(opts.dropout)
        for p in self.parameters():
            nn.init.uniform_(p, -opts.init_range, opts.init_range)

    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients are sparse rows (the optimizer and clipping treat them as such)."""
        return [self.embedding.weight] if self.embedding.sparse else []

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """tokens (B, T) -> hidden (B, T, hidden_dim), new state."""
        emb = self.drop(self.embedding(tokens))  # (B, T, emb_dim)
        with lstm_region(emb.device):
            out, state = self.lstm(emb, state)  # (B, T, hidden_dim)
        return self.drop(out), state
