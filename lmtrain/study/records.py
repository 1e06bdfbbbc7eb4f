"""A study's raw records: one JSON object per finished run in ``records.jsonl``, made from the run's folder alone.

A record holds the full resolved config, the seed, the code's commit, the compute threads and device, every
validation, the test result and the training throughput, so that tables and plots are rendered from the records
alone and anyone can check what a cell was measured under.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from lmtrain.study.spec import Run
from lmtrain.tools.run_records import read_json_lines, read_metrics


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a study (an empty list when it has none yet); a truncated last line is ignored (a line cut off
    by a kill while it was written: that run reruns)."""
    return read_json_lines(path)


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line, flushed to disk (a kill never leaves a half-written earlier record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def code_version() -> dict[str, Any]:
    """The commit of the code that ran (and whether the work tree had uncommitted changes), when in a git clone."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "lmtrain"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status)}


def device_name(config: dict[str, Any]) -> str:
    """The accelerator a run used (CUDA's device name), else the CPU."""
    import torch

    if torch.cuda.is_available() and config.get("trainer", {}).get("accelerator") != "cpu":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.machine()})"


def build_record(
    study: str, run: Run, run_dir: Path, threads: int, wall_seconds: float, error: str | None, code: dict[str, Any]
) -> dict[str, Any]:
    """The record of one finished run, from its folder: config.yaml, metrics.csv and run.json."""
    import torch

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    series = read_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else {}
    seconds = {step: value for step, _, value in series.get("train/seconds", [])}
    losses = {step: value for step, _, value in series.get("val/loss", [])}
    validations = [
        {"step": step, "epoch": epoch, "ppl": ppl, "loss": losses.get(step), "train_seconds": seconds.get(step)}
        for step, epoch, ppl in series.get("val/ppl", [])
    ]
    info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
    test = None
    if series.get("test/ppl"):
        test = {"ppl": series["test/ppl"][-1][2], "loss": (series.get("test/loss") or [(0, 0, None)])[-1][2]}
    tokens_per_sec = None
    if validations and validations[-1]["train_seconds"]:
        data = config.get("data", {})
        tokens = (validations[-1]["step"] + 1) * int(data.get("batch_size", 0)) * int(data.get("bptt", 0))
        tokens_per_sec = tokens / validations[-1]["train_seconds"]  # training time only, validation left out
    return {
        "study": study,
        "key": run.key,
        "cell": dict(run.cell.values),
        "seed": run.seed,
        "status": "failed" if error else "ok",
        "error": error,
        "best_val_ppl": min((v["ppl"] for v in validations), default=None),
        "test": test,
        "validations": validations,
        "tokens_per_sec": tokens_per_sec,
        "best_possible_ppl": info.get("best_possible_ppl"),  # a generated corpus's optimum (time summaries)
        "threads": threads,
        "device": device_name(config),
        "torch": torch.__version__,
        "wall_seconds": round(wall_seconds, 1),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        **code,
    }


def speed_tables(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-corpus tables of a speed record (``scripts/bench_train.py``, ``scripts/bench_scoring.py``): its
    ``corpora``, or a record of one corpus, written flat, under the name of its ``data``."""
    return record.get("corpora") or {record.get("data") or "default data": record}
