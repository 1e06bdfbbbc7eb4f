"""Mixed precision (trainer.precision=bf16-mixed): under autocast a sampler's log q, the kernel tree's node sums
and every exact evaluation stay float32 and equal their float32 values; every output= choice trains a few steps
with bf16-mixed and reports the float32 evaluation of its weights."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lmtrain.common import precision as precision_module
from lmtrain.common.precision import autocast_on, float32_region, in_float32
from lmtrain.config.validate import ConfigError, check_config
from lmtrain.data.datamodule import LMDataModule
from lmtrain.model.lstm import LSTMEncoder
from lmtrain.output.sampled.base import SampledOutput
from lmtrain.run.lightning_data import LightningData
from lmtrain.sampler.kernel.sampler import KernelSampler
from lmtrain.tools.trained import load_model
from tests.conftest import DEVICES, TINY, make_config
from tests.helpers import log_q_from, sample_from
from tests.test_output_contract import DIM, NUM_CLASSES, OUTPUTS, build

N = 48


def bf16(device: str) -> torch.autocast:
    return torch.autocast(device, dtype=torch.bfloat16)


def inputs(device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = 2 * torch.randn(N, DIM, generator=gen)  # logits of a few units: bfloat16 rounding shows
    ids = torch.randint(NUM_CLASSES, (2, N), generator=gen)
    return hidden.to(device), ids[0].to(device), ids[1].to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_the_float32_region_turns_autocast_off_and_back_on(device):
    a, b = torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)
    with bf16(device):
        assert (a @ b).dtype == torch.bfloat16 and autocast_on()
        with float32_region():
            assert (a @ b).dtype == torch.float32 and not autocast_on()
        assert (a @ b).dtype == torch.bfloat16
        assert in_float32(lambda x: x @ x)(a.bfloat16()).dtype == torch.float32  # low-precision inputs cast up
    assert not autocast_on()


def test_a_cpu_without_a_low_precision_lstm_runs_torchs_own_lstm(monkeypatch):
    """On a CPU whose oneDNN has no bfloat16 LSTM (AVX2 only) autocast's LSTM fails; the encoder then runs torch's own
    LSTM (oneDNN's would return bfloat16): float32 hidden states, equal to float32's to bfloat16 rounding, and
    gradients."""
    monkeypatch.setattr(precision_module, "cpu_rnn_takes", lambda dtype: False)
    torch.manual_seed(0)
    encoder = LSTMEncoder(50, emb_dim=8, hidden_dim=8, num_layers=2)
    tokens = torch.randint(50, (3, 5))
    plain, _ = encoder(tokens)
    with bf16("cpu"):
        mixed, _ = encoder(tokens)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, plain, rtol=0.05, atol=5e-3)  # bfloat16 products: about 1e-2 relative
    mixed.sum().backward()
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in encoder.parameters())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", OUTPUTS)
def test_exact_log_probs_stay_float32_under_autocast(output, device):
    layer = build(output, device=device).to(device)
    hidden, target, _ = inputs(device)
    with torch.no_grad():
        exact, every = layer.log_prob(hidden, target), layer.log_probs_all(hidden)
        with bf16(device):
            got, got_all = layer.log_prob(hidden, target), layer.log_probs_all(hidden)
            from_bf16 = layer.log_prob(hidden.bfloat16(), target)  # an encoder's bfloat16 output
    assert got.dtype == got_all.dtype == from_bf16.dtype == torch.float32
    torch.testing.assert_close(got, exact, rtol=1e-6, atol=1e-6)  # before: up to 0.06 nats apart (adaptive failed)
    torch.testing.assert_close(got_all, every, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(from_bf16, layer.log_prob(hidden.bfloat16().float(), target), rtol=1e-6, atol=1e-6)


SAMPLED = [o for o in OUTPUTS if isinstance(build(o), SampledOutput)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", SAMPLED)
def test_a_samplers_draws_and_log_q_stay_float32_under_autocast(output, device):
    layer = build(output, device=device).to(device)
    hidden, target, previous = inputs(device, 1)
    sampler, context = layer.sampler, layer.query(hidden).detach()
    torch.manual_seed(3)
    ids, log_q = sample_from(sampler, context, 6, inputs=previous)
    exact = log_q_from(sampler, context, ids, inputs=previous)
    with bf16(device):
        torch.manual_seed(3)
        got_ids, got_log_q = sample_from(sampler, context, 6, inputs=previous)
        again = log_q_from(sampler, context, ids, inputs=previous)
    assert got_log_q.dtype == again.dtype == torch.float32
    assert torch.equal(got_ids, ids)  # the same proposal, so the same draws
    torch.testing.assert_close(got_log_q, log_q, rtol=1e-6, atol=1e-6)  # before: rff 0.05, exp 0.02 nats apart
    torch.testing.assert_close(again, exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", [o for o in SAMPLED if isinstance(build(o).sampler, KernelSampler)])
def test_the_kernel_trees_node_sums_stay_float32_under_autocast(output, device):
    layer = build(output, device=device).to(device)
    sampler, weight = layer.sampler, layer.weight.detach().clone()
    sampler.update(weight)
    built = sampler.tree.nodes.clone()
    moved = weight.clone()
    moved[[1, 7, 30]] += 0.05  # a sparse step's changed rows
    rows = torch.tensor([1, 7, 30], device=device)
    sampler.update(moved, rows)
    updated = sampler.tree.nodes.clone()
    sampler.update(weight)
    with bf16(device):
        sampler.update(weight)  # a rebuild
        assert sampler.tree.nodes.dtype == torch.float32
        torch.testing.assert_close(sampler.tree.nodes, built, rtol=0, atol=0)  # before: rff 4e-3 of the largest sum
        sampler.update(moved, rows)  # an update of the changed buckets
        torch.testing.assert_close(sampler.tree.nodes, updated, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", OUTPUTS)
def test_the_training_loss_runs_under_autocast_and_stays_near_float32(output, device):
    layer = build(output, device=device).to(device)
    hidden, target, previous = inputs(device, 2)
    hidden.requires_grad_(True)
    torch.manual_seed(4)
    exact = layer.loss(hidden, target, inputs=previous)
    with bf16(device):
        torch.manual_seed(4)
        loss = layer.loss(hidden, target, inputs=previous)  # adaptive: failed before (a dtype clash in torch)
    loss.backward()
    assert loss.dtype == torch.float32 and hidden.grad is not None and torch.isfinite(hidden.grad).all()
    torch.testing.assert_close(loss, exact, rtol=2e-3, atol=2e-3)  # only the logits' products are bfloat16


@pytest.mark.parametrize("output", ["adaptive", "hsm"])
def test_adaptive_and_hsm_train_their_output_layer_in_float32(output):
    layer = build(output)
    hidden, target, _ = inputs("cpu", 5)
    exact = layer.loss(hidden, target)
    with bf16("cpu"):
        loss = layer.loss(hidden, target)
    torch.testing.assert_close(loss, exact, rtol=1e-6, atol=1e-6)  # not only near: the same float32 sums


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_precisions_with_16_bit_weights_are_refused_with_the_mixed_one_named(precision):
    with pytest.raises(ConfigError, match="use trainer.precision=bf16-mixed"):
        check_config(make_config([*TINY, f"trainer.precision={precision}", "run_dir=unused"]))
    check_config(make_config([*TINY, "trainer.precision=bf16-mixed", "run_dir=unused"]))


def validate(module: L.LightningModule, datamodule: LMDataModule, precision: str, device: str) -> float:
    trainer = L.Trainer(
        precision=precision, accelerator=device, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    return float(trainer.validate(module, datamodule=LightningData(datamodule), verbose=False)[0]["val/ppl"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", OUTPUTS)
def test_every_output_trains_with_bf16_mixed_and_validates_in_float32(output, device, tmp_path, one_thread):
    from lmtrain.run.run import train

    small = ["data.train_tokens=8000", "data.valid_tokens=1000", "model.emb_dim=16", "model.hidden_dim=16"]
    args = [*TINY, *small, f"output={output}", "trainer.precision=bf16-mixed", "trainer.max_steps=3"]
    args += [f"trainer.accelerator={'gpu' if device == 'cuda' else device}"]
    metrics = train(make_config([*args, "test_after_fit=false", f"run_dir={tmp_path}"]))
    datamodule, module = load_model(tmp_path / "checkpoints" / "last.ckpt", [])
    accelerator = "gpu" if device == "cuda" else device
    in_float32_trainer = validate(module, datamodule, "32-true", accelerator)
    assert metrics["val/ppl"] == pytest.approx(in_float32_trainer, rel=1e-5)  # the logged val ppl is float32's
    assert validate(module, datamodule, "bf16-mixed", accelerator) == pytest.approx(in_float32_trainer, rel=1e-6)
