"""Host time around Lightning's loop through its public API only: a profiler that records nothing, Lightning's own
checkpoint callbacks, the metrics files saved at most every few seconds."""

from __future__ import annotations

import csv
import re
from datetime import timedelta

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import PassThroughProfiler

from lmtrain.run.host_time import NoProfiler


def test_no_profiler_hands_back_one_reusable_context_and_records_nothing():
    profiler = NoProfiler()
    with profiler.profile("[Callback]x.on_train_batch_end") as entered:
        assert entered is None
    assert profiler.profile("a") is profiler.profile("b")  # no context manager built per hook call
    assert profiler.summary() == ""
    assert PassThroughProfiler().profile("a") is not PassThroughProfiler().profile("a")  # what it replaces


def test_periodic_checkpoints_are_lightnings_own_and_an_earlier_single_one_resumes_without_a_warning(
    tiny_config, tmp_path, recwarn
):
    """Lightning's ModelCheckpoint by steps and another by minutes (no private attribute set); a checkpoint whose
    one periodic callback did both (earlier lmtrain) resumes without Lightning's missing-callback warning, which
    still names any other callback missing."""
    from lmtrain.process.library_logs import OLD_PERIODIC
    from lmtrain.run.run import train
    from lmtrain.run.trainer import build_callbacks

    cfg = tiny_config("checkpoint_every_n_steps=3", "trainer.max_steps=6", "test_after_fit=false")
    best, steps, minutes = build_callbacks(cfg, tmp_path / "checkpoints", "")[:3]
    assert all(isinstance(c, ModelCheckpoint) for c in (best, steps, minutes))  # the timed one: off the schedule
    assert minutes.state_key.startswith("ModelCheckpoint{")  # the key earlier runs' checkpoints hold
    assert "'every_n_train_steps': 3" in steps.state_key and repr(timedelta(minutes=5)) in minutes.state_key
    train(cfg)
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    single = steps.state_key.replace("None}", "datetime.timedelta(seconds=300)}")  # both triggers in one callback
    checkpoint["callbacks"][single] = checkpoint["callbacks"].pop(steps.state_key)
    del checkpoint["callbacks"][minutes.state_key]
    torch.save(checkpoint, path)
    train(tiny_config(f"ckpt_path={path}", "trainer.max_steps=9", "test_after_fit=false", run_dir=tmp_path / "on"))
    assert not [w for w in recwarn if "callbacks used to create the checkpoint" in str(w.message)]
    assert (tmp_path / "on" / "checkpoints" / "last.ckpt").is_file()
    assert re.match(OLD_PERIODIC, _missing([single]))
    assert not re.match(OLD_PERIODIC, _missing([single, "EarlyStopping{'monitor': 'val/ppl', 'mode': 'min'}"]))
    assert not re.match(OLD_PERIODIC, _missing([steps.state_key]))


def _missing(keys: list[str]) -> str:
    """Lightning's warning when a checkpoint holds the state of callbacks that the run lacks (trainer/call.py)."""
    return (
        "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided during "
        f"`Trainer` instantiation. Please add the following callbacks: {keys}."
    )


def test_metrics_csv_is_written_at_most_every_few_seconds_and_complete_at_the_end(tiny_config, tmp_path, monkeypatch):
    """A save per log interval cost as much as a small model's step: the training steps save the loggers only when
    SAVE_EVERY_SECONDS passed (the first interval's save, then none within an hour), and the files still get every
    step's row (Lightning saves them at validation and at the end)."""
    import lightning.pytorch.loggers as loggers

    from lmtrain.run.run import train
    from lmtrain.training import module

    saves: list[int] = []
    real_save = loggers.CSVLogger.save
    monkeypatch.setattr(loggers.CSVLogger, "save", lambda self: saves.append(1) or real_save(self))
    counted = {}
    for seconds in (0.0, 3600.0):
        monkeypatch.setattr(module, "SAVE_EVERY_SECONDS", seconds)
        saves.clear()
        run = tmp_path / f"run-{seconds}"
        train(tiny_config("trainer.max_steps=40", "trainer.log_every_n_steps=5", "test_after_fit=false", run_dir=run))
        with open(run / "metrics.csv") as f:
            assert len({row["step"] for row in csv.DictReader(f) if row.get("train/loss")}) == 40  # nothing lost
        counted[seconds] = len(saves)
    assert counted[0.0] - counted[3600.0] == 7  # 8 log intervals: each saved, or only the first


def test_a_run_without_validation_has_no_best_checkpoint_and_no_warning_about_val_ppl(tiny_config, tmp_path, recwarn):
    from lmtrain.run.run import train

    run = tmp_path / "run"
    train(tiny_config("trainer.max_steps=6", "trainer.limit_val_batches=0", "test_after_fit=false", run_dir=run))
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]
    assert not list((run / "checkpoints").glob("best-*.ckpt"))
    assert (run / "checkpoints" / "last.ckpt").is_file()  # the periodic callback still writes it
