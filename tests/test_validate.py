"""The command line and the config checked before anything starts: one line naming the key and what it must be."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
import yaml

from lmtrain.cli.failures import RunFolder, discard_run_folder
from lmtrain.common.run_options import RunConfig
from lmtrain.config import CONF_DIR, ConfigError, check_config, choices
from tests.command_line import refusal
from tests.conftest import make_config


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["optim.lr=abc"], "optim.lr must be a number, got 'abc'"),
        (["trainer.max_epochs=-3"], "trainer.max_epochs must be >= -1 (-1: no limit), got -3"),
        (["trainer.max_epochs=abc"], "trainer.max_epochs must be an integer or null, got 'abc'"),
        (["trainer.max_steps=1.5"], "trainer.max_steps must be an integer, got 1.5"),
        (["trainer.max_steps=0"], "trainer.max_steps=0 trains nothing: set a positive number of optimizer steps"),
        (["trainer.max_epochs=0"], "trainer.max_epochs=0 trains nothing: set a positive number of epochs, or -1"),
        (["trainer.limit_val_batches=2.0"], "trainer.limit_val_batches must be a fraction of the epoch"),
        (["progress_bar=maybe"], "progress_bar must be true or false, got 'maybe'"),
        (["loss_reduction=avg"], "loss_reduction must be one of 'mean', 'sum', got 'avg'"),
        (["output=rff", "output.correction=x"], "output.correction must be one of 'exact', 'classic', got 'x'"),
        (["model.dropout=1.0"], "model.dropout must be < 1, got 1.0"),
        (["max_train_seconds=0"], "max_train_seconds must be > 0, got 0"),
        (["model.sparse_embedding=sometimes"], "model.sparse_embedding must be"),
        (["data=text"], "data.path must be set"),
        (["trainer.max_epoch=1"], "unknown key trainer.max_epoch: did you mean trainer.max_epochs? (trainer has"),
        (["+trainer.max_epoch=1"], "unknown key trainer.max_epoch: did you mean trainer.max_epochs? (trainer has"),
        (["++foo=1"], "unknown key foo (the top level takes callbacks, checkpoint_every_minutes, "),
        (["++sede=1"], "unknown key sede: did you mean seed?"),
        (["outptu=rff"], "unknown key outptu: did you mean output?"),
        (["+optim.momentm=0.9"], "unknown key optim.momentm: did you mean optim.momentum?"),
        (["hydra.job.chdr=true"], "unknown key hydra.job.chdr: did you mean hydra.job.chdir?"),
        (["+callbacks.c._target_=tests.helpers.CrashAtStep", "+callbacks.c.stp=3"], "did you mean callbacks.c.step?"),
        (["+output.num_classes=5"], "output.num_classes is set by lmtrain"),
        (["+trainer.gradient_clip_val=1"], "trainer.gradient_clip_val is set by lmtrain: use optim.clip"),
        (["trainer.max_time=00:00:10:00"], "add it with +trainer.max_time=00:00:10:00"),
        (["-m", "output=uniform", "output.num_samples=4,0"], "job 1 (output=uniform output.num_samples=0): output"),
        (["-m", "output=uniform,rff", "output.num_samples=10"], "++KEY=VALUE or a sweep of one: 'KEY=choice(VALUE)'"),
        (["optim.lr=[1"], "no viable alternative at input '[1'"),
        (["output=rff", "sampler.D=64", "sampler.unigram_shar=0.1"], "did you mean sampler.unigram_share?"),
    ],
)
def test_mistakes_on_the_command_line_are_one_line(args, expected, tmp_path, monkeypatch, capsys):
    assert expected in refusal(args, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=3"],
        ["-m", "output=uniform,rff", "++output.num_samples=100"],
        ["-m", "output=full,rff", "sampler.D=64"],
        ["-m", "output=uniform,rff", "output.num_samples=choice(100)", "trainer.max_epochs=1,2"],
        ["+trainer.max_time=00:00:10:00", "+trainer.detect_anomaly=true", "trainer.val_check_interval=0.25"],
        ["optim=adam", "+optim.betas=[0.9,0.99]", "+optim.amsgrad=true", "optim.clip=null"],
        ["data=text", "data.path=/some/folder", "hydra.run.dir=/tmp/x", "hydra/launcher=joblib"],
        ["experiment=quick", "data=synthetic", "trainer.max_epochs=null"],
    ],
)
def test_legitimate_overrides_pass(args, tmp_path, monkeypatch, capsys):
    assert refusal(args, tmp_path, monkeypatch, capsys) == ""


def test_every_group_option_passes_the_check():
    """No false alarms: every option of every group, and every preset, as shipped."""
    for group in ("data", "model", "sampler", "output", "optim", "trainer", "logger", "experiment"):
        for choice in choices(group):
            overrides = [f"{group}={choice}", "run_dir=/tmp/unused"]
            overrides += ["data.path=/tmp/x"] if choice == "text" else []
            overrides += ["output=sampled"] if group == "sampler" else []
            check_config(make_config(overrides))


def test_top_level_options_are_the_keys_of_the_schema():
    """RunConfig holds the top-level keys and their defaults; train.yaml only the defaults list and Hydra's own."""
    keys = set(yaml.safe_load((CONF_DIR / "train.yaml").read_text())) - {"defaults", "hydra"}
    parts = {"data", "model", "sampler", "output", "optim", "trainer", "logger"}
    assert not keys and parts < {f.name for f in dataclasses.fields(RunConfig)}
    assert set(make_config(["run_dir=/tmp/unused"])) == {f.name for f in dataclasses.fields(RunConfig)}


def test_composing_checks_the_config_and_train_what_needs_the_data(tiny_config, tmp_path):
    from lmtrain.run.run import train

    with pytest.raises(ConfigError, match="optim.lr must be a number"):
        tiny_config("optim.lr=abc")
    with pytest.raises(ValueError, match="val_check_interval=500 is more than the 188 training batches of an epoch"):
        train(tiny_config("trainer.val_check_interval=500"))
    assert not (tmp_path / "run").exists()  # refused before the run folder, the loggers and the Trainer


def hydra_folder(path: Path) -> Path:
    """A run folder as Hydra leaves it before the run writes anything."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (path / "__main__.log").write_text("")
    return path


def test_a_failed_call_removes_only_its_own_worthless_folder(tmp_path):
    started = time.time() - 1
    empty = hydra_folder(tmp_path / "outputs" / "2026-01-01" / "12-00-00")
    (empty / "metrics.csv").write_text("epoch,step\n")  # a header, no rows
    assert discard_run_folder(empty, RunFolder(started, own=True, parents=2))
    assert not (tmp_path / "outputs").exists()  # the dated parents it left empty go too

    kept = []
    with_rows = hydra_folder(tmp_path / "rows")
    (with_rows / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.6\n")
    kept.append(with_rows)
    resumed = hydra_folder(tmp_path / "resumed")
    (resumed / "checkpoints").mkdir()
    (resumed / "checkpoints" / "last.ckpt").write_bytes(b"x")
    kept.append(resumed)
    older = hydra_folder(tmp_path / "older")
    os.utime(older / "__main__.log", (started - 100, started - 100))  # there before this call
    kept.append(older)
    for folder in kept:
        assert not discard_run_folder(folder, RunFolder(started, own=True)) and folder.is_dir()
