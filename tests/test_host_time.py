"""The host-time helpers around Lightning's loop keep what the replaced pieces did."""

from __future__ import annotations

import csv
from datetime import timedelta

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import PassThroughProfiler

from lmtrain.training.host_time import FastAttributes, NoProfiler, RunCheckpoint


def test_run_checkpoint_keeps_lightnings_state_key_so_old_checkpoints_restore_their_callback_state(tmp_path):
    kwargs = dict(dirpath=tmp_path, monitor="val/ppl", mode="min", save_last=True)
    assert RunCheckpoint(**kwargs).state_key == ModelCheckpoint(**kwargs).state_key


def test_run_checkpoint_triggers_by_steps_and_by_minutes_in_one_callback(tmp_path):
    both = RunCheckpoint(dirpath=tmp_path, every_n_train_steps=500, every_minutes=5.0, save_top_k=0)
    assert both._every_n_train_steps == 500
    assert both._train_time_interval == timedelta(minutes=5)
    steps_only = RunCheckpoint(dirpath=tmp_path, every_n_train_steps=500, save_top_k=0)
    assert both.state_key != steps_only.state_key and "seconds=300" in both.state_key


def test_no_profiler_hands_back_one_reusable_context_and_records_nothing():
    profiler = NoProfiler()
    with profiler.profile("[Callback]x.on_train_batch_end") as entered:
        assert entered is None
    assert profiler.profile("a") is profiler.profile("b")  # no context manager built per hook call
    assert profiler.summary() == ""
    assert PassThroughProfiler().profile("a") is not PassThroughProfiler().profile("a")  # what it replaces


class _Module(FastAttributes, torch.nn.Module):
    FAST_ATTRIBUTES = FastAttributes.FAST_ATTRIBUTES | {"_count"}

    def __init__(self) -> None:
        super().__init__()
        self._count = 0
        self.layer = torch.nn.Linear(2, 2)


def test_fast_attributes_skip_module_bookkeeping_only_for_the_listed_names():
    module = _Module()
    module._count, module._current_fx_name = 3, "training_step"
    assert module.__dict__["_count"] == 3 and module.__dict__["_current_fx_name"] == "training_step"
    module.other = torch.nn.Linear(2, 2)  # any other name still registers submodules and parameters
    assert "other" in module._modules and len(list(module.parameters())) == 4


def test_metrics_csv_is_written_at_most_every_few_seconds_and_complete_at_the_end(tiny_config, tmp_path, monkeypatch):
    """A save per log interval cost as much as a small model's step: the training steps save the loggers only when
    SAVE_EVERY_SECONDS passed (the first interval's save, then none within an hour), and the files still get every
    step's row (Lightning saves them at validation and at the end)."""
    import lightning.pytorch.loggers as loggers

    from lmtrain.training import metered_module
    from lmtrain.training.run import train

    saves: list[int] = []
    real_save = loggers.CSVLogger.save
    monkeypatch.setattr(loggers.CSVLogger, "save", lambda self: saves.append(1) or real_save(self))
    counted = {}
    for seconds in (0.0, 3600.0):
        monkeypatch.setattr(metered_module, "SAVE_EVERY_SECONDS", seconds)
        saves.clear()
        run = tmp_path / f"run-{seconds}"
        train(tiny_config("trainer.max_steps=40", "trainer.log_every_n_steps=5", "test_after_fit=false", run_dir=run))
        with open(run / "metrics.csv") as f:
            assert len({row["step"] for row in csv.DictReader(f) if row.get("train/loss")}) == 40  # nothing lost
        counted[seconds] = len(saves)
    assert counted[0.0] - counted[3600.0] == 7  # 8 log intervals: each saved, or only the first


def test_a_run_without_validation_has_no_best_checkpoint_and_no_warning_about_val_ppl(tiny_config, tmp_path, recwarn):
    from lmtrain.training.run import train

    run = tmp_path / "run"
    train(tiny_config("trainer.max_steps=6", "trainer.limit_val_batches=0", "test_after_fit=false", run_dir=run))
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]
    assert not list((run / "checkpoints").glob("best-*.ckpt"))
    assert (run / "checkpoints" / "last.ckpt").is_file()  # the periodic callback still writes it
