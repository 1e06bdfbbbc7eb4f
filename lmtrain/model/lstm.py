"""The LSTM encoder: tokens and carried state -> top-layer hidden states (no vocabulary projection)."""

from __future__ import annotations

from typing import ClassVar, Literal

from torch import Tensor, nn

State = tuple[Tensor, Tensor]  # (h, c), each (num_layers, B, hidden_dim)


class LSTMEncoder(nn.Module):
    """Embedding, multi-layer LSTM and dropout; the output strategy owns the vocabulary projection.

    Dropout (Zaremba et al. 2014) is applied to the embeddings, between layers and to the top output.
    Every weight is initialised uniformly in [-init_range, init_range].

    ``sparse_embedding=True`` gives the input embedding sparse row gradients: a step then reads and writes only the
    rows of the window's tokens instead of all n x emb_dim entries (at n = 10^6 the dense gradient's zeroing,
    clipping and update cost more than the rest of the step). ``"auto"`` is resolved by the app from the optimizer
    (``lmtrain.training.optim.sparse_rows_match_dense``); constructed directly it means dense.
    """

    # the run-time values lmtrain.training.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes",)

    def __init__(
        self,
        num_classes: int,
        emb_dim: int = 200,
        hidden_dim: int = 200,
        num_layers: int = 2,
        dropout: float = 0.0,
        init_range: float = 0.1,
        sparse_embedding: bool | Literal["auto"] = False,
    ) -> None:
        super().__init__()
        self.hidden_dim, self.num_layers = hidden_dim, num_layers
        self.embedding = nn.Embedding(num_classes, emb_dim, sparse=sparse_embedding is True)
        self.lstm = nn.LSTM(
            emb_dim, hidden_dim, num_layers, dropout=dropout if num_layers > 1 else 0.0, batch_first=True
        )
        self.drop = nn.Dropout(dropout)
        for p in self.parameters():
            nn.init.uniform_(p, -init_range, init_range)

    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients are sparse rows (the optimizer and clipping treat them as such)."""
        return [self.embedding.weight] if self.embedding.sparse else []

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """tokens (B, T) -> hidden (B, T, hidden_dim), new state."""
        emb = self.drop(self.embedding(tokens))  # (B, T, emb_dim)
        out, state = self.lstm(emb, state)  # (B, T, hidden_dim)
        return self.drop(out), state
