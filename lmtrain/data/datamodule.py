"""Data modules: one base (batching, loaders, DDP row sharding) and the corpus sources. They are plain classes:
Lightning reads them through ``lmtrain.run.lightning_data.LightningData``, so naming a ``data=`` option (the config
layer imports every part) does not import Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from hydra.utils import to_absolute_path
from torch import Tensor
from torch.utils.data import DataLoader

from lmtrain.common.part import Part
from lmtrain.data.batching import StreamLoader, StreamSampler, WindowDataset, batchify, shard_rows
from lmtrain.data.corpus import Corpus
from lmtrain.data.options import BatchOptions, SyntheticDataOptions, TextOptions, ZipfDataOptions
from lmtrain.data.synthetic import synthetic_corpus
from lmtrain.data.text import ensure_corpus, hub_source, note_split_folder
from lmtrain.data.tokenizer import Words, load_corpus
from lmtrain.data.window_lengths import window_lengths
from lmtrain.data.zipf_topics import zipf_topic_corpus


class LMDataModule(Part):
    """TBPTT data for language modelling; subclasses only say how to load the :class:`Corpus`.

    After ``setup()`` (idempotent, also usable before a Trainer exists): ``num_classes``, ``vocab``,
    ``counts``, ``entropy_rate``, ``train_ids``/``valid_ids``/``test_ids``, ``num_train_windows`` and
    ``train_sampler`` (``set_start(window)`` resumes mid-epoch). Loaders yield (inputs, targets) of
    shape (B, T) in stream order; with ``variable_bptt`` T varies by window and the windows by epoch
    (``train_dataloader(epoch)``; the Trainer then reloads the training loader every epoch). Under DDP (``shard``,
    this process's rank and the number of ranks) each rank keeps its contiguous block of the global batch's rows,
    so N ranks together see what one process sees.
    """

    group = "data"  # data=NAME (``lmtrain.common.part``)
    runtime_args: ClassVar[tuple[str, ...]] = ()  # built from its config alone
    Options: ClassVar[type[BatchOptions]]  # each source's options: the batch layout's keys and its own

    def __init__(self, **options: Any) -> None:
        self.options = batch = self.Options(**options)  # the keys left out take their defaults
        self.shard = (0, 1)  # (rank, world size): set by the Lightning adapter under DDP
        self.batch_size, self.bptt, self.eval_batch_size = batch.batch_size, batch.bptt, batch.eval_batch_size
        self.corpus: Corpus | None = None
        self.train_sampler: StreamSampler | None = None
        self.num_train_windows = 0
        self.train_lengths: list[int] = []  # the window lengths of the epoch laid out (set_train_epoch)
        self._train_epoch: int | None = None
        self._train_positions = 0  # target positions per row of the training layout

    def load_corpus(self) -> Corpus:
        """Load (or generate) the tokenized corpus; implemented by each source."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is not None:
            return
        corpus = self.load_corpus()
        train_layout = batchify(corpus.train, self.batch_size, "train")  # (B, L): checks the size early
        self._train_positions = train_layout.shape[1] - 1
        self.train_sampler = StreamSampler(0)
        self.set_train_epoch(0)
        self.corpus = corpus

    def set_train_epoch(self, epoch: int) -> None:
        """Lay out the training windows of ``epoch`` (``window_lengths``: the same for every epoch unless
        ``variable_bptt``); the sampler keeps the start it was given (a resumed epoch is laid out first)."""
        if epoch == self._train_epoch or self.train_sampler is None:
            return
        self.train_lengths = window_lengths(self._train_positions, self.options, epoch)
        self.num_train_windows = self.train_sampler.num_windows = len(self.train_lengths)
        self._train_epoch = epoch

    def _loaded(self) -> Corpus:
        if self.corpus is None:
            raise RuntimeError("call setup() on the data module before reading its corpus")
        return self.corpus

    @property
    def num_classes(self) -> int:
        return self._loaded().num_classes

    @property
    def vocab(self) -> list[str]:
        return self._loaded().vocab

    @property
    def counts(self) -> Tensor:
        return self._loaded().counts

    @property
    def entropy_rate(self) -> float | None:
        return self._loaded().entropy_rate

    @property
    def train_ids(self) -> Tensor:
        return self._loaded().train

    @property
    def valid_ids(self) -> Tensor:
        return self._loaded().valid

    @property
    def test_ids(self) -> Tensor:
        return self._loaded().test

    def _loader(
        self,
        ids: Tensor,
        batch_size: int,
        split: str,
        key: str,
        sampler: StreamSampler | None,
        lengths: list[int] | None = None,
    ) -> DataLoader:
        rank, world_size = self.shard
        data = shard_rows(batchify(ids, batch_size, split), rank, world_size, key)  # (B / world, L)
        dataset = WindowDataset(data, self.bptt, lengths)
        loader = DataLoader if sampler is None else StreamLoader  # the training loader resumes mid-epoch
        sampler = sampler if sampler is not None else StreamSampler(len(dataset))
        # its own generator: creating an iterator must not draw from the global RNG (exact resume)
        return loader(dataset, batch_size=None, sampler=sampler, num_workers=0, generator=torch.Generator())

    def train_dataloader(self, epoch: int | None = None) -> DataLoader:
        """The training windows of ``epoch`` (variable_bptt lays them out per epoch; else, or without an epoch, the
        epoch last laid out, ``set_train_epoch``)."""
        self.setup()
        if epoch is not None and self.options.variable_bptt:
            self.set_train_epoch(epoch)
        return self._loader(
            self.train_ids, self.batch_size, "train", "batch_size", self.train_sampler, self.train_lengths
        )

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.valid_ids, self.eval_batch_size, "valid", "eval_batch_size", None)

    def test_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.test_ids, self.eval_batch_size, "test", "eval_batch_size", None)


class TextDataModule(LMDataModule):
    """A word-level corpus from ``path`` or ``root/name``: a folder holding train.txt, valid.txt, test.txt, or one
    text file split by lines (the last 5% test, the 5% before valid).

    Missing files are downloaded when ``hub_dataset`` is set (see :mod:`lmtrain.data.text`); token
    ids are cached under ``cache_dir`` (``None`` or "" disables the cache). Relative paths are taken
    from the directory the program was started in. The corpora of ``conf/data`` (ptb, wikitext2, ...) and
    ``data=text`` (a folder of your own) are presets of its schema, ``text``.
    """

    name, Options = "text", TextOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        opts = self.options
        self.corpus_name = name = opts.name
        root, path, cache_dir = opts.root, opts.path, opts.cache_dir
        self.path = Path(to_absolute_path(str(path))) if path else Path(to_absolute_path(str(root))) / name
        self.cache_dir = Path(to_absolute_path(str(cache_dir))) if cache_dir else None
        self.source = hub_source(opts.hub_dataset, opts.hub_config, opts.hub_data_files, opts.hub_field)
        self.words, self.own = Words(opts.tokenizer), bool(path)  # own: data.path names it

    def load_corpus(self) -> Corpus:
        if self.path.is_file():  # one file of text, split by lines
            note_split_folder(self.path)
            return load_corpus(self.corpus_name, self.path, self.cache_dir, self.words)
        paths = ensure_corpus(self.path, self.corpus_name, self.source, self.cache_dir, own=self.own)
        return load_corpus(self.corpus_name, paths, self.cache_dir, self.words)


class SyntheticDataModule(LMDataModule):
    """Tokens from a seeded Zipf-Markov source (:mod:`lmtrain.data.synthetic`); exact ``entropy_rate``.

    Generated in memory on every setup (well under a second); ``cache_dir`` is accepted, like in every
    data config, and unused.
    """

    name, Options = "synthetic", SyntheticDataOptions  # data=synthetic

    def load_corpus(self) -> Corpus:
        return synthetic_corpus(self.options)


class ZipfDataModule(LMDataModule):
    """Tokens from a seeded large-vocabulary Markov source (:mod:`lmtrain.data.zipf_topics`): ``vocab_size`` types
    with an exactly Zipfian marginal, next-token distributions specific to each token's topics, O(n) memory, and
    an exact ``entropy_rate``. Generated in memory on every setup (about a second for 10^5 types and 1.2M tokens,
    a few seconds for 10^6 types); ``cache_dir`` is accepted, like in every data config, and unused.
    """

    name, Options = "zipf", ZipfDataOptions  # data=zipf

    def load_corpus(self) -> Corpus:
        return zipf_topic_corpus(self.options)
