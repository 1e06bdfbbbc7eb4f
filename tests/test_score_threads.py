"""python -m lmtrain.score threads=: the compute threads as training chooses them, fewer on a busy machine."""

from __future__ import annotations

import pytest
import torch

import lmtrain.process.threads as threads
import lmtrain.tools.score as score_tool
from lmtrain.tools.score import main as score_main
from lmtrain.tools.score import score


@pytest.fixture
def scored_with(trained_run, tmp_path, monkeypatch):
    """scored_with(*args) -> the torch threads the scoring ran with."""
    run, _ = trained_run("full")
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3 w0 w1\n")
    seen, before = [], torch.get_num_threads()
    inner = score_tool.stream_log_probs

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return inner(*args, **kwargs)

    monkeypatch.setattr(score_tool, "stream_log_probs", recording)

    def run_score(*args: str) -> int:
        score([f"ckpt_path={run}", f"file={text}", f"out={tmp_path / 'o.csv'}", *args])
        return seen[-1]

    yield run_score
    torch.set_num_threads(before)


def test_threads_given_are_the_threads_used(scored_with):
    assert scored_with("threads=1") == 1
    assert scored_with("threads=2") == 2


def test_threads_auto_takes_fewer_on_a_busy_machine(scored_with, monkeypatch):
    for name in ("OMP_NUM_THREADS", threads.JOBS_ENV):  # no thread count given, no other job declared
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads, "busy_cores", lambda: 3.5)  # other processes hold 3.5 of the 4 cores
    assert scored_with() == 1
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)
    assert scored_with("threads=auto") == 4


def test_a_bad_thread_count_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        score_main(["ckpt_path=x", "file=y", "threads=0"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().endswith("threads must be a positive number or 'auto', got '0'")
