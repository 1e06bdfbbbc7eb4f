"""The plain step (lmtrain.training.step) is the step a training run takes: the same losses step by step, and
``evaluate`` gives the run's exact validation perplexity."""

from __future__ import annotations

import csv

import lightning
import pytest
import torch

from lmtrain.process.prepare import prepare_process
from lmtrain.run.build import build_model
from lmtrain.run_folder.rng import seed_run, set_rng_states
from lmtrain.training.step import NonFiniteLossError, evaluate, train_step

STEPS = 4


def logged_losses(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


@pytest.mark.parametrize("output", ["full", "rff"])
def test_train_step_takes_the_steps_of_a_training_run(tiny_config, tmp_path, output, one_thread, monkeypatch):
    from lmtrain.run.run import train

    seeds = []
    seed_everything = lightning.seed_everything
    monkeypatch.setattr(lightning, "seed_everything", lambda *a, **k: seeds.append(a) or seed_everything(*a, **k))
    overrides = (f"output={output}", f"trainer.max_steps={STEPS}", "sampler.D=32" if output == "rff" else "seed=1234")
    metrics = train(tiny_config(*overrides, run_dir=tmp_path / "run"))
    assert len(seeds) == 1, f"a run seeds once, not {len(seeds)} times"
    monkeypatch.undo()

    cfg = tiny_config(*overrides, run_dir=tmp_path / "plain")
    prepare_process(cfg)  # as train does: threads, the seed before the model is built, its state again to train
    seeded = seed_run(cfg.seed)
    datamodule, module = build_model(cfg)
    set_rng_states(seeded)
    optimizer = module.configure_optimizers()["optimizer"]
    module.train()
    state, losses, batches = None, [], iter(datamodule.train_dataloader())
    for _ in range(STEPS):
        window = train_step(module.encoder, module.output, next(batches), state, optimizer, cfg.optim.clip)
        state, losses = window.state, [*losses, window.loss.item()]
    assert len(losses) == STEPS and losses == pytest.approx(logged_losses(tmp_path / "run"), rel=1e-5)
    module.eval()
    ppl = evaluate(module.encoder, module.output, datamodule.val_dataloader()).ppl
    assert ppl == pytest.approx(metrics["val/ppl"], rel=1e-4)


def test_a_non_finite_loss_is_read_after_backward_and_stops_before_the_weights_change(tiny_config, one_thread):
    """The loss is read once the backward pass is queued (``LossReading``), not at once: the check must still come
    before the optimizer step, or a NaN step would write NaN into every weight."""
    cfg = tiny_config("trainer.max_steps=1")
    datamodule, module = build_model(cfg)
    optimizer = module.configure_optimizers()["optimizer"]
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    loss = module.output.loss
    module.output.loss = lambda *args, **kwargs: loss(*args, **kwargs) * float("nan")
    batch = next(iter(datamodule.train_dataloader()))
    with pytest.raises(NonFiniteLossError, match="training loss became nan"):
        train_step(module.encoder, module.output, batch, None, optimizer, cfg.optim.clip)
    assert any(p.grad is not None and p.grad.isnan().any() for p in module.parameters())  # backward ran first
    for name, param in module.named_parameters():
        assert torch.equal(param.detach(), before[name]), name


def test_with_gradient_accumulation_every_window_is_read_and_recorded(tiny_config, tmp_path, one_thread):
    """Two windows per optimizer step: each window's loss is read and checked after its own backward pass
    (``on_after_backward`` runs for every window; a read in a per-step hook would drop every first window)."""
    from lmtrain.run.run import train

    train(tiny_config("trainer.max_steps=3", "trainer.accumulate_grad_batches=2", "test_after_fit=false"))
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        steps = [row["step"] for row in csv.DictReader(f) if row.get("train/loss")]
    assert steps == ["0", "0", "1", "1", "2", "2"]
