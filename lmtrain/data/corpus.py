"""The tokenized corpus every data module produces."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Corpus:
    """A tokenized corpus: three id streams over one frequency-ordered vocabulary.

    ``vocab[i]`` is the string of id ``i``; ids are ordered by descending train frequency, so
    ``counts`` (train occurrences per id) is non-increasing. ``entropy_rate`` is the true entropy
    rate of the source in nats/token when it is known (synthetic data), else ``None``.
    """

    name: str
    vocab: list[str]
    counts: Tensor  # (n,) int64 train counts
    train: Tensor  # (L_train,) int64 ids
    valid: Tensor  # (L_valid,) int64 ids
    test: Tensor  # (L_test,) int64 ids
    entropy_rate: float | None = None

    @property
    def num_classes(self) -> int:
        """Vocabulary size n."""
        return len(self.vocab)
