"""Your own text: one file split by lines into train, valid and test, a folder of the three as before, the two ways of
cutting words (``data.tokenizer``), and the one-line messages for a path that cannot be read as a corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmtrain.data import DataError, TextDataModule
from lmtrain.data.tokenizer import EOS, Words, split_lines
from tests.cli_runs import run_cli

SMALL: dict = {"batch_size": 1, "bptt": 2, "eval_batch_size": 1, "cache_dir": None}


def numbered(n: int) -> list[str]:
    """n lines, each one word that names its line: w0, w1, ..."""
    return [f"w{i}" for i in range(n)]


@pytest.mark.parametrize(("n", "held"), [(3, 1), (39, 1), (40, 2), (100, 5), (1001, 50)])
def test_one_file_is_split_into_contiguous_blocks_by_the_documented_ratio(n, held):
    lines = numbered(n)
    splits = split_lines(lines, Path("f.txt"))
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [n - 2 * held, held, held]
    assert splits["train"] + splits["valid"] + splits["test"] == lines  # every line once, in file order
    assert split_lines(lines, Path("f.txt")) == splits  # no randomness


def test_a_file_path_trains_on_its_first_90_percent_and_holds_out_the_rest(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("".join(f"{w} the\n" for w in numbered(100)), encoding="utf-8")
    dm = TextDataModule(name="text", path=str(path), **SMALL)
    dm.setup()
    words = {split: [dm.vocab[i] for i in ids.tolist()] for split, ids in
             (("train", dm.train_ids), ("valid", dm.valid_ids), ("test", dm.test_ids))}  # fmt: skip
    assert words["train"][:3] == ["w0", "the", EOS] and words["train"][-3:-1] == ["w89", "the"]
    assert [w for w in words["valid"] if w not in ("the", EOS)] == ["<unk>"] * 5  # w90..w94: not in train
    assert len(words["valid"]) == len(words["test"]) == 15 and len(words["train"]) == 270


def test_a_folder_still_reads_its_three_files(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, text in (("train", "a b a\n"), ("valid", "b a\n"), ("test", "a\n")):
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    dm = TextDataModule(name="text", path=str(folder), **SMALL)
    dm.setup()
    assert dm.vocab == ["a", "b", EOS, "<unk>"] and dm.test_ids.tolist() == [0, 2]


def test_the_punctuation_tokenizer_splits_rose_and_the_default_does_not(tmp_path):
    assert Words.punctuation.split("a rose. (red), don't") == ["a", "rose", ".", "(", "red", "),", "don", "'", "t"]
    assert Words.whitespace.split("a rose.") == ["a", "rose."]
    path = tmp_path / "poem.txt"
    path.write_text("a rose is a rose.\n" * 20, encoding="utf-8")
    split = TextDataModule(name="text", path=str(path), tokenizer="punctuation", **SMALL)
    split.setup()
    whole = TextDataModule(name="text", path=str(path), **SMALL)
    whole.setup()
    assert "." in split.vocab and "rose." not in split.vocab and "rose." in whole.vocab
    assert [split.vocab[i] for i in split.test_ids.tolist()] == ["a", "rose", "is", "a", "rose", ".", EOS]


def test_the_tokenizer_is_part_of_the_cache_key(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_text("a rose is a rose.\n" * 20, encoding="utf-8")
    cached = {**SMALL, "cache_dir": str(tmp_path / "cache")}
    for words in ("whitespace", "punctuation", "whitespace"):
        dm = TextDataModule(name="text", path=str(path), tokenizer=words, **cached)
        dm.setup()
        assert ("rose." in dm.vocab) == (words == "whitespace")
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_a_file_too_short_to_split_is_refused(tmp_path):
    path = tmp_path / "two.txt"
    path.write_text("a b\nc d\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"two\.txt has 2 line\(s\): splitting it into train, valid and test needs 3"):
        TextDataModule(name="text", path=str(path), **SMALL).setup()


def one_line_error(args: list[str], tmp_path: Path) -> str:
    result = run_cli(["data=text", "logger=csv", "trainer.max_steps=1", *args], tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("lmtrain: error: ") and not (tmp_path / "outputs").exists()
    return line.removeprefix("lmtrain: error: ")


@pytest.mark.parametrize("path", ["two.txt", "part"])
def test_paths_that_are_no_corpus_get_one_true_line_through_the_command_line(path, tmp_path):
    (tmp_path / "two.txt").write_text("a b\nc d\n", encoding="utf-8")
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "train.txt").write_text("a b\n", encoding="utf-8")
    line = one_line_error([f"data.path={path}"], tmp_path)
    if path == "two.txt":  # a file: named as one, never as a folder
        assert "data file" in line and "two.txt has 2 line(s)" in line and "folder" not in line
    else:  # a folder without some splits; LMTRAIN_DATA_DIR does nothing for data=text (no path: test_cli.py)
        assert "part is missing valid.txt, test.txt" in line and "one text file" in line
        assert "LMTRAIN_DATA_DIR" not in line


def test_generate_and_score_read_text_as_the_run_cut_it():
    import torch

    from lmtrain.data.vocab import Vocabulary

    words = ["a", "rose", ".", EOS, "<unk>"]
    punctuation = Vocabulary(words, torch.ones(5, dtype=torch.long), Words.punctuation.split)
    assert punctuation.encode("a rose.") == ([0, 1, 2, 3], 0)
    assert Vocabulary(words, torch.ones(5, dtype=torch.long)).encode("a rose.") == ([0, 4, 3], 1)
