"""A checkpoint is only ever read with torch.load(weights_only=True): a file that would run code is refused by every
command that reads one, and nothing in it runs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from lmtrain.cli.failures import RunFolder, run_guarded
from lmtrain.run.run import train
from lmtrain.run_folder.checkpoints import AtomicCheckpointIO, read_checkpoint
from lmtrain.run_folder.ckpt_path import CheckpointError
from lmtrain.tools.diagnose import main as diagnose_main
from lmtrain.tools.generate import main as generate_main
from lmtrain.tools.score import main as score_main
from tests.conftest import make_config
from tests.test_seeded_metrics import OLD_RUNS, seeded_overrides


class Planted:
    """Unpickling it opens ``path`` for writing, which creates the file: what a malicious checkpoint would do."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """(run folder whose last.ckpt is an lmtrain checkpoint with one planted entry, the file it would create)."""
    run, marker = tmp_path / "shared_run", tmp_path / "was_run.txt"
    shutil.copytree(OLD_RUNS / "full", run)
    ckpt = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["lmtrain"]["note"] = Planted(marker)
    torch.save(checkpoint, ckpt)
    with pytest.raises(CheckpointError, match=r"refused: it holds (builtins|io)\.open"):
        read_checkpoint(ckpt)
    assert not marker.exists()
    return run, marker


@pytest.mark.parametrize(
    ("tool", "extra"),
    [(score_main, ["file=TEXT", "out=OUT"]), (generate_main, ["prompt=1 2 3"]), (diagnose_main, [])],
    ids=["score", "generate", "diagnose"],
)
def test_the_tools_refuse_a_checkpoint_that_would_run_code(planted, tmp_path, capsys, tool, extra):
    run, marker = planted
    text, out = tmp_path / "text.txt", tmp_path / "scores.csv"
    text.write_text("1 2 3\n")
    argv = [a.replace("TEXT", str(text)).replace("OUT", str(out)) for a in extra]
    for target in (run, run / "checkpoints" / "last.ckpt"):  # a run folder, or the file
        with pytest.raises(SystemExit) as stop:
            tool([f"ckpt_path={target}", *argv])
        assert stop.value.code == 2
        [line] = capsys.readouterr().err.strip().splitlines()  # one line naming the file and why
        assert str(run / "checkpoints" / "last.ckpt") in line and "refused" in line and "open" in line
    assert not marker.exists() and not out.exists()


def test_resume_refuses_a_checkpoint_that_would_run_code(planted, tmp_path, capsys, monkeypatch):
    run, marker = planted
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    new_run = tmp_path / "resumed"
    cfg = make_config([*seeded_overrides("full", new_run), f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    with pytest.raises(SystemExit) as stop:
        run_guarded(train, cfg, RunFolder(started=time.time(), own=True))
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "refused" in line and str(run / "checkpoints" / "last.ckpt") in line
    assert not marker.exists() and not new_run.exists()  # nothing ran, nothing was written


def test_lightning_reads_checkpoints_through_the_safe_loader(planted):
    """Lightning's own reads (the resume it does, the test of the best checkpoint) go through AtomicCheckpointIO."""
    run, marker = planted
    with pytest.raises(CheckpointError, match="refused"):
        AtomicCheckpointIO().load_checkpoint(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert not marker.exists()
    for old in ("full", "rff"):  # what older lmtrain wrote needs no extra types
        saved = AtomicCheckpointIO().load_checkpoint(OLD_RUNS / old / "checkpoints" / "last.ckpt")
        assert saved["state_dict"] and saved["lmtrain"]["signature"]
