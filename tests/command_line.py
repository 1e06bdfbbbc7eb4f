"""``python -m lmtrain ARGS`` in this process, up to the moment Hydra hands the task its config: what the command
line refuses (one line, exit 2, nothing written), seconds faster than a process per case."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import hydra
import pytest
from omegaconf import DictConfig

from lmtrain.cli.app import run_app
from lmtrain.config import CONF_DIR

ACCEPTED: list[DictConfig] = []  # the configs the last call handed to its task, one per job


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def accept(cfg: DictConfig) -> None:
    """The task of a command line that passed every check: it keeps the config and trains nothing."""
    ACCEPTED.append(cfg)


def refusal(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """The one line (without its ``lmtrain: error:`` prefix) that ``python -m lmtrain ARGS`` stops with; the empty
    string when it is accepted. A refusal must exit with code 2 and leave nothing behind."""
    out = tmp_path / "out"
    folders = [f"hydra.run.dir={out}/run", f"hydra.sweep.dir={out}/multirun"]
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["lmtrain", *args, *folders, *quiet])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # as run_app sets it; restored after the test
    ACCEPTED.clear()
    capsys.readouterr()
    try:
        run_app(accept)
    except SystemExit as exit:
        err = capsys.readouterr().err
        assert exit.code == 2, err
        [line] = err.strip().splitlines()
        assert line.startswith("lmtrain: error: ") and not out.exists()
        return line.removeprefix("lmtrain: error: ")
    assert ACCEPTED, "the task was not called"
    shutil.rmtree(out, ignore_errors=True)  # the accepted run's folder: the next call must find none
    return ""
