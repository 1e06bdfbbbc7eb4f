"""The vocabulary a run was trained with, saved in its run folder as ``vocab.tsv``, and text -> ids with it.

``vocab.tsv`` is a header line ``word<TAB>count`` and then one line per id, in id order: the word and its count in
the training split. Words never hold whitespace (the tokenizer splits on it), so the file is plain TSV. The counts
are what the output strategies are built from (a Huffman tree, a unigram proposal), so a model can be rebuilt from
the run folder alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from lmtrain.data.errors import DataError
from lmtrain.data.tokenizer import EOS, UNK, text_lines

VOCAB_FILE = "vocab.tsv"
HEADER = "word\tcount"


class Vocabulary:
    """Words in id order with their training counts; reads text the way training did.

    A line is its words (cut as the run's ``data.tokenizer`` cut them) followed by ``<eos>`` when the vocabulary has
    one (text corpora; the synthetic source has no lines and no ``<eos>``). A word outside the vocabulary is read as
    ``<unk>``; with a vocabulary that has no ``<unk>`` it is an error (DataError).
    """

    def __init__(self, words: list[str], counts: Tensor, split: Callable[[str], list[str]] = str.split) -> None:
        if len(words) != counts.numel():
            raise DataError(f"a vocabulary of {len(words)} words needs as many counts, got {counts.numel()}")
        self.words = list(words)
        self.counts = counts.detach().cpu().long().reshape(-1)  # (n,)
        self.index = {word: i for i, word in enumerate(self.words)}
        self.eos, self.unk = self.index.get(EOS), self.index.get(UNK)
        self.split = split  # a line -> its words (a run's ``Words.split``)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, line: str) -> tuple[list[int], int]:
        """One line -> (its ids, with ``<eos>`` last when the vocabulary has it; how many words were read as <unk>)."""
        ids, unknown = [], 0
        for word in self.split(line):
            i = self.index.get(word)
            if i is None:
                if self.unk is None:
                    raise DataError(f"word {word!r} is not in the run's vocabulary, which has no {UNK} to read it as")
                i, unknown = self.unk, unknown + 1
            ids.append(i)
        if self.eos is not None:
            ids.append(self.eos)
        return ids, unknown

    def encode_text(self, text: str) -> tuple[list[list[int]], list[int]]:
        """Every line of ``text`` encoded: (ids per line, unknown words per line)."""
        encoded = [self.encode(line) for line in text_lines(text)]
        return [ids for ids, _ in encoded], [unknown for _, unknown in encoded]

    def save(self, folder: Path) -> Path:
        """Write ``folder/vocab.tsv`` (to a temporary name, then renamed: never half-written)."""
        path = folder / VOCAB_FILE
        rows = "".join(f"{word}\t{int(count)}\n" for word, count in zip(self.words, self.counts.tolist(), strict=True))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{HEADER}\n{rows}", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, folder: Path, split: Callable[[str], list[str]] = str.split) -> Vocabulary | None:
        """The vocabulary saved in ``folder`` (a run folder); None when it has none (a run from before it was saved)."""
        path = folder / VOCAB_FILE
        if not path.is_file():
            return None
        lines = path.read_text(encoding="utf-8").split("\n")
        rows = [line.split("\t") for line in lines[1:] if line]
        if lines[0] != HEADER or any(len(row) != 2 or not row[1].isdigit() for row in rows):
            raise DataError(f"{path} is not a vocabulary file ({HEADER!r} header, then one word and count a line)")
        counts = torch.tensor([int(count) for _, count in rows], dtype=torch.long)
        return cls([word for word, _ in rows], counts, split)
