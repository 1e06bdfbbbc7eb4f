"""Data layer: corpora, tokenizer + cache, downloads and errors, the data configs (synthetic source: test_synthetic.py;
batching: test_batching.py)."""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import pytest
import torch

import lmtrain.data.tokenizer as tokmod
from lmtrain.config import CONF_DIR
from lmtrain.data import (
    DataError,
    LMDataModule,
    TextDataModule,
)
from lmtrain.data.text import format_line

SHARED = Path(os.environ.get("LMTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def write_corpus(folder: Path, train: str, valid: str, test: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    return folder


TRAIN = " b a c \n\n a b a \n"  # counts: a 3, b 2, <eos> 3, c 1; the empty line still gets <eos>
VALID = " a zz b \n"
TEST = " c c \n"


SMALL: dict = {"batch_size": 2, "bptt": 3, "eval_batch_size": 1}


def tiny_again(tmp_path: Path) -> TextDataModule:
    return TextDataModule(name="tiny", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"), **SMALL)


def small_dm(tmp_path: Path, **kw: object) -> TextDataModule:
    folder = write_corpus(tmp_path / "corpus", TRAIN, VALID, TEST)
    dm = TextDataModule(name="tiny", path=str(folder), cache_dir=str(tmp_path / "cache"), **{**SMALL, **kw})
    dm.setup()
    return dm


# ---------------------------------------------------------------- tokenizer and cache


def test_vocab_order_eos_unk_and_ids(tmp_path: Path) -> None:
    dm = small_dm(tmp_path, batch_size=2, bptt=3, eval_batch_size=1)
    # a=3 and <eos>=3 tie: a occurs first; b before c; train has no <unk>, so it is appended with count 0
    assert dm.vocab == ["a", "<eos>", "b", "c", "<unk>"]
    assert dm.counts.tolist() == [3, 3, 2, 1, 0]
    words = [dm.vocab[i] for i in dm.train_ids.tolist()]
    assert words == ["b", "a", "c", "<eos>", "<eos>", "a", "b", "a", "<eos>"]
    assert [dm.vocab[i] for i in dm.valid_ids.tolist()] == ["a", "<unk>", "b", "<eos>"]
    assert dm.num_classes == 5 and dm.entropy_rate is None
    assert dm.train_ids.dtype == torch.int64 and dm.counts.dtype == torch.int64


def test_unk_in_train_is_a_normal_word(tmp_path: Path) -> None:
    folder = write_corpus(tmp_path / "c", " <unk> x <unk> \n", " y \n", " x \n")
    dm = TextDataModule(name="u", path=str(folder), cache_dir=None, batch_size=1)
    dm.setup()
    assert dm.vocab == ["<unk>", "x", "<eos>"]
    assert dm.valid_ids.tolist() == [0, 2]  # y -> <unk>


def test_warm_start_reads_cache_without_tokenizing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold = small_dm(tmp_path)
    (cache,) = (tmp_path / "cache").iterdir()
    assert cache.name.startswith("tiny-")
    assert {p.name for p in cache.iterdir()} == {
        "train.npy",
        "valid.npy",
        "test.npy",
        "vocab.txt",
        "tokenizer.json",
        "meta.json",
    }

    def boom(*args: object) -> None:
        raise AssertionError("warm start must not tokenize")

    monkeypatch.setattr(tokmod, "tokenize_files", boom)
    warm = TextDataModule(name="tiny", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"), **SMALL)
    warm.setup()
    assert warm.vocab == cold.vocab
    for a, b in (
        (warm.train_ids, cold.train_ids),
        (warm.valid_ids, cold.valid_ids),
        (warm.test_ids, cold.test_ids),
    ):
        assert torch.equal(a, b)
    # the saved tokenizer reproduces the cached ids
    from tokenizers import Tokenizer

    saved = Tokenizer.from_file(str(cache / "tokenizer.json"))
    assert saved.encode(" a zz b ").ids == cold.valid_ids.tolist()
    # changing a file changes the key: that run must tokenize again
    (tmp_path / "corpus" / "test.txt").write_text(" a \n", encoding="utf-8")
    with pytest.raises(AssertionError, match="must not tokenize"):
        TextDataModule(name="tiny", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"), **SMALL).setup()


def test_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    cold = small_dm(tmp_path)
    (cache,) = (tmp_path / "cache").iterdir()
    (cache / "train.npy").write_bytes(b"garbage")  # as if a foreign process broke it
    again = TextDataModule(name="tiny", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"), **SMALL)
    again.setup()
    assert torch.equal(again.train_ids, cold.train_ids)
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not (SHARED / "ptb" / "train.txt").is_file(), reason="PTB not in LMTRAIN_DATA_DIR/shared data")
def test_ptb_statistics(tmp_path: Path) -> None:
    start = time.perf_counter()
    dm = TextDataModule(name="ptb", root=str(SHARED), cache_dir=str(tmp_path / "cache"))
    dm.setup()
    cold = time.perf_counter() - start
    assert dm.num_classes == 10_000
    assert (len(dm.train_ids), len(dm.valid_ids), len(dm.test_ids)) == (929_589, 73_760, 82_430)
    assert int(dm.counts.sum()) == 929_589 and bool((dm.counts[:-1] >= dm.counts[1:]).all())
    assert int(dm.counts[dm.vocab.index("<eos>")]) == 42_068  # one per line
    assert int(dm.counts[dm.vocab.index("<unk>")]) == 45_020
    assert int((dm.valid_ids == dm.vocab.index("<unk>")).sum()) == 3_485  # valid has no OOV beyond <unk>
    start = time.perf_counter()
    warm = TextDataModule(name="ptb", root=str(SHARED), cache_dir=str(tmp_path / "cache"))
    warm.setup()
    assert time.perf_counter() - start < cold and torch.equal(warm.train_ids, dm.train_ids)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "wikitext-2" / "train.txt").is_file(), reason="WikiText-2 not available")
def test_wikitext2_statistics(tmp_path: Path) -> None:
    dm = TextDataModule(name="wikitext-2", root=str(SHARED), cache_dir=None)
    dm.setup()
    assert dm.num_classes == 33_278
    assert (len(dm.train_ids), len(dm.valid_ids), len(dm.test_ids)) == (2_088_628, 217_646, 245_569)


# ---------------------------------------------------------------- folders, downloads, errors


def test_missing_split_empty_file_and_unknown_corpus(tmp_path: Path) -> None:
    folder = tmp_path / "part"
    folder.mkdir()
    (folder / "train.txt").write_text(" a \n")
    with pytest.raises(DataError, match=r"is missing valid\.txt, test\.txt"):
        TextDataModule(name="part", path=str(folder), cache_dir=None, **SMALL).setup()
    write_corpus(folder, " a \n", "", " a \n")
    with pytest.raises(DataError, match=r"valid\.txt is empty"):
        TextDataModule(name="part", path=str(folder), cache_dir=None, **SMALL).setup()
    write_corpus(folder, " a \n", " \n \n", " a \n")
    with pytest.raises(DataError, match="has no tokens"):
        TextDataModule(name="part", path=str(folder), cache_dir=None, **SMALL).setup()
    with pytest.raises(DataError, match=r"corpus folder .*nope does not exist, and data=nope has no download"):
        TextDataModule(name="nope", root=str(tmp_path), cache_dir=None, **SMALL).setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty holds none of train\.txt, valid\.txt, test\.txt"):
        TextDataModule(name="text", path=str(tmp_path / "empty"), cache_dir=None, **SMALL).setup()
    assert issubclass(DataError, ValueError)


PTB_LIKE = {"hub_dataset": "text", "hub_data_files": {"train": "https://example.invalid/train.txt"}}


def test_offline_download_fails_fast_naming_folder_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    dm = TextDataModule(name="ptb", root=str(tmp_path), cache_dir=str(tmp_path / "cache"), **PTB_LIKE)
    with pytest.raises(DataError) as err:
        dm.setup()
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert str(tmp_path / "ptb") in message and "train.txt, valid.txt, test.txt" in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message


def test_download_failure_and_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr("lmtrain.data.text._probe", lambda source: None)
    calls = []

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    dm = TextDataModule(name="wt", root=str(tmp_path), cache_dir=None, hub_dataset="Salesforce/wikitext", **SMALL)
    with pytest.raises(DataError, match=r"could not download corpus 'wt'.*train\.txt, valid\.txt, test\.txt"):
        dm.setup()
    assert not (tmp_path / "wt" / "train.txt").exists()

    def fake_load(dataset: str, config: str | None, data_files: object = None, cache_dir: str = "") -> dict:
        calls.append((dataset, config, data_files))
        rows = {"train": ["", " = T = \n", " a b \n"], "validation": ["a"], "test": [" b \n"]}
        return {split: {"text": texts} for split, texts in rows.items()}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load))
    dm = TextDataModule(name="wt", root=str(tmp_path), cache_dir=None, hub_dataset="x/y", hub_config="c", **SMALL)
    dm.setup()
    assert calls == [("x/y", "c", None)]
    assert (tmp_path / "wt" / "train.txt").read_text() == " \n = T = \n a b \n"
    assert (tmp_path / "wt" / "valid.txt").read_text() == " a \n"
    assert len(dm.train_ids) == 3 + 3 + 2  # 5 tokens + 3 <eos>


def test_format_line() -> None:
    assert format_line("") == " \n"
    assert format_line(" = A = \n") == " = A = \n"
    assert format_line("a b") == " a b \n"


def test_hydra_data_configs(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    write_corpus(tmp_path / "folder", TRAIN * 50, VALID * 30, TEST * 30)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for choice in ("ptb", "wikitext2", "wikitext103", "synthetic", "text"):
            overrides = [f"+data={choice}", f"data.cache_dir={tmp_path / 'cache'}"]
            if choice == "text":
                overrides.append(f"data.path={tmp_path / 'folder'}")
            data = compose(overrides=overrides).data
            assert {"batch_size", "bptt", "eval_batch_size", "name"} <= set(data)
            dm = instantiate(data)
            assert isinstance(dm, LMDataModule)
            if choice in ("text", "synthetic"):
                dm.setup()
                assert len(dm.train_dataloader()) == dm.num_train_windows
        assert "root" in compose(overrides=["+data=ptb"]).data
