"""Dropout on an encoder's activations: locked (variational) dropout, one mask per sequence shared over time, and
embedding (word) dropout, whole words dropped (Gal & Ghahramani 2016; Merity et al. 2017)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LockedDropout(nn.Module):
    """Dropout whose mask is drawn once per sequence and window and shared by every time step: an input (B, T, d)
    is multiplied by a mask (B, 1, d) of zeros (probability ``p``) and 1 / (1 - p). The identity in eval mode."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(keep).div_(keep)  # (B, 1, d)
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


def activation_dropout(p: float, locked: bool) -> nn.Module:
    """Dropout at rate ``p`` on activations (B, T, d): locked (one mask per sequence) or a fresh mask per entry."""
    return LockedDropout(p) if locked else nn.Dropout(p)


class WordDropout(nn.Module):
    """Embedding dropout: each word of the vocabulary is dropped with probability ``p`` for one forward pass (one
    mask over the rows of the embedding matrix), every occurrence of it in the batch then embeds to zero, and the
    words kept are scaled by 1 / (1 - p). The mask multiplies the looked-up rows rather than the matrix, so a
    sparse embedding keeps its sparse row gradients (a dropped word's row gets a zero gradient). The identity in
    eval mode."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, emb: Tensor, tokens: Tensor, num_rows: int) -> Tensor:
        """The embeddings (B, T, emb_dim) of tokens (B, T) from a matrix of ``num_rows`` rows -> the same, whole
        words dropped in training."""
        if not self.training or self.p == 0:
            return emb
        keep = 1.0 - self.p
        # one draw per vocabulary row: a fixed shape whatever the batch holds (no unique(), no host sync)
        rows = torch.empty(num_rows, device=emb.device).bernoulli_(keep).div_(keep)  # (n,)
        return emb * rows[tokens].unsqueeze(-1).to(emb.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
