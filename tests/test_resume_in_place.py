"""``ckpt_path=last`` without a run folder goes on in the folder of the run it resumes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from lmtrain.run_folder.ckpt_path import resume_in_place
from tests.cli_runs import TINY, run_cli


def earlier_run(root: Path, name: str, overrides: list[str], mtime: float) -> Path:
    folder = root / "2026-01-01" / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    os.utime(folder / "checkpoints" / "last.ckpt", (mtime, mtime))
    return folder


def test_the_newest_run_with_the_same_overrides_is_the_run_folder(tmp_path):
    old = earlier_run(tmp_path, "10-00-00", ["output=rff", "sampler.D=64"], 1e9)
    new = earlier_run(tmp_path, "11-00-00", ["sampler.D=64", "output=rff", "ckpt_path=last"], 2e9)
    earlier_run(tmp_path, "12-00-00", ["output=rff"], 3e9)  # other overrides
    args = ["output=rff", "sampler.D=64", "ckpt_path=last"]
    assert resume_in_place(args, tmp_path) == [*args, f"hydra.run.dir={new}"]
    assert resume_in_place(["-cd", "mine", *args], tmp_path)[-1] == f"hydra.run.dir={new}"
    assert old != new
    for unchanged in (
        ["output=rff", "sampler.D=64"],  # no resume
        [*args, "hydra.run.dir=somewhere"],  # a folder named
        ["-m", *args],  # a sweep: each job has its folder
        ["output=full", "ckpt_path=last"],  # no earlier run: train's error says so
    ):
        assert resume_in_place(unchanged, tmp_path) == unchanged


@pytest.mark.slow  # two CLI runs, ~15 s
def test_a_resumed_run_stays_in_its_folder_without_library_warnings(tmp_path):
    args = [*TINY, "logger=csv", "trainer.max_steps=4"]
    run_cli(args, tmp_path)
    resumed = run_cli([*args, "ckpt_path=last"], tmp_path)
    [folder] = (tmp_path / "outputs").glob("*/*")
    assert resumed.stdout.strip().splitlines()[-1].endswith(f"— {folder.relative_to(tmp_path)}")
    assert "val ppl" in resumed.stdout  # the best checkpoint's score came back with its folder
    assert "dirpath" not in resumed.stdout + resumed.stderr
    assert "ckpt_path=last" in (folder / ".hydra" / "overrides.yaml").read_text()


def test_one_wandb_sync_command_names_every_offline_segment_of_the_run(tmp_path):
    """A run resumed in its own folder and then in a new one: the line names its three segments, oldest first,
    and neither another run's segment nor a segment's files."""
    from lmtrain.run.loggers.wandb_run import resumed_from, sync_line

    first, second = tmp_path / "first" / "wandb", tmp_path / "second" / "wandb"
    segments = [first / "offline-run-20260101_100000-abc", first / "offline-run-20260101_110000-abc"]
    segments.append(second / "offline-run-20260102_090000-abc")
    for folder in [*segments, first / "offline-run-20260101_120000-xyz", first / "latest-run"]:
        folder.mkdir(parents=True)
    resumed_from([tmp_path / "first"])
    try:
        line = sync_line(segments[-1])
    finally:
        resumed_from([])
    assert line == f"lmtrain: W&B run saved offline; upload it with: wandb sync {' '.join(map(str, segments))}"
    assert sync_line(segments[-1]).endswith(f"wandb sync {segments[-1]}")  # a fresh run: its own folder only
