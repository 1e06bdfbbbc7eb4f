"""What the config asks of the machine is refused before Hydra writes a folder or Lightning starts a process: an
accelerator or a device count the machine lacks, a precision the device would swap, a global batch the processes
cannot split, an output folder this user cannot write. One line, exit 2, nothing written; under DDP only rank 0
speaks and no rank removes the folder the others write into."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import lmtrain.cli.failures as failures
import lmtrain.cli.machine as machine
from lmtrain.cli.app import run_app
from tests.command_line import accept, refusal

NO_GPU = not torch.cuda.is_available() and not torch.backends.mps.is_available()
CPU_DDP = ["trainer=ddp", "trainer.accelerator=cpu"]


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize(
    ("name", "kind"), [("gpu", "GPU"), ("cuda", "CUDA GPU"), ("mps", "MPS (Apple silicon) GPU"), ("tpu", "TPU")]
)
def test_an_accelerator_the_machine_lacks_is_one_line(name, kind, tmp_path, monkeypatch, capsys):
    refused = refusal([f"trainer.accelerator={name}"], tmp_path, monkeypatch, capsys)
    assert refused.startswith(f"trainer.accelerator={name}: this machine has no {kind}; use trainer.accelerator=cpu")


def test_more_gpus_than_the_machine_has_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(machine, "machine_has", lambda accelerator: 1)  # a machine with one GPU
    refused = refusal(["trainer.accelerator=gpu", "trainer.devices=4"], tmp_path, monkeypatch, capsys)
    assert refused == "trainer.devices=4: this machine has 1 GPU; use trainer.devices=1 or fewer"
    refused = refusal(["trainer.accelerator=cuda", "trainer.devices=[0,1]"], tmp_path, monkeypatch, capsys)
    assert refused.startswith("trainer.devices=[0, 1]: this machine has 1 CUDA GPU;")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (  # the command: data=ptb's eval batch of 10 rows over 4 processes
            [*CPU_DDP, "trainer.devices=4"],
            "data.eval_batch_size=10 is not divisible by the 4 processes (trainer.accelerator=cpu, trainer.devices=4, "
            "trainer.strategy=ddp): set data.eval_batch_size to a multiple of 4",
        ),
        ([*CPU_DDP, "trainer.devices=3", "data.eval_batch_size=9"], "data.batch_size=20 is not divisible by the 3"),
        ([*CPU_DDP, "trainer.devices=2", "trainer.num_nodes=2"], "data.eval_batch_size=10 is not divisible by the 4"),
        (
            ["-m", *CPU_DDP, "trainer.devices=2,4"],
            "job 1 (trainer=ddp trainer.accelerator=cpu trainer.devices=4): data.eval_batch_size",
        ),
        (
            ["trainer.accelerator=cpu", "trainer.precision=16-mixed"],
            "trainer.precision=16-mixed: the CPU does not run it (Lightning would train in bf16-mixed); use "
            "trainer.precision=bf16-mixed or 32-true",
        ),
        (["trainer.accelerator=cpu", "trainer.precision=16"], "trainer.precision=16: the CPU does not run it"),
        (["trainer.accelerator=cpu", "trainer.precision=64-bit"], "trainer (trainer.accelerator=cpu): Precision"),
    ],
)
def test_what_the_processes_or_the_device_cannot_do_is_one_line(args, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(machine, "cpu_cores", lambda: 8)  # a process per core: 5 fit
    assert expected in refusal(args, tmp_path, monkeypatch, capsys)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: accelerator=auto chooses it")
@pytest.mark.parametrize(
    "args", [["trainer.devices=4"], [*CPU_DDP, "trainer.devices=4"], ["trainer.accelerator=cpu", "trainer.devices=3"]]
)
def test_more_cpu_processes_than_cores_is_one_line_naming_the_key(args, tmp_path, monkeypatch, capsys):
    """trainer.devices=4 on a 2-core CPU: refused for the cores, naming the key (not for the eval batch)."""
    monkeypatch.setattr(machine, "cpu_cores", lambda: 2)
    devices = args[-1].removeprefix("trainer.devices=")
    refused = refusal(args, tmp_path, monkeypatch, capsys)
    assert refused == (
        f"trainer.devices={devices}: this machine has 2 CPU cores for its processes (one per device); use "
        "trainer.devices=2 or fewer"
    )
    assert refusal([*CPU_DDP, "trainer.devices=2"], tmp_path, monkeypatch, capsys) == ""


def test_cpu_cores_are_those_this_process_may_run_on():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert machine.cpu_cores() == expected


@pytest.mark.parametrize(
    "args",
    [
        [*CPU_DDP, "trainer.devices=2"],
        [*CPU_DDP, "trainer.devices=5", "data.batch_size=25", "data.eval_batch_size=5"],
        ["trainer.accelerator=cpu", "trainer.precision=bf16-mixed"],
        ["trainer.accelerator=cpu", "trainer.precision=32"],
        ["trainer.accelerator=auto", "trainer.devices=auto"],
    ],
)
def test_what_the_machine_can_do_passes(args, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(machine, "cpu_cores", lambda: 8)
    assert refusal(args, tmp_path, monkeypatch, capsys) == ""


def unwritable(tmp_path: Path) -> Path:
    """A folder this user cannot write into (as root: one on a read-only file system, if the test finds none it
    skips)."""
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; tests/test_cli.py checks a folder below a file")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_an_output_folder_that_cannot_be_written_is_one_line_before_anything_starts(key, tmp_path, monkeypatch, capsys):
    below_a_file = tmp_path / "a-file"
    below_a_file.write_text("")
    folders = [(below_a_file / "run", f"{below_a_file} is a file")]
    if os.geteuid() != 0:
        folders.append((unwritable(tmp_path) / "run", "is not writable by this user"))
    for folder, reason in folders:
        quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
        monkeypatch.setattr(sys, "argv", ["lmtrain", *(["-m"] if "sweep" in key else []), f"{key}={folder}", *quiet])
        with pytest.raises(SystemExit) as exit:
            run_app(accept)
        [line] = capsys.readouterr().err.strip().splitlines()
        assert exit.value.code == 2 and line.startswith(f"lmtrain: error: {key}={folder} cannot be") and reason in line
        assert not folder.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no procfs here")
def test_an_output_folder_the_file_system_refuses_is_one_line(monkeypatch, capsys):
    """hydra.run.dir=/proc/nope: os.access lets root write into /proc, but no folder can be made there; the check
    tries to make it (one line, exit 2, not Hydra's traceback), and leaves nothing."""
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["lmtrain", "hydra.run.dir=/proc/nope", *quiet])
    with pytest.raises(SystemExit) as exit:
        run_app(accept)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2
    assert line == (
        "lmtrain: error: hydra.run.dir=/proc/nope cannot be created in /proc (No such file or directory); choose "
        "another hydra.run.dir"
    )


def test_the_output_folder_check_leaves_nothing_behind(tmp_path):
    machine.check_output_folder(str(tmp_path / "a" / "b"), "hydra.run.dir")
    assert list(tmp_path.iterdir()) == []


def failing_train(cfg: object) -> dict[str, float]:
    Path(str(cfg.run_dir), "vocab.tsv").write_text("word\tcount\n")  # type: ignore[attr-defined]
    raise ValueError("eval_batch_size=10 is not divisible by the 4 processes")


@pytest.mark.parametrize(
    ("rank", "rank_0_ends", "expected"),
    [
        (0, True, "lmtrain: error: eval_batch_size=10 is not divisible by the 4 processes"),
        (1, True, ""),  # rank 0 ended (it said the line): this rank is quiet
        (1, False, "lmtrain: error: process 1 of the run: eval_batch_size=10 is not divisible by the 4 processes"),
    ],
)
def test_under_ddp_only_rank_0_speaks_and_no_rank_removes_the_folder(
    rank, rank_0_ends, expected, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("WORLD_SIZE", "4")  # as Lightning's launcher sets it in every process it starts
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    parents = iter([100] + [1 if rank_0_ends else 100] * 1000)  # the launcher's pid, then init's once it ended
    monkeypatch.setattr(failures.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(failures, "RANK_0_GRACE_S", 0.3)
    cfg = OmegaConf.create({"run_dir": str(run_dir)})
    with pytest.raises(SystemExit) as exit:
        failures.run_guarded(failing_train, cfg, failures.RunFolder(started=0.0, own=True))
    assert exit.value.code == 2 and (run_dir / "vocab.tsv").is_file()  # the other ranks may still write there
    assert capsys.readouterr().err.strip() == expected
