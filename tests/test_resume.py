"""Exact resume after a SIGKILL or a SIGTERM, and atomic checkpoint writes."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lmtrain.run_folder.checkpoints import AtomicCheckpointIO, read_checkpoint
from tests.cli_runs import (
    TINY,
    WINDOWS_PER_EPOCH,
    cli_env,
    last_step,
    lmtrain,
    run_cli,
    run_info,
    the,
    wandb_records,
)


@pytest.mark.slow  # three CLI runs, ~30 s; tests/test_train.py resumes mid epoch in process (fast)
def test_sigkill_mid_epoch_then_resume_matches_the_uninterrupted_run(tmp_path):
    common = [
        *TINY,
        "output=uniform",
        "output.num_samples=8",
        "model.dropout=0.3",  # dropout masks and the negatives both come from the RNG that must be restored
        "optim=sgd",
        "optim.lr=0.5",
        "optim.schedule.start=1",  # the learning rate halves after each epoch
        "loss_reduction=mean",
        "trainer.max_epochs=2",
        "checkpoint_every_n_steps=2",
        "test_after_fit=false",
        "trainer.log_every_n_steps=4",
    ]
    straight, split = tmp_path / "straight", tmp_path / "split"
    env = cli_env(tmp_path, WANDB_MODE="offline")
    reference = subprocess.Popen(lmtrain(*common, "logger=csv", f"hydra.run.dir={straight}"), cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    victim = subprocess.Popen(lmtrain(*common, "logger=wandb", f"hydra.run.dir={split}"), cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        kill_after = WINDOWS_PER_EPOCH + WINDOWS_PER_EPOCH // 3  # a checkpoint in the middle of epoch 2
        deadline = time.monotonic() + 300
        while last_step(split / "checkpoints" / "last.ckpt") < kill_after:
            assert victim.poll() is None, f"the run ended before it could be killed: {victim.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint appeared in time"
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.stderr.close()
    killed_at = read_checkpoint(split / "checkpoints" / "last.ckpt")
    assert kill_after <= killed_at["global_step"] < 2 * WINDOWS_PER_EPOCH  # mid epoch 2
    assert not (split / "run.json").is_file() or not run_info(split)["metrics"]  # it never finished

    resume_matches_straight(common, tmp_path, split, straight, reference)
    killed, continued = sorted((split / "wandb").glob("offline-run-*"))  # offline-run-TIME-ID
    assert the(wandb_records(continued), "run").run_id == killed.name.rsplit("-", 1)[1]  # the same W&B run


@pytest.mark.slow  # three CLI runs, ~40 s; tests/test_stop.py stops runs in process (fast)
def test_sigterm_mid_run_saves_the_step_and_resume_matches_the_uninterrupted_run(tmp_path):
    """No periodic checkpoint but the one at each epoch's validation: the stop writes last.ckpt itself, at the step
    it reached, closes the W&B run and exits 143; ckpt_path=last then ends as the uninterrupted run does."""
    common = [*TINY, "output=uniform", "output.num_samples=8", "model.dropout=0.3", "optim=sgd", "optim.lr=0.5",
              "loss_reduction=mean", "trainer.max_epochs=3", "checkpoint_every_n_steps=1000",
              "test_after_fit=false"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    env = cli_env(tmp_path, WANDB_MODE="offline")
    reference = subprocess.Popen(lmtrain(*common, "logger=csv", f"hydra.run.dir={straight}"), cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    victim = subprocess.Popen(lmtrain(*common, "logger=wandb", f"hydra.run.dir={split}"), cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while last_step(split / "checkpoints" / "last.ckpt") < WINDOWS_PER_EPOCH:  # the first validation's
            assert victim.poll() is None, f"the run ended before it could be stopped: {victim.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint appeared in time"
            time.sleep(0.05)
        victim.send_signal(signal.SIGTERM)
        output, _ = victim.communicate(timeout=120)
    finally:
        victim.kill()
    assert victim.returncode == 128 + signal.SIGTERM, output[-3000:]
    step = read_checkpoint(split / "checkpoints" / "last.ckpt")["global_step"]
    assert WINDOWS_PER_EPOCH < step < 3 * WINDOWS_PER_EPOCH  # the step reached, not the last validation's
    [line] = [s for s in output.splitlines() if "stopped by SIGTERM" in s]
    assert f"at step {step}," in line and line.endswith("hydra.run.dir=split ckpt_path=last")  # relative to the cwd
    [stopped] = (split / "wandb").glob("offline-run-*")
    assert the(wandb_records(stopped), "exit").exit_code == 143  # the W&B run was closed

    resume_matches_straight(common, tmp_path, split, straight, reference)


def resume_matches_straight(
    common: list[str], tmp_path: Path, split: Path, straight: Path, reference: subprocess.Popen
) -> None:
    """Resume the interrupted run in ``split`` with ckpt_path=last: it must end as the uninterrupted ``reference``
    run in ``straight`` does (its val/ppl and every weight)."""
    run_cli([*common, "logger=wandb", "ckpt_path=last", f"hydra.run.dir={split}"], tmp_path, WANDB_MODE="offline")
    assert reference.wait(timeout=400) == 0
    expected, resumed = run_info(straight)["metrics"], run_info(split)["metrics"]
    assert math.isfinite(expected["val/ppl"])
    assert abs(resumed["val/ppl"] - expected["val/ppl"]) <= 1e-6 * expected["val/ppl"]
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(split / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-7, msg=key)


KILLED_WRITER = """
import io, sys, time
import torch
from lmtrain.run_folder.checkpoints import AtomicCheckpointIO

path = sys.argv[1]
AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(4)}, "lmtrain": {"version": 1}}, path)
real_save = torch.save

def half_then_hang(obj, f, *args, **kwargs):  # write half of the new checkpoint, then get killed
    buffer = io.BytesIO()
    real_save(obj, buffer)
    f.write(buffer.getvalue()[: buffer.tell() // 2])
    f.flush()
    print("inside save_checkpoint", flush=True)
    time.sleep(120)

torch.save = half_then_hang
AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(4096)}, "lmtrain": {"version": 2}}, path)
"""


def test_a_kill_during_checkpoint_writing_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=tmp_path,
                              env=cli_env(tmp_path), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "inside save_checkpoint"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
    finally:
        writer.kill()
        writer.stdout.close()
    [partial] = path.parent.glob(".last.ckpt.tmp-*")  # the interrupted write went to a temporary file ...
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises for a truncated file
        torch.load(partial, weights_only=True)
    checkpoint = read_checkpoint(path)  # ... and the previous checkpoint is whole
    assert checkpoint["lmtrain"]["version"] == 1 and torch.equal(checkpoint["state_dict"]["w"], torch.ones(4))
    live = path.with_name(f".last.ckpt.tmp-{os.getppid()}")  # a live writer's (our parent's) file is left alone
    live.write_bytes(b"partial")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "lmtrain": {"version": 3}}, path)
    assert not partial.exists() and live.exists()  # the next save cleans up after the killed writer
    assert read_checkpoint(path)["lmtrain"]["version"] == 3
