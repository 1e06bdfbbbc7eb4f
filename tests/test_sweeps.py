"""Sweeps, their summaries and W&B runs; the presets and the sweep launchers."""

from __future__ import annotations

from typing import Any

import matplotlib.image
import pytest
from hydra import compose, initialize_config_dir

from lmtrain.cli.failures import SweepStopped, run_guarded
from lmtrain.config import CONF_DIR
from lmtrain.run.run import train
from lmtrain.tools.run_records import read_metrics
from tests.cli_runs import (
    TINY,
    run_cli,
    run_info,
    the,
    wandb_config,
    wandb_history,
    wandb_records,
)


@pytest.mark.slow  # a joblib multirun with W&B offline runs, ~12 s
def test_multirun_gives_one_wandb_run_per_job_and_a_summary(tmp_path):
    sweep = tmp_path / "multirun" / "sweep"
    result = run_cli(
        [
            "-m",
            *TINY,
            "logger=wandb",
            "output=uniform",
            "output.num_samples=4,16,100",  # the last job fails when it sees the data (100 classes, m distinct)
            "output.unique=true",
            "output.shared_negatives=true",  # distinct draws are shared by the batch
            "optim=adam",
            "optim.lr=0.01",
            "loss_reduction=mean",
            "trainer.max_epochs=2",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=${hydra.job.num}",
        ],
        tmp_path,
        check=False,
        WANDB_MODE="offline",
        WANDB_SILENT=None,  # lmtrain's own W&B console settings
    )
    assert result.returncode == 2  # a failing job stops the sweep, with one line naming it
    [stop] = [line for line in result.stderr.splitlines() if "so the sweep stops" in line]
    assert "job 2" in stop and "output.unique=true needs num_samples < num_classes (100)" in stop
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name != "2")
    assert [p.name for p in jobs] == ["0", "1"]
    for noise in ("anonymous setting", "wandb: ", "litlogger", "LeafSpec"):  # W&B and Lightning stay quiet
        assert noise not in result.stdout + result.stderr, noise
    run_ids = set()
    for job, m in zip(jobs, (4, 16), strict=True):
        info = run_info(job)
        assert info["output"] == "uniform" and info["output_options"]["num_samples"] == m
        csv_val = [v for _, _, v in read_metrics(job / "metrics.csv")["val/ppl"]]
        assert len(csv_val) == 2 and csv_val[-1] == pytest.approx(info["metrics"]["val/ppl"], rel=1e-6)
        [folder] = (job / "wandb").glob("offline-run-*")
        records = wandb_records(folder)
        run = the(records, "run")
        assert run.run_group == "multirun/sweep" and run.job_type == "uniform"  # grouped by sweep
        assert "output.num_samples=" + str(m) in run.display_name  # named by its overrides
        config = wandb_config(records)  # the resolved config
        assert config["output"]["num_samples"] == m and config["data"]["train_tokens"] == 10000
        assert config["run_dir"] == str(job)  # resolved
        assert wandb_history(records, "val/ppl") == pytest.approx(csv_val, rel=1e-6)  # the metrics are in it
        assert the(records, "exit").exit_code == 0  # finished at the job's end
        run_ids.add(run.run_id)
        assert f"wandb sync {folder}" in result.stdout
    assert len(run_ids) == 2  # every job is its own run

    from lmtrain.tools import summarize

    out = tmp_path / "report"
    assert summarize.main([str(sweep), "--out", str(out)]) == 0
    table = (out / "summary.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "uniform" in line and "failed" not in line]
    for row, job in zip(rows, jobs, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        info = run_info(job)
        assert cells[0] == job.name and cells[1] == "uniform" and cells[2] == "UniformSampler"
        assert int(cells[4]) == info["output_options"]["num_samples"]
        assert float(cells[5]) == pytest.approx(info["metrics"]["val/ppl_best"], abs=0.006)
        assert float(cells[6]) == pytest.approx(info["metrics"]["test/ppl"], abs=0.006)
        assert float(cells[7].replace(",", "")) > 0 and cells[8] != "-"
    for png in ("ppl_vs_samples.png", "val_curves.png"):
        image = matplotlib.image.imread(out / png)
        assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0  # a drawn figure, not blank
    assert summarize.main([str(sweep), "--out", str(out / "m16"), "--num-samples", "16"]) == 0
    kept = [line for line in (out / "m16" / "summary.md").read_text().splitlines() if "| uniform |" in line]
    assert len(kept) == 1 and kept[0].startswith("| 1 |")
    assert summarize.main([str(sweep), "--out", str(out / "none"), "--outputs", "full"]) == 0
    assert "0 of 0 jobs finished" in (out / "none" / "summary.md").read_text()


@pytest.mark.parametrize("failure", ["known", "unexpected"])
def test_a_failing_sweep_job_is_marked_failed_in_wandb(tiny_config, tmp_path, monkeypatch, failure):
    """In a multirun a NaN loss ends only its job and an unexpected exception stops the sweep; both mark the job's
    W&B run failed."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr("lmtrain.cli.failures.in_multirun", lambda: True)
    breaks = {
        "known": ["+callbacks.nan._target_=tests.helpers.PoisonAtStep", "+callbacks.nan.step=2"],  # a NaN loss
        "unexpected": ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=2"],
    }[failure]
    cfg = tiny_config("logger=wandb", "trainer.max_steps=30", "data.train_tokens=10000", *breaks)
    if failure == "known":
        assert run_guarded(train, cfg) is None  # no exception, no exit: the sweep goes on
    else:
        with pytest.raises(SweepStopped):
            run_guarded(train, cfg)
    [folder] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert the(wandb_records(folder), "exit").exit_code == 1


def compose_train(*overrides: str, hydra: bool = False) -> Any:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra)


def test_blanc_rendle_preset_is_the_medium_lstm_with_200_units_and_swaps_outputs():
    cfg = compose_train("experiment=blanc_rendle_ptb")
    assert (cfg.model.hidden_dim, cfg.model.num_layers, cfg.model.dropout) == (200, 2, 0.5)
    assert (cfg.data.name, cfg.data.bptt, cfg.trainer.max_epochs, cfg.loss_reduction) == ("ptb", 35, 39, "sum")
    assert cfg.output._target_.endswith("AbsoluteSampledSoftmax") and cfg.sampler._target_.endswith("QuadraticSampler")
    for output, sampler in (("uniform", "UniformSampler"), ("unigram", "UnigramSampler"), ("exp", "SoftmaxSampler")):
        swapped = compose_train("experiment=blanc_rendle_ptb", f"output={output}", "output.num_samples=20")
        assert swapped.sampler._target_.endswith(sampler) and swapped.output.num_samples == 20
        assert swapped.model.hidden_dim == 200


def test_rf_softmax_preset_has_the_papers_settings():
    cfg = compose_train("experiment=rf_softmax_ptb")
    assert cfg.output._target_.endswith("CosineSampledSoftmax") and cfg.sampler._target_.endswith("RFFSampler")
    assert cfg.output.tau == pytest.approx(1 / 0.3**2) and cfg.output.num_samples == 100
    assert cfg.sampler.D == 1024 and (cfg.sampler.nu == pytest.approx(1 / 0.5**2) or cfg.sampler.temperature == 0.5)
    assert cfg.trainer.max_epochs == 10 and cfg.data.name == "ptb"
    assert compose_train("experiment=rf_softmax_ptb", "output=full").get("sampler") is None


@pytest.mark.parametrize(
    ("launcher", "target"),
    [("joblib", "JoblibLauncher"), ("submitit_slurm", "SlurmLauncher"), ("submitit_local", "LocalLauncher")],
)
def test_sweep_launchers_compose(launcher, target):
    cfg = compose_train(f"hydra/launcher={launcher}", "data=synthetic", hydra=True)
    assert cfg.hydra.launcher._target_.endswith(target)
