"""Data layer: corpora (folders, downloads, synthetic, zipf), tokenizer + id cache, TBPTT batching, and the data
modules that the ``data=`` options build (plain classes; Lightning's Trainer takes them through
``lmtrain.run.lightning_data``).
"""

from __future__ import annotations

from lmtrain.data.batching import StreamSampler, WindowDataset, batchify, shard_rows
from lmtrain.data.corpus import Corpus
from lmtrain.data.datamodule import LMDataModule, SyntheticDataModule, TextDataModule, ZipfDataModule
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
