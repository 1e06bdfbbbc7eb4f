"""Multi-process (DDP) training matches one process, and resumes exactly."""

from __future__ import annotations

import subprocess

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lmtrain.run.build import Runtime, build, build_output
from lmtrain.run.lightning_data import LightningData
from lmtrain.run_folder.checkpoints import read_checkpoint
from lmtrain.training.module import LanguageModel
from tests.cli_runs import (
    DDP,
    TINY,
    cli_env,
    lmtrain,
    run_cli,
    run_info,
)
from tests.conftest import make_config


@pytest.mark.slow
def test_ddp_on_two_processes_matches_one_process_with_the_same_global_batch(tmp_path):
    """Negatives shared by the batch (uniform, set explicitly: per-position negatives, the default, are drawn from
    each rank's rows and so differ from one process's draws) and no dropout: both runs make the same draws, and
    the exact ppl must agree up to the order of the floating-point sums."""
    common = [*TINY, "logger=csv", "output=uniform", "output.num_samples=8", "output.shared_negatives=true",
              "optim=sgd", "optim.lr=0.5", "loss_reduction=mean", "trainer.max_epochs=1"]  # fmt: skip
    single = subprocess.Popen(lmtrain(*common, f"hydra.run.dir={tmp_path / 'single'}"), cwd=tmp_path,
                              env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    run_cli([*common, *DDP, f"hydra.run.dir={tmp_path / 'ddp'}"], tmp_path)
    assert single.wait(timeout=400) == 0
    one, two = run_info(tmp_path / "single")["metrics"], run_info(tmp_path / "ddp")["metrics"]
    # measured: equal to the last bit (rel. difference 0) on this machine; the tolerance allows float32 sums in
    # another order (~1e-7 relative each) and stays well below the 1.7e-5 that different draws (per-position
    # negatives, drawn per rank) make
    for key in ("val/ppl", "test/ppl"):
        assert two[key] == pytest.approx(one[key], rel=2e-6), key
    assert one["val/ppl"] < 100  # it learned (vocabulary 100: a uniform guess has perplexity 100)


@pytest.mark.slow
def test_ddp_kernel_trees_stay_identical_on_every_rank(tmp_path):
    overrides = [*TINY, "logger=csv", "output=rff", "sampler.D=8", "output.num_samples=8", "optim=sgd", "optim.lr=0.5",
                 "loss_reduction=mean", "trainer.max_epochs=1", "test_after_fit=false"]  # fmt: skip
    trees = tmp_path / "trees"
    run_cli(
        [
            *overrides,
            *DDP,
            "+callbacks.trees._target_=tests.helpers.SaveTreeSums",
            f"+callbacks.trees.folder={trees}",
            f"hydra.run.dir={tmp_path / 'ddp'}",
        ],
        tmp_path,
    )
    rank0, rank1 = (torch.load(trees / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["trees"] and len(rank0["trees"]) == len(rank1["trees"])
    for a, b in zip(rank0["trees"], rank1["trees"], strict=True):
        assert a.abs().sum() > 0 and torch.equal(a, b)  # bitwise: same weights, same reduced sparse gradients
    for name, weight in rank0["weights"].items():
        assert torch.equal(weight, rank1["weights"][name]), name

    # the val ppl the two ranks reported together = one process evaluating the final weights alone
    cfg = make_config([*overrides, f"run_dir={tmp_path / 'eval'}"])
    data = instantiate(cfg.data)
    data.setup()
    encoder = build(cfg.model, Runtime(data.num_classes))
    output = build_output(cfg, data.num_classes, encoder.output_dim, data.counts)
    module = LanguageModel(encoder, output, OmegaConf.to_container(cfg.optim, resolve=True), cfg.loss_reduction)
    module.load_state_dict(torch.load(tmp_path / "ddp" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    [alone] = trainer.validate(module, datamodule=LightningData(data), verbose=False)
    assert run_info(tmp_path / "ddp")["metrics"]["val/ppl"] == pytest.approx(alone["val/ppl"], rel=1e-5)


@pytest.mark.slow
def test_ddp_resume_mid_epoch_matches_the_uninterrupted_ddp_run(tmp_path):
    """Each rank carries the LSTM state of its own rows: the checkpoint keeps all of them, each rank gets its own."""
    common = [*TINY, *DDP, "logger=csv", "output=uniform", "output.num_samples=8", "model.dropout=0.3", "optim=sgd",
              "optim.lr=0.5", "loss_reduction=mean", "trainer.max_epochs=2", "test_after_fit=false",
              "checkpoint_every_n_steps=4"]  # fmt: skip
    run_cli([*common, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=45"]  # mid epoch 2
    crashed = run_cli([*common, *crash, f"hydra.run.dir={tmp_path / 'split'}"], tmp_path, check=False)
    assert crashed.returncode != 0 and "simulated crash after step 45" in crashed.stderr
    state = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.ckpt")["lmtrain"]["state"]
    assert state[0].shape[1] == 16  # the rows of both ranks (data.batch_size)
    run_cli([*common, "ckpt_path=last", f"hydra.run.dir={tmp_path / 'split'}"], tmp_path)
    expected, resumed = run_info(tmp_path / "straight")["metrics"], run_info(tmp_path / "split")["metrics"]
    assert abs(resumed["val/ppl"] - expected["val/ppl"]) <= 1e-6 * expected["val/ppl"]

    # a SIGTERM to rank 0 only during step 41: both ranks stop after it, rank 0 writes last.ckpt, exit 143
    term = ["+callbacks.term._target_=tests.helpers.SignalAtStep", "+callbacks.term.step=40", "+callbacks.term.rank=0"]
    stopped = run_cli([*common, *term, f"hydra.run.dir={tmp_path / 'stopped'}"], tmp_path, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped by SIGTERM at step 41," in stopped.stdout + stopped.stderr
    saved = read_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == 41 and saved["lmtrain"]["state"][0].shape[1] == 16  # both ranks' rows
    run_cli([*common, "ckpt_path=last", f"hydra.run.dir={tmp_path / 'stopped'}"], tmp_path)
    resumed = run_info(tmp_path / "stopped")["metrics"]
    assert abs(resumed["val/ppl"] - expected["val/ppl"]) <= 1e-6 * expected["val/ppl"]
