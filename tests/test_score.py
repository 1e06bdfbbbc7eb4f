"""python -m lmtrain.score: exact perplexity of a text file, per-line log-probabilities, the run's vocabulary."""

from __future__ import annotations

import csv
import math
import shutil

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from lmtrain.data import WindowDataset, batchify
from lmtrain.data.vocab import Vocabulary
from lmtrain.tools.score import main as score_main
from lmtrain.tools.score import score
from lmtrain.tools.trained import load_trained

STRATEGIES = ["full", "unigram", "rff", "nce", "hsm", "adaptive", "bigram"]


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def module_ppl(module, stream):
    """The LanguageModel's own test loop (windows of 20, state carried) over one stream: its exact perplexity."""
    loader = DataLoader(WindowDataset(batchify(stream, 1), 20), batch_size=None)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    return trainer.test(module, dataloaders=loader, verbose=False)[0]["test/ppl"]


@pytest.mark.parametrize("output", STRATEGIES)
def test_score_of_the_test_split_is_the_runs_test_perplexity(trained_run, tmp_path, output):
    run, metrics = trained_run(output)
    datamodule = instantiate(OmegaConf.load(run / "config.yaml").data)
    datamodule.setup()
    assert Vocabulary.read(run).words == datamodule.vocab  # training saved its vocabulary in the run folder
    text = tmp_path / "test.txt"
    text.write_text(" ".join(datamodule.vocab[i] for i in datamodule.test_ids.tolist()) + "\n")
    result = score([f"ckpt_path={run}", f"file={text}", "device=cpu"])
    # a synthetic vocabulary has no <eos>: the first word is only read, as in the run's test (eval_batch_size=1)
    assert (result.lines, result.tokens, result.unknown) == (1, datamodule.test_ids.numel() - 1, 0)
    assert result.ppl == pytest.approx(metrics["test/ppl"], rel=1e-5)
    table = rows(result.csv)
    assert result.csv == run / "score" / "test.csv"
    mean_nll = -sum(float(r["log_prob"]) for r in table) / sum(int(r["tokens"]) for r in table)
    assert math.exp(mean_nll) == pytest.approx(result.ppl, rel=1e-9)


def test_text_lines_unknown_words_and_module_evaluation(trained_run, tmp_path):
    run, _ = trained_run("hsm", "text")
    lines = ["w1 w2 w3", "", "w0 qqq w1 zzz", "w2"]
    text = tmp_path / "mine.txt"
    text.write_text("\n".join(lines) + "\n")
    result = score([f"ckpt_path={run}", f"file={text}", f"out={tmp_path / 'mine.csv'}"])
    table = rows(tmp_path / "mine.csv")
    assert [(r["line"], r["tokens"], r["unknown"]) for r in table] == [
        ("1", "4", "0"),  # every word and the line's <eos> are predicted, the first from an <eos>
        ("2", "1", "0"),  # an empty line is its <eos>
        ("3", "5", "2"),
        ("4", "2", "0"),
    ]
    assert (result.tokens, result.unknown) == (12, 2)
    mean_nll = -sum(float(r["log_prob"]) for r in table) / result.tokens
    assert math.exp(mean_nll) == pytest.approx(result.ppl, rel=1e-9)
    # unknown words are <unk>: the same numbers as the text with <unk> written in
    spelled = tmp_path / "spelled.txt"
    spelled.write_text(text.read_text().replace("qqq", "<unk>").replace("zzz", "<unk>"))
    again = score([f"ckpt_path={run}", f"file={spelled}", f"out={tmp_path / 'spelled.csv'}"])
    assert again.log_prob == pytest.approx(result.log_prob, rel=1e-12) and again.unknown == 0
    # the LanguageModel's own evaluation of the same ids gives the same perplexity
    trained = load_trained(str(run), [], "cpu")
    vocab = trained.vocab
    ids = [vocab.eos] + [vocab.index.get(w, vocab.unk) for line in lines for w in [*line.split(), "<eos>"]]
    assert module_ppl(trained.module, torch.tensor(ids)) == pytest.approx(result.ppl, rel=1e-5)


def test_old_run_without_vocab_file_rebuilds_it_and_default_csv_is_never_replaced(trained_run, tmp_path):
    run, _ = trained_run("unigram", "text")
    old = tmp_path / "old"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("score"))
    (old / "vocab.tsv").unlink()
    text = run.parent / "corpus" / "valid.txt"
    first = score([f"ckpt_path={old}", f"file={text}"])
    second = score([f"ckpt_path={old / 'checkpoints' / 'last.ckpt'}", f"file={text}"])
    assert (first.csv, second.csv) == (old / "score" / "valid.csv", old / "score" / "valid-2.csv")
    assert score([f"ckpt_path={run}", f"file={text}"]).log_prob == pytest.approx(first.log_prob, rel=1e-12)
    assert first.unknown > 0  # valid has words that train lacks


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["file=missing.txt"], "file=missing.txt does not exist"),
        ([], "pass file=PATH"),
        (["file=TEXT", "ckpt_path=nowhere.ckpt"], "ckpt_path nowhere.ckpt does not exist"),
        (["file=TEXT", "device=cuda:99"], "device=cuda:99 is not available"),
        (["file=EMPTY"], "has nothing to score"),
        (["file=TEXT", "data.batch_size"], "arguments are key=value"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(trained_run, tmp_path, capsys, extra, expected):
    run, _ = trained_run("full")
    (tmp_path / "text.txt").write_text("w1 w2 w3\n")
    (tmp_path / "empty.txt").write_text("w1\n")  # one synthetic word: nothing to predict
    files = {"file=TEXT": f"file={tmp_path / 'text.txt'}", "file=EMPTY": f"file={tmp_path / 'empty.txt'}"}
    with pytest.raises(SystemExit) as exit_info:
        score_main([f"ckpt_path={run}", *(files.get(arg, arg) for arg in extra)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
