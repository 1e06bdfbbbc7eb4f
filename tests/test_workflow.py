"""Experiment workflow: sweeps with summaries, W&B runs per job, kill-safe resume, atomic checkpoints, DDP, presets."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import matplotlib.image
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lmtrain.cli.failures import run_guarded
from lmtrain.cli.overrides import CONF_DIR
from lmtrain.tools.results import read_metrics
from lmtrain.training.build import build, build_output
from lmtrain.training.checkpoints import AtomicCheckpointIO, read_checkpoint
from lmtrain.training.module import LanguageModel
from lmtrain.training.run import train
from tests.conftest import make_config

ROOT = Path(__file__).resolve().parents[1]
# seconds-long jobs: 32 windows of 16 x 20 tokens per epoch, vocabulary 100
TINY = [
    "data=synthetic",
    "model.emb_dim=16",
    "model.hidden_dim=16",
    "model.num_layers=1",
    "data.train_tokens=10000",
    "data.valid_tokens=2000",
    "data.test_tokens=2000",
    "data.batch_size=16",
    "data.bptt=20",
    "trainer.accelerator=cpu",
    "progress_bar=false",
]
WINDOWS_PER_EPOCH = 32


def cli_env(tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """The environment of a command-line run: offline, one thread, this checkout; ``extra`` (None: unset)."""
    inherited = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # W&B started in this process
    env: dict[str, str | None] = {
        **inherited,
        "WANDB_MODE": "disabled",
        "WANDB_SILENT": "true",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",  # processes run side by side on few cores; also the same arithmetic in every run
        "LMTRAIN_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),  # tests.helpers callbacks
    }
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def lmtrain(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmtrain", *args]


def run_cli(args: list[str], tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        lmtrain(*args), cwd=tmp_path, env=cli_env(tmp_path, **env), capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def run_info(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def wandb_records(run_folder: Path, wait_for: str = "exit", timeout: float = 30.0) -> list[Any]:
    """The protobuf records of an offline W&B run (its run-ID.wandb file, LevelDB log format). W&B's service
    process writes the file after the run has finished in this process, so the read waits (up to ``timeout``
    seconds) until a ``wait_for`` record (the run's last) is there; the caller's assertions then see all of it."""
    deadline = time.monotonic() + timeout
    records = read_wandb_file(run_folder)
    while not any(r.WhichOneof("record_type") == wait_for for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = read_wandb_file(run_folder)
    return records


def read_wandb_file(run_folder: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_folder.glob("run-*.wandb")).read_bytes()
    block, pos, chunks, records = 32768, 7, b"", []  # a 7-byte file header, then 32 KiB blocks of chunks
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])  # crc32, length, full|first|middle|last
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_history(records: list[Any], key: str) -> list[float]:
    values = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item_key(item): item.value_json for item in record.history.item}
            if key in items:
                values.append(float(items[key]))
    return values


def wandb_config(records: list[Any]) -> dict[str, Any]:
    """The run's config: set at init (run record) and updated later (config records)."""
    config: dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        config.update({item_key(item): json.loads(item.value_json) for item in updates})
    return config


def the(records: list[Any], kind: str) -> Any:
    return next(getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind)


def load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- sweeps, summaries and W&B ---------------------------------------------------------------------------------
def test_multirun_gives_one_wandb_run_per_job_and_a_summary(tmp_path):
    sweep = tmp_path / "multirun" / "sweep"
    result = run_cli(
        [
            "-m",
            *TINY,
            "logger=wandb",
            "output=uniform",
            "output.num_samples=4,16,100",  # the last job fails when it sees the data: 100 classes, m distinct
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
        WANDB_MODE="offline",
        WANDB_SILENT=None,  # lmtrain's own W&B console settings
    )
    *jobs, failed = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"] and failed.name == "2"
    assert "output.unique=true needs num_samples < num_classes (100)" in (failed / "__main__.log").read_text()
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

    summarize = load_script("summarize")
    out = tmp_path / "report"
    assert summarize.main([str(sweep), "--out", str(out)]) == 0
    table = (out / "summary.md").read_text()
    *rows, failed_row = [line for line in table.splitlines() if line.startswith("| ") and "uniform" in line]
    assert failed_row.startswith("| 2 (failed or unfinished) | uniform | UniformSampler | - | 100 | - | - |")
    assert "2 of 3 jobs finished" in table
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
def test_a_failing_sweep_job_is_marked_failed_in_wandb_and_returns(tiny_config, tmp_path, monkeypatch, failure):
    """In a multirun any failure (a known one or an unexpected exception) ends only its job, marked failed."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr("lmtrain.cli.failures.in_multirun", lambda: True)
    breaks = {
        "known": ["+callbacks.nan._target_=tests.helpers.PoisonAtStep", "+callbacks.nan.step=2"],  # a NaN loss
        "unexpected": ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=2"],
    }[failure]
    cfg = tiny_config("logger=wandb", "trainer.max_steps=30", "data.train_tokens=10000", *breaks)
    assert run_guarded(train, cfg) is None  # no exception, no exit: the sweep goes on
    [folder] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert the(wandb_records(folder), "exit").exit_code == 1


# --- exact resume after SIGKILL, atomic checkpoints -----------------------------------------------------------
def last_step(ckpt: Path) -> int:
    try:
        return int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])
    except Exception:  # not written yet
        return -1


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

    run_cli([*common, "logger=wandb", "ckpt_path=last", f"hydra.run.dir={split}"], tmp_path, WANDB_MODE="offline")
    assert reference.wait(timeout=400) == 0
    expected, resumed = run_info(straight)["metrics"], run_info(split)["metrics"]
    assert math.isfinite(expected["val/ppl"])
    assert abs(resumed["val/ppl"] - expected["val/ppl"]) <= 1e-6 * expected["val/ppl"]
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(split / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-7, msg=key)
    killed, continued = sorted((split / "wandb").glob("offline-run-*"))  # offline-run-TIME-ID
    assert the(wandb_records(continued), "run").run_id == killed.name.rsplit("-", 1)[1]  # the same W&B run


KILLED_WRITER = """
import io, sys, time
import torch
from lmtrain.training.checkpoints import AtomicCheckpointIO

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
        torch.load(partial, weights_only=False)
    checkpoint = read_checkpoint(path)  # ... and the previous checkpoint is whole
    assert checkpoint["lmtrain"]["version"] == 1 and torch.equal(checkpoint["state_dict"]["w"], torch.ones(4))
    live = path.with_name(f".last.ckpt.tmp-{os.getppid()}")  # a live writer's (our parent's) file is left alone
    live.write_bytes(b"partial")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "lmtrain": {"version": 3}}, path)
    assert not partial.exists() and live.exists()  # the next save cleans up after the killed writer
    assert read_checkpoint(path)["lmtrain"]["version"] == 3


# --- multi-process training -----------------------------------------------------------------------------------
DDP = ["trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]


@pytest.mark.slow
def test_ddp_on_two_processes_matches_one_process_with_the_same_global_batch(tmp_path):
    """Shared negatives (uniform) and no dropout: both runs make the same draws, so the exact ppl must agree."""
    common = [*TINY, "logger=csv", "output=uniform", "output.num_samples=8", "optim=sgd", "optim.lr=0.5",
              "loss_reduction=mean", "trainer.max_epochs=1"]  # fmt: skip
    single = subprocess.Popen(lmtrain(*common, f"hydra.run.dir={tmp_path / 'single'}"), cwd=tmp_path,
                              env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    run_cli([*common, *DDP, f"hydra.run.dir={tmp_path / 'ddp'}"], tmp_path)
    assert single.wait(timeout=400) == 0
    one, two = run_info(tmp_path / "single")["metrics"], run_info(tmp_path / "ddp")["metrics"]
    for key in ("val/ppl", "test/ppl"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
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
    rank0, rank1 = (torch.load(trees / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert rank0["trees"] and len(rank0["trees"]) == len(rank1["trees"])
    for a, b in zip(rank0["trees"], rank1["trees"], strict=True):
        assert a.abs().sum() > 0 and torch.equal(a, b)  # bitwise: same weights, same reduced sparse gradients
    for name, weight in rank0["weights"].items():
        assert torch.equal(weight, rank1["weights"][name]), name

    # the val ppl the two ranks reported together = one process evaluating the final weights alone
    cfg = make_config([*overrides, f"run_dir={tmp_path / 'eval'}"])
    data = instantiate(cfg.data)
    data.setup()
    encoder = build(cfg.model, num_classes=data.num_classes)
    output = build_output(cfg, data.num_classes, encoder.output_dim, data.counts)
    module = LanguageModel(encoder, output, OmegaConf.to_container(cfg.optim, resolve=True), cfg.loss_reduction)
    module.load_state_dict(torch.load(tmp_path / "ddp" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"])
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    [alone] = trainer.validate(module, datamodule=data, verbose=False)
    assert run_info(tmp_path / "ddp")["metrics"]["val/ppl"] == pytest.approx(alone["val/ppl"], rel=1e-5)


@pytest.mark.slow
def test_ddp_resume_mid_epoch_matches_the_uninterrupted_ddp_run(tmp_path):
    """Each rank carries the LSTM state of its own rows: the checkpoint keeps all of them, each rank gets its own."""
    common = [*TINY, *DDP, "logger=csv", "output=uniform", "output.num_samples=8", "model.dropout=0.3", "optim=sgd",
              "optim.lr=0.5", "loss_reduction=mean", "trainer.max_epochs=2", "test_after_fit=false",
              "checkpoint_every_n_steps=4"]  # fmt: skip
    run_cli([*common, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=45"]  # mid epoch 2
    crashed = subprocess.run(lmtrain(*common, *crash, f"hydra.run.dir={tmp_path / 'split'}"), cwd=tmp_path,
                             env=cli_env(tmp_path), capture_output=True, text=True, timeout=400)  # fmt: skip
    assert crashed.returncode != 0 and "simulated crash after step 45" in crashed.stderr
    state = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.ckpt")["lmtrain"]["state"]
    assert state[0].shape[1] == 16  # the rows of both ranks (data.batch_size)
    run_cli([*common, "ckpt_path=last", f"hydra.run.dir={tmp_path / 'split'}"], tmp_path)
    expected, resumed = run_info(tmp_path / "straight")["metrics"], run_info(tmp_path / "split")["metrics"]
    assert abs(resumed["val/ppl"] - expected["val/ppl"]) <= 1e-6 * expected["val/ppl"]


# --- configs: presets and launchers ---------------------------------------------------------------------------
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
