"""End-to-end runs of `train(cfg)` on the synthetic corpus: learning, resume, and protection of old files."""

from __future__ import annotations

import csv
import json
import logging
import math
import re

import pytest
import torch

from lmtrain.cli.failures import run_guarded
from lmtrain.run.run import train
from lmtrain.run_folder.ckpt_path import CheckpointError
from lmtrain.training.module import NonFiniteLossError
from tests.helpers import SimulatedCrash


def csv_rows(path):
    """metrics.csv rows without their empty cells (a later header may add columns)."""
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]


def weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def test_training_lowers_val_ppl_toward_the_entropy_bound(tiny_config, tmp_path):
    cfg = tiny_config("trainer.max_epochs=3", "optim=adam", "optim.lr=0.01", "loss_reduction=mean")
    metrics = train(cfg)
    from hydra.utils import instantiate

    dm = instantiate(cfg.data)
    dm.setup()
    best_possible = math.exp(dm.entropy_rate)
    uniform = dm.num_classes
    # the model must close most of the gap between a uniform guess and the true source's perplexity
    assert metrics["val/ppl_best"] < best_possible + 0.5 * (uniform - best_possible)
    assert metrics["val/ppl_best"] > best_possible * 0.97  # nobody beats the true entropy rate
    assert math.isfinite(metrics["test/ppl"])
    run = tmp_path / "run"
    for name in ("metrics.csv", "config.yaml", "run.json", "checkpoints/last.ckpt"):
        assert (run / name).is_file(), name
    info = json.loads((run / "run.json").read_text())
    assert info["best_possible_ppl"] == pytest.approx(best_possible)
    assert info["metrics"] == metrics and info["wall_time_s"] > 0  # written at the start, the results at the end
    assert list((run / "checkpoints").glob("best-*.ckpt"))
    # step metrics are written every log_every_n_steps (20) steps; throughput is the mean over each interval
    rows = csv_rows(run / "metrics.csv")
    speed_steps = [int(r["step"]) for r in rows if "tokens_per_sec" in r]
    assert speed_steps and all((step + 1) % 20 == 0 for step in speed_steps)
    assert all(float(r["tokens_per_sec"]) > 0 for r in rows if "tokens_per_sec" in r)
    assert {int(r["step"]) for r in rows if "lr" in r} >= set(speed_steps)
    # the loss at every step, one row per step (with the step's other metrics), epochs counted from 0 everywhere
    loss_steps = [int(r["step"]) for r in rows if "train/loss" in r]
    assert loss_steps == list(range(3 * 188))
    assert {int(r["epoch"]) for r in rows if "train/loss" in r} == {0, 1, 2}
    [test_row] = [r for r in rows if "test/ppl" in r]
    assert (test_row["epoch"], test_row["step"]) == ("2", str(3 * 188 - 1))  # the last training step's row


def test_short_run_validates_at_its_end_and_writes_the_loss_every_step(tiny_config, tmp_path, recwarn, caplog):
    """trainer.max_steps inside the first epoch: still a val/ppl, a best checkpoint and a test row labelled with
    the epoch the run stopped in; throughput also when validation runs every log_every_n_steps steps."""
    caplog.set_level(logging.INFO)
    cfg = tiny_config("trainer.max_steps=40", "trainer.val_check_interval=10", "trainer.log_every_n_steps=10")
    metrics = train(cfg)
    run = tmp_path / "run"
    assert "val/ppl_best" in metrics and math.isfinite(metrics["test/ppl"])
    assert [p.name for p in (run / "checkpoints").glob("best-*.ckpt")] == ["best-00.ckpt"]
    rows = csv_rows(run / "metrics.csv")
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "train/loss" in header and not any(k.startswith("train/loss_") for k in header)
    assert [int(r["step"]) for r in rows if "train/loss" in r] == list(range(40))
    assert [int(r["step"]) for r in rows if "val/ppl" in r] == [9, 19, 29, 39]
    assert len([r for r in rows if "tokens_per_sec" in r]) == 3  # every write after the first interval
    [test_row] = [r for r in rows if "test/ppl" in r]
    assert (test_row["epoch"], test_row["step"]) == ("0", "39")
    assert "epoch 0 | 40 steps | val/ppl" in caplog.text
    # the line's last window's rate and the run's mean: 40 steps x 16 x 20 tokens over the training seconds so far
    [line] = [r.getMessage() for r in caplog.records if "| 40 steps |" in r.getMessage()]
    mean = float(re.search(r"\| mean tokens_per_sec ([\d,]+)$", line).group(1).replace(",", ""))
    seconds = float([r for r in rows if "val/ppl" in r][-1]["train/seconds"])
    assert mean == pytest.approx(40 * 16 * 20 / seconds, rel=0.02) and "| tokens_per_sec " in line
    noise = ("monitored key", "LeafSpec", "not resumable")
    assert not [str(w.message) for w in recwarn if any(n in str(w.message) for n in noise)]
    assert "litlogger" not in caplog.text


@pytest.mark.parametrize("crash_after", [13, 45])  # 31 windows per epoch: in epoch 1, and in epoch 2
def test_resume_mid_epoch_matches_uninterrupted_run(tiny_config, tmp_path, crash_after):
    """Crash mid-epoch (after a periodic checkpoint), resume with ckpt_path=last, compare with one straight run."""
    common = [
        "trainer.max_epochs=2",
        "model.dropout=0.3",
        "checkpoint_every_n_steps=4",
        "test_after_fit=false",
        "data.train_tokens=10000",
        "trainer.log_every_n_steps=2",
    ]
    straight = tmp_path / "straight"
    expected = train(tiny_config(*common, run_dir=straight))

    split = tmp_path / "split"
    with pytest.raises(SimulatedCrash):
        train(
            tiny_config(
                *common,
                "+callbacks.crash._target_=tests.helpers.CrashAtStep",
                f"+callbacks.crash.step={crash_after}",
                run_dir=split,
            )
        )
    rows_before = csv_rows(split / "metrics.csv")
    resumed = train(tiny_config(*common, "ckpt_path=last", run_dir=split))

    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)
    assert resumed["val/ppl"] == pytest.approx(expected["val/ppl"], rel=1e-6)
    rows_after = csv_rows(split / "metrics.csv")
    assert rows_before and rows_after[: len(rows_before)] == rows_before  # resumed run appended; nothing lost


def test_last_checkpoint_by_time_before_the_first_periodic_step(tiny_config, tmp_path):
    """A crash before checkpoint_every_n_steps is reached still leaves a last.ckpt when the minutes have passed,
    and none without the time limit (the step checkpoint alone would lose the run)."""
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=6"]
    common = ["trainer.max_steps=50", "checkpoint_every_n_steps=1000", "test_after_fit=false", *crash]
    for minutes, run in ((1e-6, tmp_path / "by_time"), (60, tmp_path / "by_steps")):
        with pytest.raises(SimulatedCrash):
            train(tiny_config(*common, f"checkpoint_every_minutes={minutes}", run_dir=run))
    last = torch.load(tmp_path / "by_time" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 5  # every step from the second on; Lightning runs checkpoints after the crash
    assert not (tmp_path / "by_steps" / "checkpoints" / "last.ckpt").exists()


def test_resumed_run_shows_its_epoch_in_the_progress_bar_and_is_resumable(tiny_config, tmp_path, recwarn):
    common = ["trainer.max_epochs=1", "checkpoint_every_n_steps=4", "test_after_fit=false", "data.train_tokens=10000"]
    with pytest.raises(SimulatedCrash):
        train(tiny_config(*common, "+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=13"))
    bar = tmp_path / "bar.json"
    record = ["+callbacks.bar._target_=tests.helpers.RecordProgressBar", f"+callbacks.bar.path={bar}"]
    train(tiny_config(*common, "ckpt_path=last", "progress_bar=true", *record))
    assert json.loads(bar.read_text()) == {"desc": "Epoch 0: ", "total": 32, "n": 13}  # resumed after 12 of 32
    assert not [w for w in recwarn if "not resumable" in str(w.message)]


def test_existing_run_folder_is_not_overwritten(tiny_config, tmp_path):
    cfg = tiny_config("trainer.max_steps=3", "test_after_fit=false")
    train(cfg)
    before = (tmp_path / "run" / "checkpoints" / "last.ckpt").read_bytes()
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train(cfg)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").read_bytes() == before


def test_bad_checkpoints_give_clear_errors(tiny_config, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_config(f"ckpt_path={tmp_path / 'nowhere.ckpt'}", run_dir=tmp_path / "a"))
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a readable"):
        train(tiny_config(f"ckpt_path={corrupt}", run_dir=tmp_path / "b"))
    train(tiny_config("trainer.max_steps=2", "test_after_fit=false", run_dir=tmp_path / "c"))
    with pytest.raises(CheckpointError, match="does not match"):
        train(
            tiny_config(
                "model.hidden_dim=48",
                f"ckpt_path={tmp_path / 'c/checkpoints/last.ckpt'}",
                run_dir=tmp_path / "d",
            )
        )


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tiny_config, tmp_path):
    run = tmp_path / "run"
    poison = ["+callbacks.poison._target_=tests.helpers.PoisonAtStep", "+callbacks.poison.step=5"]
    with pytest.raises(NonFiniteLossError, match=r"global step 5"):
        train(tiny_config("trainer.max_steps=50", "test_after_fit=false", "checkpoint_every_n_steps=2", *poison))
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4  # the last checkpoint before the weights went bad
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


def test_nan_before_the_first_checkpoint_says_so(tiny_config, tmp_path, capsys):
    poison = ["+callbacks.poison._target_=tests.helpers.PoisonAtStep", "+callbacks.poison.step=2"]
    with pytest.raises(SystemExit) as stop:
        run_guarded(train, tiny_config("trainer.max_steps=50", "test_after_fit=false", *poison))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "global step 2" in err and err.endswith("no checkpoint had been written yet")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_non_finite_weights_are_never_checkpointed(tiny_config, tmp_path):
    poison = ["+callbacks.poison._target_=tests.helpers.PoisonAtStep", "+callbacks.poison.step=4"]
    with pytest.raises(NonFiniteLossError, match="not finite"):
        train(tiny_config("trainer.max_steps=50", "test_after_fit=false", "checkpoint_every_n_steps=2", *poison))
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
