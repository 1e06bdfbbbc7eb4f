"""A resumed run's metrics.csv has one row per step: the rows a killed run wrote after its checkpoint are dropped on
resume (the resumed run logs those steps again), every row before it stays as it was."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lmtrain.run.run import train
from lmtrain.run_folder.metrics_csv import drop_rows_from
from tests.helpers import SimulatedCrash

HEADER = "epoch,lr,step,train/loss,val/ppl"
ROWS = ["0,,0,4.6,", "0,1.0,1,4.5,", "0,,2,4.4,90.1", "1,,3,4.3,", "1,1.0,4,4.2,", "1,,5,4.1,88.0"]


def test_rows_from_the_step_on_are_dropped_and_the_rows_before_kept_byte_for_byte(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes("\r\n".join([HEADER, *ROWS, ""]).encode())  # as Lightning's csv writer writes it
    assert drop_rows_from(path, 3) == 3
    assert path.read_bytes() == "\r\n".join([HEADER, *ROWS[:3], ""]).encode()
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # the temporary file renamed over it


def test_a_file_without_rows_to_drop_is_left_alone(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes("\r\n".join([HEADER, *ROWS, ""]).encode())
    before = path.stat()
    assert drop_rows_from(path, 6) == 0
    assert path.stat().st_ino == before.st_ino and path.stat().st_mtime_ns == before.st_mtime_ns


def rows(run: Path) -> list[dict[str, str]]:
    """metrics.csv without the columns that time the run."""
    with open(run / "metrics.csv", newline="") as f:
        timing = ("tokens_per_sec", "train/seconds")
        return [{k: v for k, v in row.items() if k not in timing} for row in csv.DictReader(f)]


def test_a_killed_run_resumed_has_the_rows_of_the_straight_run(tiny_config, tmp_path):
    """Killed after step 25, its last checkpoint at step 20: without the trim, steps 20-24 would have two rows."""
    common = ["trainer.max_epochs=2", "checkpoint_every_n_steps=10", "test_after_fit=false", "data.train_tokens=10000"]
    train(tiny_config(*common, run_dir=tmp_path / "straight"))
    crash = ["+callbacks.c._target_=tests.helpers.CrashAtStep", "+callbacks.c.step=25"]
    with pytest.raises(SimulatedCrash):
        train(tiny_config(*common, *crash, run_dir=tmp_path / "split"))
    assert max(int(row["step"]) for row in rows(tmp_path / "split")) >= 20  # written past the checkpoint
    train(tiny_config(*common, "ckpt_path=last", run_dir=tmp_path / "split"))
    assert rows(tmp_path / "split") == rows(tmp_path / "straight")
