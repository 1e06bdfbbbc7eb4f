"""A signal during training ends the run at a step boundary with last.ckpt at that step, and resuming it gives the
uninterrupted run's result. Signals are sent from inside the run (tests.helpers.SignalAtStep) so the step is known;
tests/test_resume.py sends a SIGTERM to a command from outside."""

from __future__ import annotations

import logging
import os
import signal
import stat

import pytest
import torch

from lmtrain.run.run import train

COMMON = [  # 32 windows per epoch; no periodic checkpoint before the end, so the stop's last.ckpt is the only one
    "trainer.max_epochs=2",
    "model.dropout=0.3",
    "checkpoint_every_n_steps=1000",
    "test_after_fit=false",
    "data.train_tokens=10000",
]


def signal_at(step: int, name: str, again: str | None = None) -> list[str]:
    sent = ["+callbacks.sig._target_=tests.helpers.SignalAtStep", f"+callbacks.sig.step={step}"]
    return [*sent, f"+callbacks.sig.signal={name}", *([f"+callbacks.sig.again={again}"] if again else [])]


def stopped(cfg, status: int) -> dict:
    """Run ``cfg``, which a signal stops with exit status ``status``; its last.ckpt."""
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in a background job
    with pytest.raises(SystemExit) as stop:
        train(cfg)
    assert stop.value.code == status
    assert signal.getsignal(signal.SIGINT) is before  # handlers are given back
    return torch.load(cfg.run_dir + "/checkpoints/last.ckpt", weights_only=True)


def test_sigterm_mid_epoch_saves_the_step_and_resuming_matches_the_straight_run(tiny_config, tmp_path, caplog):
    """A SIGTERM during step 45 (mid epoch 2), a SIGINT while last.ckpt is written: exit 143, last.ckpt at 45."""
    caplog.set_level(logging.INFO)
    expected = train(tiny_config(*COMMON, run_dir=tmp_path / "straight"))
    split = tiny_config(*COMMON, *signal_at(44, "SIGTERM", again="SIGINT"), run_dir=tmp_path / "split")
    saved = stopped(split, 143)
    assert saved["global_step"] == 45 and saved["lmtrain"]["batches_done"] == 45 - 32  # the step under way, done
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopped by")]
    assert "SIGTERM at step 45" in line and line.endswith(f"hydra.run.dir={tmp_path / 'split'} ckpt_path=last")
    assert not list((tmp_path / "split" / "checkpoints").glob(".*tmp*"))  # the second signal broke no write

    resumed = train(tiny_config(*COMMON, "ckpt_path=last", run_dir=tmp_path / "split"))
    assert resumed["val/ppl"] == pytest.approx(expected["val/ppl"], rel=1e-6)
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-7, msg=key)


def test_sigint_exits_130_with_the_step_saved(tiny_config):
    saved = stopped(tiny_config(*COMMON, *signal_at(6, "SIGINT")), 130)
    assert saved["global_step"] == 7 and saved["lmtrain"]["batches_done"] == 7


def test_slurm_requeue_signal_saves_requeues_and_ckpt_path_auto_goes_on(tiny_config, tmp_path, monkeypatch, caplog):
    """Under SLURM (Lightning's SLURMEnvironment, auto_requeue on), SIGUSR1 writes last.ckpt, then requeues the job
    with ``scontrol requeue`` (a stand-in here); the same command with ckpt_path=auto then resumes it."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "lm", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    job = [*COMMON, "trainer.max_epochs=1", "ckpt_path=auto"]
    saved = stopped(tiny_config(*job, *signal_at(9, "SIGUSR1")), 128 + signal.SIGUSR1)
    assert saved["global_step"] == 10 and calls.read_text().split() == ["requeue", "4242"]
    caplog.set_level(logging.INFO)
    metrics = train(tiny_config(*job))  # the requeued job: the same command
    assert f"resuming from {tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}" in caplog.text
    assert "val/ppl" in metrics and torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 32


def test_a_handler_the_job_had_for_its_preemption_signal_runs_after_the_write(tiny_config, tmp_path):
    """submitit installs a SIGUSR2 handler that requeues the job: it runs once last.ckpt holds the step."""
    seen = []

    def requeue(signum, frame):
        seen.append(torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"])

    previous = signal.signal(signal.SIGUSR2, requeue)
    try:
        stopped(tiny_config(*COMMON, *signal_at(4, "SIGUSR2")), 128 + signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert seen == [5]


@pytest.mark.parametrize("backend", ["walk", "fixed"])
def test_a_stopped_kernel_run_resumes_on_the_path_of_the_straight_run(tiny_config, tmp_path, backend):
    """output=rff, stopped at step 45 (off the checkpoint schedule): the stop's last.ckpt carries the tree as the steps
    kept it, so the resumed run ends as the straight one, bit for bit (a tree rebuilt at the stop would part it
    from the straight run's draws)."""
    rff = [*COMMON, "output=rff", "sampler.D=32", f"sampler.backend={backend}"]
    expected = train(tiny_config(*rff, run_dir=tmp_path / "straight"))
    saved = stopped(tiny_config(*rff, *signal_at(44, "SIGTERM"), run_dir=tmp_path / "split"), 143)
    assert {"nodes", "deltas", "updates"} <= set(saved["lmtrain"]["kept_state"])
    resumed = train(tiny_config(*rff, "ckpt_path=last", run_dir=tmp_path / "split"))
    assert resumed["val/ppl"] == expected["val/ppl"]
    straight = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "kept_state" not in straight["lmtrain"]  # a checkpoint on the schedule rebuilds the tree instead


def test_checkpoints_by_time_leave_a_kernel_run_unchanged(tiny_config, tmp_path):
    """A timed last.ckpt falls at steps the clock decides: with one after every step the run ends as without."""
    rff = [*COMMON, "trainer.max_epochs=1", "output=rff", "sampler.D=32"]
    expected = train(tiny_config(*rff, run_dir=tmp_path / "untimed"))
    timed = train(tiny_config(*rff, "checkpoint_every_minutes=1e-9", run_dir=tmp_path / "timed"))
    assert timed["val/ppl"] == expected["val/ppl"]
