"""Word-level tokenizer (``tokenizers`` WordLevel) and the on-disk token-id cache.

Words (``data.tokenizer``, ``Words``): ``whitespace`` cuts a line at whitespace only (``tokenizers``' WhitespaceSplit);
``punctuation`` also splits punctuation off (its ``Whitespace`` pre-tokenizer: runs of letters, digits and ``_`` are
words, every run of other non-space characters is a token of its own, so ``rose.`` is ``rose`` and ``.``).

Vocabulary: every train word plus ``<eos>``, ordered by descending train count,
ties broken by first occurrence in the train stream (``<eos>`` first occurs at the end of line 1).
``<eos>`` is appended to every line, empty lines included; tokens of valid/test that train lacks map to
``<unk>``, which is appended with count 0 when train has none. The ASCII separators U+001C..U+001F,
whitespace for Python but not for ``tokenizers``, are read as spaces so both agree.

One file of text is split by lines into contiguous blocks (``split_lines``): the last 5% of its lines (at least
one) are test, the 5% before them valid, the rest train.

Cache: ``cache_dir/<name>-<key>/`` with ``{train,valid,test}.npy`` (int32 ids), ``tokenizer.json``,
``vocab.txt`` and ``meta.json``; ``key`` hashes the files' sha256 and the settings below. Every
file is written to a temporary name and moved into place, ``meta.json`` last, so a killed run
leaves no cache that a later run would trust.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from lmtrain.common.ranges import Choice
from lmtrain.data.corpus import Corpus
from lmtrain.data.errors import DataError

log = logging.getLogger(__name__)

EOS, UNK = "<eos>", "<unk>"
SETTINGS = {"format": 1, "model": "WordLevel", "split": "WhitespaceSplit", "eos": EOS, "unk": UNK,
            "order": "count desc, first occurrence", "separators_1c_1f": "space"}  # fmt: skip
ENCODE_CHUNK = 100_000  # lines per encode_batch call (bounds memory on WikiText-103)
_SEPARATORS = {c: " " for c in range(0x1C, 0x20)}
PUNCTUATION = pre_tokenizers.Whitespace()  # the regex \w+|[^\w\s]+: words, and runs of other non-space characters
HELD_OUT = 20  # one file split by lines: 1/20 of them (5%, at least one line) valid, as many test, the rest train


class Words(Choice):
    """How a line is cut into words (``data.tokenizer``)."""

    whitespace = "whitespace"  # at whitespace only: ``rose.`` is one word
    punctuation = "punctuation"  # punctuation split off too: ``rose.`` is ``rose`` and ``.``

    def pre_tokenizer(self) -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.WhitespaceSplit() if self is Words.whitespace else PUNCTUATION

    def split(self, line: str) -> list[str]:
        """The words of ``line``, as the tokenizer cuts them."""
        if self is Words.whitespace:  # Python's split agrees with WhitespaceSplit (see the separators above)
            return line.split()
        return [word for word, _ in PUNCTUATION.pre_tokenize_str(line)]

    def settings(self) -> dict[str, str | int]:
        """The tokenizer settings the cache key hashes (whitespace: the plain settings, no extra entry)."""
        return SETTINGS if self is Words.whitespace else {**SETTINGS, "split": "Whitespace"}


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (a final newline does not start an extra line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"data file {path} is not UTF-8 text ({err.reason}): convert it to UTF-8.") from err
    if not text.strip():
        what = f"the {path.stem} split" if path.stem in ("train", "valid", "test") else "text"
        raise DataError(f"data file {path} has no tokens: put {what} there, one sentence per line.")
    return text_lines(text)


def text_lines(text: str) -> list[str]:
    """The lines of a text (a final newline does not start an extra line), the U+001C..U+001F separators as spaces."""
    if any(chr(c) in text for c in _SEPARATORS):
        text = text.translate(_SEPARATORS)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def split_lines(lines: list[str], path: Path) -> dict[str, list[str]]:
    """The lines of one file as train, valid and test: contiguous blocks, valid and test 1/HELD_OUT of the lines
    each (at least one), at the end of the file."""
    held = max(1, len(lines) // HELD_OUT)
    if len(lines) < 3:
        raise DataError(f"data file {path} has {len(lines)} line(s): splitting it into train, valid and test needs 3 "
                        "or more (the last 5% test, the 5% before them valid)")  # fmt: skip
    return {"train": lines[: -2 * held], "valid": lines[-2 * held : -held], "test": lines[-held:]}


def build_vocab(lines: list[str], words: Words = Words.whitespace) -> list[str]:
    """Train vocabulary with ``<eos>`` (and ``<unk>``), by descending count then first occurrence."""
    counter = Counter(words.split(lines[0]))  # Counter keeps first-insertion order; sorting below is stable
    counter[EOS] += len(lines)
    counter.update(itertools.chain.from_iterable(words.split(line) for line in lines[1:]))
    vocab = sorted(counter, key=lambda w: -counter[w])
    if UNK not in counter:
        vocab.append(UNK)
    return vocab


def make_tokenizer(vocab: list[str], words: Words = Words.whitespace) -> Tokenizer:
    """WordLevel tokenizer over ``vocab`` (ids = positions) that appends ``<eos>`` to every sequence."""
    ids = {word: i for i, word in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordLevel(ids, unk_token=UNK))
    tokenizer.pre_tokenizer = words.pre_tokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, ids[EOS])])
    return tokenizer


def encode_lines(tokenizer: Tokenizer, lines: list[str]) -> np.ndarray:
    """All lines as one int32 id stream, ``<eos>`` after each line."""
    chunks = []
    for start in range(0, len(lines), ENCODE_CHUNK):
        encodings = tokenizer.encode_batch(lines[start : start + ENCODE_CHUNK], add_special_tokens=True)
        flat = itertools.chain.from_iterable(e.ids for e in encodings)
        chunks.append(np.fromiter(flat, dtype=np.int32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 23), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(hashes: dict[str, str], settings: dict[str, str | int] = SETTINGS) -> str:
    """Short hex key of the split files' sha256 and the tokenizer settings."""
    blob = json.dumps({"files": hashes, "settings": settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def tokenize_files(
    paths: dict[str, Path] | Path, words: Words = Words.whitespace
) -> tuple[list[str], Tokenizer, dict[str, np.ndarray]]:
    """Build the vocabulary from train and encode the three splits (three files, or one split by lines):
    (vocab, tokenizer, split -> ids)."""
    if isinstance(paths, Path):
        texts = split_lines(read_lines(paths), paths)
    else:
        texts = {split: read_lines(path) for split, path in paths.items()}
    vocab = build_vocab(texts["train"], words)
    tokenizer = make_tokenizer(vocab, words)
    return vocab, tokenizer, {split: encode_lines(tokenizer, lines) for split, lines in texts.items()}


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def _save(folder: Path, vocab: list[str], tokenizer: Tokenizer, ids: dict[str, np.ndarray], meta: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, array in ids.items():
        _atomic_write(folder / f"{split}.npy", lambda p, a=array: _save_npy(p, a))
    _atomic_write(folder / "tokenizer.json", lambda p: tokenizer.save(str(p)))
    _atomic_write(folder / "vocab.txt", lambda p: p.write_text("".join(w + "\n" for w in vocab), "utf-8"))
    _atomic_write(folder / "meta.json", lambda p: p.write_text(json.dumps(meta, indent=1), "utf-8"))


def _load(folder: Path, meta: dict) -> tuple[list[str], dict[str, np.ndarray]]:
    vocab = (folder / "vocab.txt").read_text("utf-8").split("\n")[:-1]
    ids = {split: np.load(folder / f"{split}.npy") for split in meta["lengths"]}
    if len(vocab) != meta["num_classes"] or any(len(ids[s]) != n for s, n in meta["lengths"].items()):
        raise ValueError(f"cache {folder} does not match its meta.json")
    return vocab, ids


def load_corpus(
    name: str, paths: dict[str, Path] | Path, cache_dir: Path | None, words: Words = Words.whitespace
) -> Corpus:
    """Tokenized corpus from three split files, or one file split by lines (``split_lines``), read from
    ``cache_dir`` when a matching cache exists.

    ``cache_dir=None`` disables the cache. An unwritable cache only logs a warning.
    """
    files = {"lines": paths} if isinstance(paths, Path) else paths  # "lines": one file, split by lines
    hashes = {split: file_sha256(path) for split, path in files.items()}
    settings = words.settings()
    if isinstance(paths, Path):  # the rule that cuts the file is part of what the ids depend on
        settings = {**settings, "split_lines": f"valid and test 1/{HELD_OUT} each, at the end"}
    folder = cache_dir / f"{name}-{cache_key(hashes, settings)}" if cache_dir is not None else None
    ids = None
    if folder is not None and (folder / "meta.json").is_file():
        try:
            meta = json.loads((folder / "meta.json").read_text("utf-8"))
            vocab, ids = _load(folder, meta)
            log.info("loaded token ids of %s from %s", name, folder)
        except (OSError, ValueError, KeyError) as err:
            log.warning("ignoring unreadable cache %s (%s); re-tokenizing", folder, err)
            ids = None
    if ids is None:
        vocab, tokenizer, ids = tokenize_files(paths, words)
        if folder is not None:
            meta = {"name": name, "files": {s: str(p) for s, p in files.items()}, "sha256": hashes,
                    "settings": settings, "num_classes": len(vocab),
                    "lengths": {s: int(len(a)) for s, a in ids.items()}}  # fmt: skip
            try:
                _save(folder, vocab, tokenizer, ids, meta)
            except OSError as err:
                log.warning("could not write the token cache %s (%s); continuing without it", folder, err)
    train, valid, test = (torch.from_numpy(ids[s].astype(np.int64)) for s in ("train", "valid", "test"))
    counts = torch.bincount(train, minlength=len(vocab))  # (n,)
    return Corpus(name, vocab, counts, train, valid, test)
