"""Data layer: corpora (folders, downloads, synthetic, zipf), tokenizer + id cache, TBPTT batching.

The datamodules (``lmtrain.data.datamodule``, which need Lightning) are imported on first use of their names here,
so that the data layer alone does not wait for Lightning's import (the config layer imports them: they declare the
``data=`` options).
"""

from __future__ import annotations

from typing import Any

from lmtrain.data.batching import StreamSampler, WindowDataset, batchify, shard_rows
from lmtrain.data.corpus import Corpus
from lmtrain.data.errors import DataError
from lmtrain.data.synthetic import ZipfMarkovSource, synthetic_corpus
from lmtrain.data.text import HubSource, ensure_corpus
from lmtrain.data.tokenizer import load_corpus
from lmtrain.data.zipf_topics import ZipfTopicSource, zipf_topic_corpus

__all__ = [
    "Corpus",
    "DataError",
    "HubSource",
    "LMDataModule",
    "StreamSampler",
    "SyntheticDataModule",
    "TextDataModule",
    "WindowDataset",
    "ZipfDataModule",
    "ZipfMarkovSource",
    "ZipfTopicSource",
    "batchify",
    "ensure_corpus",
    "load_corpus",
    "shard_rows",
    "synthetic_corpus",
    "zipf_topic_corpus",
]

DATAMODULES = ("LMDataModule", "SyntheticDataModule", "TextDataModule", "ZipfDataModule")


def __getattr__(name: str) -> Any:
    if name in DATAMODULES:  # as scripts and older configs name them (``lmtrain.data.TextDataModule``)
        from lmtrain.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
