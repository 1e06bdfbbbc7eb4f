"""The options of the data modules: the keys of a ``data=...`` config and their defaults, ranges (``metadata``,
read by the config check) and meaning, written once. A data module's constructor takes them as keywords and fills
the ones left out from here; the config layer derives each module's schema from them (``lmtrain.common.part``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.data.synthetic import SyntheticOptions
from lmtrain.data.tokenizer import Words
from lmtrain.data.zipf_topics import ZipfTopicOptions


@dataclass
class BatchOptions(Checked):
    """What every corpus takes: the batch layout and where token ids are cached."""

    # the token-id cache (None or "": none; a config's: $LMTRAIN_CACHE_DIR, else data/cache); generated sources
    # accept it and ignore it
    cache_dir: str | None = field(default=None, metadata={"follows": "oc.env:LMTRAIN_CACHE_DIR,data/cache"})
    batch_size: int = field(default=20, metadata=AT_LEAST_1)  # rows of a training batch (parallel streams)
    bptt: int = field(default=35, metadata=AT_LEAST_1)  # window length T of truncated backpropagation
    eval_batch_size: int = field(default=10, metadata=AT_LEAST_1)  # rows of a validation or test batch
    # AWD-LSTM's variable windows (``lmtrain.data.window_lengths``): each training window is bptt long, or bptt / 2
    # with probability bptt_half_prob, plus normal noise of std bptt_std, at least bptt_min; a step's lr is scaled by
    # its window's length / bptt. The lengths are a function of bptt_seed and the epoch (exact resume)
    variable_bptt: bool = False
    bptt_half_prob: float = field(default=0.05, metadata={"at_least": 0, "at_most": 1})
    bptt_std: float = field(default=5.0, metadata={"at_least": 0})
    bptt_min: int = field(default=5, metadata=AT_LEAST_1)
    bptt_seed: int = 0  # seeds the draws of the lengths (with the epoch); other seeds, other windows


@dataclass
class TextOptions(BatchOptions):
    """A word-level corpus in ``path``, or else ``root/name``: a folder holding train.txt, valid.txt and test.txt
    (missing files are downloaded when ``hub_dataset`` is set, ``lmtrain.data.text``), or one text file, split by
    lines (``lmtrain.data.tokenizer.split_lines``). Relative paths are taken from the folder the program was started
    in. ``data=text`` is text of your own (``data.path=DIR`` or ``FILE``, which the config check requires); the
    public corpora (``data=ptb``, ...) are presets that name theirs under ``root``."""

    name: str = "text"  # the corpus: the folder root/name, and the key of its cached token ids
    root: str = field(default="data", metadata={"follows": "oc.env:LMTRAIN_DATA_DIR,data"})  # a config's: that env
    path: str | None = None  # the corpus folder, or one file to split by lines; None: root/name
    tokenizer: Words = Words.whitespace  # words cut at whitespace only, or with punctuation split off
    hub_dataset: str | None = None  # "text" (plain files from hub_data_files) or a Hugging Face dataset name
    hub_config: str | None = None
    hub_data_files: dict[str, str] | None = None  # split -> URL or file pattern
    hub_field: str = "text"  # the record field that holds a line of text

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """The config check's rule across keys: ``data=text`` (the corpus named text) is a folder of your own."""
        if node.get("name") == "text" and node.get("path") is None:
            yield f"{path}.path must be set ({path}.path=...)"


@dataclass
class SyntheticDataOptions(BatchOptions, SyntheticOptions):
    """``data=synthetic``: the seeded Zipf-Markov source, generated in memory on every setup."""

    name: str = "synthetic"
    batch_size: int = field(default=32, metadata=AT_LEAST_1)


@dataclass
class ZipfDataOptions(BatchOptions, ZipfTopicOptions):
    """``data=zipf``: the seeded large-vocabulary topic source, generated in memory on every setup."""

    name: str = "zipf"
