"""Running a study: every run of its grid that has no record yet, one `python -m lmtrain` process each.

One process per run (rather than one Hydra multirun for the grid) is what lets a study resume: a run whose record
exists is skipped, a run cut off mid-way resumes from its own ``last.ckpt``, and runs go in parallel (``jobs``)
with ``threads=auto`` giving each its share of the cores. A run that another study already measured, with the same
resolved config on the same device kind, takes a copy of that record instead (``lmtrain/study/reuse.py``).
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lmtrain.process.threads import jobs_sharing_cores, resolve_threads
from lmtrain.study.claims import claimed
from lmtrain.study.records import append_record, build_record, code_version, read_records
from lmtrain.study.reuse import reusable, reused_record
from lmtrain.study.spec import Run, StudySpec


def records_path(spec: StudySpec, root: Path) -> Path:
    return root / spec.name / "records.jsonl"


def pending_runs(spec: StudySpec, root: Path, cells: str | None = None) -> list[Run]:
    """The runs of the grid that have no record yet, in grid order (only cells whose label matches the glob
    pattern ``cells``, when given)."""
    done = {record["key"] for record in read_records(records_path(spec, root))}
    chosen = [run for run in spec.runs() if run.key not in done]
    return [run for run in chosen if cells is None or fnmatch.fnmatchcase(run.cell.label, cells)]


def training_folder(spec: StudySpec, run: Run, runs_root: Path) -> Path:
    """Where a run trains: one folder per run, named after its cell and seed."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.cell.label.replace(",", "__").replace("=", "-"))
    return runs_root / spec.name / f"{slug}__seed-{run.seed}"  # no '=': Hydra's override grammar forbids it


def run_overrides(spec: StudySpec, run: Run) -> list[str]:
    """What a run trains: the study's overrides, the cell's, the seed, CSV logging and no progress bar."""
    return [*spec.overrides, *run.cell.overrides(), f"seed={run.seed}", "logger=csv", "progress_bar=false"]


def command(spec: StudySpec, run: Run, folder: Path) -> list[str]:
    """The training command of a run: its overrides (``run_overrides``) and its own folder."""
    resume = ["ckpt_path=last"] if (folder / "checkpoints" / "last.ckpt").is_file() else []
    return [sys.executable, "-m", "lmtrain", *run_overrides(spec, run), f"hydra.run.dir={folder}", *resume]


def reuse_records(spec: StudySpec, runs: list[Run], root: Path, device: str | None = None) -> list[Run]:
    """Append a copy of another study's record for every run it already measured (same resolved config, paths
    aside, same device kind); returns the runs that are left to train."""
    found = reusable(spec, runs, root, lambda run: run_overrides(spec, run), device)
    for run in runs:
        if run.key in found:
            source = found[run.key]
            append_record(records_path(spec, root), reused_record(spec, run, source))
            print(f"{run.key}: reused {source['study']}'s record {source['key']} ({source.get('device')})", flush=True)
    return [run for run in runs if run.key not in found]


def _last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return lines[-1][-500:] if lines else "the run failed without output"


def execute(spec: StudySpec, run: Run, root: Path, runs_root: Path, code: dict[str, Any]) -> str:
    """Train one run and append its record; returns a one-line summary. A run killed by a signal (the session
    ended) leaves no record, so the next call runs it again from its last checkpoint. A run another call holds
    (``lmtrain.study.claims``) or has recorded meanwhile is skipped."""
    folder = training_folder(spec, run, runs_root)
    with claimed(folder.parent / f"{folder.name}.claim") as mine:
        if not mine:
            return f"{run.key}: another process is running it, skipped"
        if any(r.get("key") == run.key for r in read_records(records_path(spec, root))):
            return f"{run.key}: recorded meanwhile by another process, skipped"
        return _train(spec, run, root, folder, code)


def _train(spec: StudySpec, run: Run, root: Path, folder: Path, code: dict[str, Any]) -> str:
    """``execute``'s work, under its claim."""
    if folder.exists() and not (folder / "checkpoints" / "last.ckpt").is_file():
        folder.rename(folder.with_name(f"{folder.name}.stale-{int(time.time())}"))  # died before a checkpoint
    started = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    with open(log, "w") as out:
        result = subprocess.run(command(spec, run, folder), stdout=out, stderr=subprocess.STDOUT)
    if result.returncode < 0:
        return f"{run.key}: stopped by signal {-result.returncode}, no record"
    error = None if result.returncode == 0 else _last_error(log)
    if error and not (_trained(folder) and error.startswith("lmtrain: error:")):
        # bad input, a setup failure or a crash (a traceback), not a result such as a diverged loss: no record
        return f"{run.key}: no record ({error}); see {log}"
    record = build_record(spec.name, run, folder, _threads(folder), time.perf_counter() - started, error, code)
    append_record(records_path(spec, root), record)
    return f"{run.key}: {outcome(record, error)} ({record['wall_seconds']:.0f} s)"


def outcome(record: dict[str, Any], error: str | None) -> str:
    """A finished run in a few words: its test ppl, else (a run without a test, e.g. at equal training time) its
    best val ppl, else why it failed."""
    test = (record.get("test") or {}).get("ppl")
    if test is not None:
        return f"test ppl {test:.2f}"
    if error is None and record.get("best_val_ppl") is not None:
        return f"best val ppl {record['best_val_ppl']:.2f}"
    return f"failed: {error}"


def _trained(folder: Path) -> bool:
    """Whether the run got as far as training (a metrics.csv with rows), so that its failure is a result."""
    metrics = folder / "metrics.csv"
    return metrics.is_file() and len(metrics.read_text().splitlines()) > 1


def _threads(folder: Path) -> int:
    """The compute threads the run used: as its run.json records them, else its ``threads`` setting, ``auto``
    resolved as the run would on an idle machine (the study's ``JOBS_ENV`` is set once, in ``run_study``, for this
    process and its runs alike)."""
    import yaml

    info = folder / "run.json"
    used = json.loads(info.read_text()).get("threads") if info.is_file() else None
    if isinstance(used, int):
        return used
    config_file = folder / "config.yaml"
    setting = yaml.safe_load(config_file.read_text()).get("threads", "auto") if config_file.is_file() else "auto"
    return resolve_threads(setting, measure=False)


def run_study(
    spec: StudySpec,
    root: Path,
    runs_root: Path,
    jobs: int = 1,
    limit: int | None = None,
    cells: str | None = None,
    reuse: bool = True,
) -> int:
    """Run the study's pending runs (those of the cells matching ``cells``), ``jobs`` at a time, at most ``limit``
    of them, after taking over (``reuse``) what other studies' records already measured; returns how many ran."""
    missing = pending_runs(spec, root)
    chosen = [run for run in missing if cells is None or fnmatch.fnmatchcase(run.cell.label, cells)]
    left = reuse_records(spec, chosen, root) if reuse else chosen
    pending = left[:limit]
    total = len(spec.runs())
    recorded = total - len(missing) + len(chosen) - len(left)
    print(f"study {spec.name}: {recorded} of {total} runs recorded, {len(pending)} to run")
    code = code_version()  # one commit for the whole call
    # threads=auto of every run (inherited) shares the cores among the jobs
    with jobs_sharing_cores(jobs), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for line in pool.map(lambda run: execute(spec, run, root, runs_root, code), pending):
            print(line, flush=True)
    return len(pending)
