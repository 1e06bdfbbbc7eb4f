"""Retraining a scoring study's source runs whose folders are gone (``python -m lmtrain.study NAME --train-missing``).

Run folders live outside git, so a fresh clone (or a new machine) has a scoring study's records but none of the
checkpoints they were scored on. Each missing run is trained again with its recorded command into a side folder,
``FOLDER.retraining``, and moved into place only when the training ends well, so a half-trained model is never
scored; a call that is cut off resumes the side folder from its last checkpoint next time. The retrained run is
compared with the source study's record (best validation and test perplexity): training is deterministic for a
given seed, device and thread count, so a match says the scores are of the same model the record measured, and a
difference is printed for the reader to judge.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lmtrain.process.threads import jobs_sharing_cores
from lmtrain.study.claims import claimed
from lmtrain.study.records import read_records
from lmtrain.study.runner import command, records_path
from lmtrain.study.scores import SourceRun, missing_runs
from lmtrain.study.scores_spec import ScoreSpec
from lmtrain.study.spec import Run

SAME = 1e-4  # relative difference below which a retrained perplexity is the recorded one (float32 printing aside)


def _recorded(record: dict[str, Any]) -> dict[str, float]:
    """The perplexities a source record holds: best validation and test, where present."""
    numbers = {"val": record.get("best_val_ppl"), "test": (record.get("test") or {}).get("ppl")}
    return {name: float(value) for name, value in numbers.items() if isinstance(value, int | float)}


def _retrained(folder: Path) -> dict[str, float]:
    """The same perplexities from a finished run's run.json."""
    info = folder / "run.json"
    metrics = json.loads(info.read_text()).get("metrics", {}) if info.is_file() else {}
    numbers = {"val": metrics.get("val/ppl_best"), "test": metrics.get("test/ppl")}
    return {name: float(v) for name, v in numbers.items() if isinstance(v, int | float) and math.isfinite(v)}


def comparison(recorded: dict[str, float], retrained: dict[str, float]) -> str:
    """How a retrained run's perplexities compare with its record's, in words."""
    shared = [name for name in ("val", "test") if name in recorded and name in retrained]
    if not shared:
        return "its record holds no perplexity to compare"
    pairs = ", ".join(f"{name} ppl {retrained[name]:.2f} (recorded {recorded[name]:.2f})" for name in shared)
    same = all(abs(retrained[n] / recorded[n] - 1) < SAME for n in shared)
    return f"{'reproduces its record' if same else 'DIFFERS from its record'}: {pairs}"


def retrain(spec: ScoreSpec, run: SourceRun, record: dict[str, Any]) -> str:
    """Train one missing source run into ``run.expected`` (through its side folder); a one-line outcome."""
    source, folder = spec.source_spec(), run.expected
    side = folder.with_name(f"{folder.name}.retraining")
    with claimed(folder.parent / f"{folder.name}.claim") as mine:
        if not mine:
            return f"{run.key}: another process is retraining it, skipped"
        stale = f".stale-{int(time.time())}"
        if side.exists() and not (side / "checkpoints" / "last.ckpt").is_file():
            side.rename(side.with_name(side.name + stale))  # an attempt that died before its first checkpoint
        side.parent.mkdir(parents=True, exist_ok=True)
        log = folder.parent / f"{folder.name}.retraining.log"
        train = command(source, Run(run.cell, run.seed), side)  # resumes the side folder's last checkpoint
        with open(log, "a") as out:
            result = subprocess.run(train, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0 or not (side / "run.json").is_file():
            return f"{run.key}: retraining stopped (exit {result.returncode}), nothing scored; see {log}"
        if folder.exists():  # a folder without a checkpoint (a run that never finished): kept aside, not replaced
            folder.rename(folder.with_name(folder.name + stale))
        side.rename(folder)
    return f"{run.key}: retrained into {folder}; {comparison(_recorded(record), _retrained(folder))}"


def retrain_missing(spec: ScoreSpec, root: Path, runs_root: Path, cells: str | None = None, jobs: int = 1) -> int:
    """Retrain the source runs (of the cells matching ``cells``) that have a record but no folder, ``jobs`` at a
    time; returns how many were tried."""
    source = spec.source_spec()
    records = {r["key"]: r for r in read_records(records_path(source, root))}
    missing = missing_runs(spec, root, runs_root, cells)
    print(f"study {spec.name}: {len(missing)} source runs of {source.name} to retrain", flush=True)
    # threads=auto of every run (inherited) shares the cores among the jobs
    with jobs_sharing_cores(jobs), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for line in pool.map(lambda run: retrain(spec, run, records[run.key]), missing):
            print(line, flush=True)
    return len(missing)
