"""AWD-LSTM's training recipe: variable BPTT windows with the learning rate scaled by their length, NT-ASGD's weight
averaging (validation and checkpoints use the average), the finetune stage (init_from, averaging from step 1), and
exact resume of all three."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from lmtrain.data.batching import batchify
from lmtrain.data.datamodule import SyntheticDataModule
from lmtrain.data.options import BatchOptions
from lmtrain.data.window_lengths import window_lengths
from lmtrain.run.build import build_model
from lmtrain.run.run import train
from lmtrain.run_folder.ckpt_path import CheckpointError
from lmtrain.training.averaging import WeightAverage
from lmtrain.training.step import evaluate
from tests.helpers import SimulatedCrash

SHORT = ["data.train_tokens=10000", "data.valid_tokens=2000", "data.test_tokens=2000", "test_after_fit=false"]


class RecordSteps(L.Callback):
    """Writes to ``path`` (JSON) each step's window length and the lr the optimizer stepped with and had after."""

    def __init__(self, path: str) -> None:
        self.path, self.rows = Path(path), []

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        self.rows.append({"length": int(batch[0].shape[1])})

    def on_before_optimizer_step(self, trainer: L.Trainer, module: Any, optimizer: Any) -> None:
        self.rows[-1]["lr_in_step"] = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.rows[-1]["lr_after"] = trainer.optimizers[0].param_groups[0]["lr"]
        self.path.write_text(json.dumps(self.rows))


class RecordWeights(L.Callback):
    """Keeps the parameters at the start of training and after every optimizer step (``RecordWeights.last``)."""

    last: RecordWeights | None = None

    def __init__(self) -> None:
        self.start: list[torch.Tensor] = []
        self.steps: list[list[torch.Tensor]] = []
        RecordWeights.last = self

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start = [p.detach().clone() for p in module.parameters()]

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        self.steps.append([p.detach().clone() for p in module.parameters()])


def ckpt(run: Path, name: str = "last.ckpt") -> dict[str, Any]:
    path = run / "checkpoints" / name if name != "best" else next((run / "checkpoints").glob("best-*.ckpt"))
    return torch.load(path, map_location="cpu", weights_only=True)


def named_params(run_cfg: Any) -> list[str]:
    _, module = build_model(run_cfg)
    return [name for name, _ in module.named_parameters()]


# --- variable BPTT ---------------------------------------------------------------------------------------------------
def test_window_lengths_follow_awd_lstm_distribution():
    options = BatchOptions(bptt=35, variable_bptt=True)
    lengths = window_lengths(200_000, options, epoch=0)
    body = np.array(lengths[:-1])  # the last window is cut to what is left
    assert sum(lengths) == 200_000 and body.min() >= 5
    # E[int(N(35, 5))] ~ 34.5 with p 0.95, E[int(N(17.5, 5))] ~ 17.0 with p 0.05: 33.6
    assert abs(body.mean() - 33.6) < 0.4
    # P(length <= 22) = 0.05 * P(N(17.5, 5) < 23) + 0.95 * P(N(35, 5) < 23) = 0.051; without halves 0.008
    assert 0.035 < (body <= 22).mean() < 0.07
    no_halves = np.array(window_lengths(200_000, BatchOptions(bptt=35, variable_bptt=True, bptt_half_prob=0), 0))
    assert (no_halves[:-1] <= 22).mean() < 0.02
    wide = window_lengths(200_000, BatchOptions(bptt=35, variable_bptt=True, bptt_std=30.0), 0)
    assert min(wide[:-1]) == 5  # the floor bptt_min holds
    assert window_lengths(200_000, options, 0) == lengths != window_lengths(200_000, options, 1)  # seed and epoch
    assert window_lengths(200_000, BatchOptions(bptt=35, variable_bptt=True, bptt_seed=1), 0) != lengths
    assert window_lengths(100, BatchOptions(bptt=35), 0) == [35, 35, 30]  # fixed windows unless variable_bptt


def test_an_epoch_of_variable_windows_reads_every_token_once():
    data = SyntheticDataModule(train_tokens=5000, batch_size=4, bptt=20, variable_bptt=True)
    data.setup()
    layout = batchify(data.train_ids, 4)  # (B, L)
    seen = []
    for epoch in (0, 1):
        data.set_train_epoch(epoch)
        loader = data.train_dataloader()
        batches = list(loader)
        assert len(batches) == len(loader) == data.num_train_windows
        inputs = torch.cat([x for x, _ in batches], dim=1)
        targets = torch.cat([y for _, y in batches], dim=1)
        assert torch.equal(inputs, layout[:, :-1]) and torch.equal(targets, layout[:, 1:])  # once, in order
        seen.append([x.shape[1] for x, _ in batches])
        assert len(set(seen[-1])) > 3  # the lengths vary
    assert seen[0] != seen[1]  # and every epoch has its own


def test_each_step_scales_the_lr_by_its_window_length(tiny_config, tmp_path):
    record = tmp_path / "steps.json"
    callback = ["+callbacks.rec._target_=tests.test_awd_training.RecordSteps", f"+callbacks.rec.path={record}"]
    cfg = tiny_config(*SHORT, "data.variable_bptt=true", "optim.lr=0.5", "trainer.max_steps=25", *callback)
    train(cfg)
    rows = json.loads(record.read_text())
    assert len(rows) == 25 and len({row["length"] for row in rows}) > 3
    for row in rows:
        assert row["lr_in_step"] == pytest.approx(0.5 * row["length"] / 20, rel=1e-12)
        assert row["lr_after"] == 0.5  # restored: the schedule never sees the scaling


# --- NT-ASGD ---------------------------------------------------------------------------------------------------------
def test_nonmono_averages_only_after_nonmono_validations_without_a_new_best():
    module = nn.Linear(3, 2)
    average = WeightAverage("nonmono", 3)
    for loss in (5.0, 4.0, 4.5, 4.2, 3.9, 4.0, 4.1):  # 3.9 is a new best: the count starts again
        average.observe(loss)
        average.update(module)
        assert not average.active and average.averaged is None
    average.observe(3.95)  # the third validation in a row without beating 3.9
    assert average.active
    seen = []
    for value in (1.0, 2.0, 6.0):
        with torch.no_grad():
            for p in module.parameters():
                p.fill_(value)
        average.update(module)
        seen.append(value)
        assert all(torch.allclose(mean, torch.full_like(mean, np.mean(seen))) for mean in average.averaged)
    never = WeightAverage("none", 1)
    [never.observe(loss) for loss in (1.0, 2.0, 3.0)]
    assert not never.active and WeightAverage("always", 5).active


def test_a_checkpoint_keeps_the_averaging_state_and_both_weights():
    torch.manual_seed(0)
    module, average = nn.Linear(3, 2), WeightAverage("nonmono", 1)
    average.observe(2.0)
    average.observe(3.0)  # switches
    for _ in range(3):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p))
        average.update(module)
    average.swap_in(module)  # a checkpoint written during validation keeps the training weights too
    trained = [t.clone() for t in average._trained]
    checkpoint = {"state_dict": module.state_dict(), "lmtrain": {}}
    average.save(checkpoint, module)
    average.swap_out(module)
    for (key, value), mean, weights in zip(checkpoint["state_dict"].items(), average.averaged, trained, strict=True):
        assert torch.equal(value, mean) and torch.equal(checkpoint["lmtrain"]["average"]["train_weights"][key], weights)

    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    other, restored = nn.Linear(3, 2), WeightAverage("nonmono", 1)
    restored.restore(saved, other)
    other.load_state_dict(saved["state_dict"])
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), module.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(restored.averaged, average.averaged, strict=True))
    assert (restored.active, restored.count, restored.best, restored.since_best) == (True, 3, 2.0, 1)
    average.update(module)
    restored.update(other)  # the next step adds to the mean identically
    assert all(torch.equal(a, b) for a, b in zip(restored.averaged, average.averaged, strict=True))


def test_validation_and_the_saved_model_use_the_averaged_weights(tiny_config, tmp_path):
    cfg = tiny_config(
        *SHORT,
        "optim.average=always",
        "trainer.max_steps=12",
        "+callbacks.w._target_=tests.test_awd_training.RecordWeights",
    )
    metrics = train(cfg)
    steps = RecordWeights.last.steps
    assert len(steps) == 12
    best = ckpt(tmp_path / "run", "best")
    names = named_params(cfg)
    for i, name in enumerate(names):
        mean = torch.stack([step[i] for step in steps]).mean(0)
        torch.testing.assert_close(best["state_dict"][name], mean, rtol=1e-5, atol=1e-6, msg=name)
        assert torch.equal(best["lmtrain"]["average"]["train_weights"][name], steps[-1][i])
    data, module = build_model(cfg)
    module.load_state_dict(best["state_dict"])
    averaged = evaluate(module.encoder, module.output, data.val_dataloader()).ppl
    assert averaged == pytest.approx(metrics["val/ppl"], rel=1e-5)
    module.load_state_dict({**best["state_dict"], **best["lmtrain"]["average"]["train_weights"]})
    assert evaluate(module.encoder, module.output, data.val_dataloader()).ppl != pytest.approx(averaged, rel=1e-4)


# --- finetune and exact resume ---------------------------------------------------------------------------------------
def test_finetune_starts_from_the_given_weights_and_averages_from_step_one(tiny_config, tmp_path):
    first = tmp_path / "first"
    train(tiny_config(*SHORT, "trainer.max_steps=6", run_dir=first))
    start = ckpt(first)["state_dict"]
    record = "+callbacks.w._target_=tests.test_awd_training.RecordWeights"
    cfg = tiny_config(*SHORT, f"init_from={first / 'checkpoints' / 'last.ckpt'}", "optim.average=always",
                      "trainer.max_steps=5", record, run_dir=tmp_path / "tune")  # fmt: skip
    train(cfg)
    names, recorded = named_params(cfg), RecordWeights.last
    assert all(torch.equal(recorded.start[i], start[name]) for i, name in enumerate(names))
    last = ckpt(tmp_path / "tune")
    assert last["lmtrain"]["average"]["count"] == 5
    for i, name in enumerate(names):
        mean = torch.stack([step[i] for step in recorded.steps]).mean(0)
        torch.testing.assert_close(last["state_dict"][name], mean, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(CheckpointError, match="^init_from .* does not exist"):
        train(tiny_config(*SHORT, f"init_from={tmp_path / 'nowhere.ckpt'}", run_dir=tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()  # nothing written
    with pytest.raises(CheckpointError, match="^init_from .* do not fit this model"):
        train(tiny_config(*SHORT, f"init_from={first / 'checkpoints' / 'last.ckpt'}", "model.hidden_dim=16"))


@pytest.mark.parametrize("stage", ["nonmono", "finetune"])
def test_a_resumed_run_is_bit_equal_to_an_uninterrupted_one(tiny_config, tmp_path, stage):
    common = [*SHORT, "data.variable_bptt=true", "model.dropout=0.3", "trainer.max_epochs=2",
              "checkpoint_every_n_steps=3", "trainer.val_check_interval=4", "loss_reduction=mean"]  # fmt: skip
    if stage == "nonmono":  # a large lr: validation stops improving early, and averaging starts
        common += ["optim.average=nonmono", "optim.nonmono=1", "optim.lr=20"]
    else:
        train(tiny_config(*SHORT, "trainer.max_steps=6", run_dir=tmp_path / "first"))
        common += [f"init_from={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}", "optim.average=always"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(tiny_config(*common, run_dir=straight))
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=44"]
    with pytest.raises(SimulatedCrash):
        train(tiny_config(*common, *crash, run_dir=split))
    crashed = ckpt(split)
    assert crashed["epoch"] == 1 and crashed["lmtrain"]["average"]["count"] > 0  # mid epoch 2, averaging
    train(tiny_config(*common, "ckpt_path=last", run_dir=split))
    a, b = ckpt(straight), ckpt(split)
    assert a["global_step"] == b["global_step"]
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    for key, value in a["lmtrain"]["average"]["train_weights"].items():
        assert torch.equal(value, b["lmtrain"]["average"]["train_weights"][key]), key
