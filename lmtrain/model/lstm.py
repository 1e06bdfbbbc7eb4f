"""The LSTM encoder: tokens and carried state -> top-layer hidden states (no vocabulary projection)."""

from __future__ import annotations

from torch import Tensor, nn

State = tuple[Tensor, Tensor]  # (h, c), each (num_layers, B, hidden_dim)


class LSTMEncoder(nn.Module):
    """Embedding, multi-layer LSTM and dropout; the output strategy owns the vocabulary projection.

    Dropout (Zaremba et al. 2014) is applied to the embeddings, between layers and to the top output.
    Every weight is initialised uniformly in [-init_range, init_range].
    """

    def __init__(
        self,
        num_classes: int,
        emb_dim: int = 200,
        hidden_dim: int = 200,
        num_layers: int = 2,
        dropout: float = 0.0,
        init_range: float = 0.1,
    ) -> None:
        super().__init__()
        self.hidden_dim, self.num_layers = hidden_dim, num_layers
        self.embedding = nn.Embedding(num_classes, emb_dim)
        self.lstm = nn.LSTM(
            emb_dim, hidden_dim, num_layers, dropout=dropout if num_layers > 1 else 0.0, batch_first=True
        )
        self.drop = nn.Dropout(dropout)
        for p in self.parameters():
            nn.init.uniform_(p, -init_range, init_range)

    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """tokens (B, T) -> hidden (B, T, hidden_dim), new state."""
        emb = self.drop(self.embedding(tokens))  # (B, T, emb_dim)
        out, state = self.lstm(emb, state)  # (B, T, hidden_dim)
        return self.drop(out), state
