"""What a person sees while a run trains: validations enough for a curve by default, a progress bar over the run's
steps with log lines above it and one number format, and, without a terminal, a few plain lines and no redraws."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from lmtrain.run.trainer import default_val_check_interval
from lmtrain.tools.run_records import read_metrics
from tests.conftest import make_config

PTB_WINDOWS = 1328  # training windows of a PTB epoch at batch 20 x bptt 35
# 375 windows per epoch: 300 steps end inside the first one
LONGER = ["data.train_tokens=120000", "progress_bar=true", "trainer.val_check_interval=null"]


@pytest.mark.parametrize(
    ("overrides", "interval"),
    [
        (["trainer.max_steps=300"], 30),  # inside the epoch: about 10 validations
        (["trainer.max_steps=1000"], 100),  # the README's sweep
        (["trainer.max_steps=300", "trainer.accumulate_grad_batches=2"], 60),  # Lightning counts batches
        (["trainer.max_steps=300", "trainer.val_check_interval=100"], None),  # the user's interval wins
        (["trainer.max_steps=300", "trainer.val_check_interval=0.5"], None),
        (["trainer.max_steps=300", "trainer.check_val_every_n_epoch=2"], None),
        (["trainer.max_steps=2000"], None),  # past the first epoch: at each epoch's end, as before
        (["trainer.max_steps=-1"], None),  # epochs only
        (["trainer.max_steps=5"], None),  # a few steps: the validation at their end is enough
        (["trainer.max_steps=8"], 5),  # at least 5 steps apart
        (["trainer.max_steps=300", "trainer.limit_train_batches=200"], None),  # a shorter epoch, ending first
    ],
)
def test_a_run_inside_one_epoch_validates_about_ten_times_unless_told_otherwise(overrides, interval):
    cfg = make_config(overrides)
    before = cfg.trainer.val_check_interval
    assert default_val_check_interval(cfg, PTB_WINDOWS) == interval
    assert cfg.trainer.val_check_interval == (before if interval is None else interval)


def test_without_a_terminal_the_run_writes_a_few_plain_lines(tiny_config, tmp_path, monkeypatch):
    """300 steps: 20 progress lines of the run's 300 steps, no carriage-return redraws, a few KB; 10 validations
    (every 30 steps, the last at the end); the bar's total is max_steps, not the epoch's 375 windows."""
    from lmtrain.run.run import train

    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a file: not a terminal
    bar = tmp_path / "bar.json"
    record = ["+callbacks.bar._target_=tests.helpers.RecordProgressBar", f"+callbacks.bar.path={bar}"]
    train(tiny_config(*LONGER, "trainer.max_steps=300", "test_after_fit=false", *record))
    out = sys.stdout.getvalue()
    assert json.loads(bar.read_text()) == {"desc": "Epoch 0: ", "total": 300, "n": 1}
    assert "\r" not in out and len(out.encode()) < 4096, (len(out), out[:500])
    progress = [line for line in out.splitlines() if re.match(r"Epoch 0 \| \d+/300 steps \| ", line)]
    assert [int(line.split()[3].split("/")[0]) for line in progress] == list(range(15, 301, 15))
    assert re.search(r"train/loss \d+\.\d{4}( \||$)", progress[-1]) and "val/ppl" in progress[-1]
    validated = [step + 1 for step, _, _ in read_metrics(tmp_path / "run" / "metrics.csv")["val/ppl"]]
    assert validated == list(range(30, 301, 30))


ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Terminal(io.StringIO):
    """stdout as a terminal: tqdm draws its bar with redraws, as on a screen."""

    def isatty(self) -> bool:
        return True


def as_terminal(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Terminal:
    """sys.stdout as a terminal, with a console log handler on it as Hydra's (message only). Called in the test:
    pytest sets its own sys.stdout again after the fixtures."""
    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    handler = logging.StreamHandler(screen)
    handler.setFormatter(logging.Formatter("%(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    caplog.set_level(logging.INFO)  # restored after the test
    return screen


def test_in_a_terminal_the_bar_counts_max_steps_and_log_lines_go_above_it(tiny_config, monkeypatch, caplog):
    from lmtrain.run.run import train

    terminal = as_terminal(monkeypatch, caplog)
    train(tiny_config(*LONGER, "trainer.max_steps=300", "test_after_fit=false"))
    pieces = re.split(r"[\r\n]", ESCAPES.sub("", terminal.getvalue()))  # cursor moves left out
    bars = [p for p in pieces if re.match(r"Epoch 0: +\d+%", p)]
    assert bars and all(re.search(r"\| *\d+/300 \[", p) for p in bars), bars[:3]  # the run's steps, not 375
    lines = [p for p in pieces if "val/ppl " in p]
    assert len(lines) == 10 and all(p.startswith("epoch 0 | ") for p in lines), lines  # whole lines, not glued
    for line in lines:  # the bar drawn after a validation shows val/ppl as its log line wrote it
        value = re.search(r"val/ppl (\S+) ", line).group(1)
        assert re.fullmatch(r"\d+\.\d\d", value) and any(f"val/ppl={value}" in p for p in bars), value


def test_with_a_time_limit_the_bar_shows_the_time_left_to_it(tiny_config, monkeypatch, caplog):
    from lmtrain.run.run import train

    terminal = as_terminal(monkeypatch, caplog)
    train(tiny_config(*LONGER, "max_train_seconds=1", "test_after_fit=false", "trainer.max_epochs=3"))
    bars = [p for p in re.split(r"[\r\n]", terminal.getvalue()) if re.match(r"Epoch \d: +\d+%", p)]
    left = [re.search(r"<(\d\d):(\d\d),", p) for p in bars]
    assert bars and all(m is not None and int(m.group(1)) * 60 + int(m.group(2)) <= 1 for m in left), bars[-3:]
