"""Running lmtrain as a command in tests: the environment, tiny configs, and reading what runs leave (run.json,
checkpoints, offline W&B records)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

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
    "trainer.val_check_interval=1.0",  # at epoch ends and max_steps only, not ~10 times (tests say when)
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


def lmtrain(*args: str, module: str = "lmtrain") -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_cli(
    args: list[str], tmp_path: Path, module: str = "lmtrain", check: bool = True, **env: str | None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` in ``tmp_path``; with ``check``, it must succeed."""
    result = subprocess.run(
        lmtrain(*args, module=module),
        cwd=tmp_path,
        env=cli_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert not check or result.returncode == 0, result.stderr[-4000:]
    return result


def run_info(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def wandb_records(run_dir: Path, wait_for: str = "exit", timeout: float = 30.0) -> list[Any]:
    """The protobuf records of an offline W&B run (its run-ID.wandb file, LevelDB log format). W&B's service
    process writes the file after the run has finished in this process, so the read waits (up to ``timeout``
    seconds) until a ``wait_for`` record (the run's last) is there; the caller's assertions then see all of it."""
    deadline = time.monotonic() + timeout
    records = read_wandb_file(run_dir)
    while not any(r.WhichOneof("record_type") == wait_for for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = read_wandb_file(run_dir)
    return records


def read_wandb_file(run_dir: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
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


def last_step(ckpt: Path) -> int:
    try:
        return int(torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"])
    except Exception:  # not written yet
        return -1


DDP = ["trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]
