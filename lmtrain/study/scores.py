"""Scoring studies: ``python -m lmtrain.score`` over another study's trained runs, in several modes (plain, with the
neural cache, with dynamic evaluation, ...), one record per (run, mode).

The declaration (a ``scores`` block in place of the grid) is read by ``lmtrain.study.scores_spec``. The runs scored
are the source study's finished records whose cell matches a glob. A run's folder is where its record says it
trained (the ``run_dir`` of its config, read under ``runs_root`` as ``STUDY/FOLDER``: a record the source study
reused from another study points into that study's folder), else the source study's own folder for it; a run
without a folder holding a checkpoint is reported with the command that trains it, and left out. The text scored is
the run corpus's ``test.txt``, else (a generated corpus, one file split by lines) its test split written out. Each
(run, mode) is one call of ``lmtrain.tools.score.score`` (cache θ and λ left out are searched on the run's
validation split there); with ``jobs`` > 1 each call runs in a fresh process, so memory stays that of one model per
job. A (run, mode) whose record exists is skipped, so a study cut off resumes where it stopped. Tables and the plot
come from the records alone (``lmtrain.study.scores_render``).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lmtrain.process.threads import jobs_sharing_cores
from lmtrain.study.claims import claimed
from lmtrain.study.records import append_record, code_version, device_name, read_records
from lmtrain.study.runner import command, records_path, training_folder
from lmtrain.study.scores_spec import ScoreSpec
from lmtrain.study.spec import Cell, Run


@dataclass(frozen=True)
class SourceRun:
    """One finished run of the source study: its record's key, cell and seed, and its folder (None: not found)."""

    key: str
    cell: Cell
    seed: int
    folder: Path | None
    expected: Path  # where it was looked for last: the source study's own folder for it


def _has_checkpoint(folder: Path) -> bool:
    """Whether a folder is a run folder that score can read (its config.yaml and a checkpoint)."""
    checkpoints = folder / "checkpoints"
    has = any(checkpoints.glob("best-*.ckpt")) or (checkpoints / "last.ckpt").is_file()
    return (folder / "config.yaml").is_file() and has


def _folder(record: dict[str, Any], own: Path, runs_root: Path) -> Path | None:
    """Where a record's run lives: its config's run_dir, read under ``runs_root`` as STUDY/FOLDER, else as written,
    else the source study's own folder for it; None when none holds a checkpoint."""
    trained = Path(str((record.get("config") or {}).get("run_dir") or ""))
    candidates = [runs_root / trained.parent.name / trained.name, trained] if trained.name else []
    return next((f for f in [*candidates, own] if _has_checkpoint(f)), None)


def source_runs(spec: ScoreSpec, root: Path, runs_root: Path) -> list[SourceRun]:
    """The source study's finished runs whose cell this study scores, in the source study's grid order."""
    source = spec.source_spec()
    by_key = {r["key"]: r for r in read_records(records_path(source, root)) if r.get("status") == "ok"}
    runs = []
    for run in source.runs():
        if run.key in by_key and spec.matches(run.cell.label):
            own = training_folder(source, run, runs_root)
            runs.append(SourceRun(run.key, run.cell, run.seed, _folder(by_key[run.key], own, runs_root), own))
    return runs


@dataclass(frozen=True)
class Job:
    """One (run, mode) to score: everything ``score_job`` needs, picklable for a worker process."""

    study: str
    source_study: str
    run: SourceRun
    mode: str
    arguments: tuple[str, ...]  # score's arguments, the paths aside
    scores_dir: Path  # where its CSV, JSON and (a generated corpus) test text go
    code: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The key of its record."""
        return record_key(self.run.key, self.mode)


def record_key(run_key: str, mode: str) -> str:
    """The key of a (run, mode)'s record."""
    return f"{run_key},mode={mode}"


def records_file(spec: ScoreSpec, root: Path) -> Path:
    """ROOT/NAME/records.jsonl: one record per (run, mode)."""
    return root / spec.name / "records.jsonl"


def _in_cells(run: SourceRun, cells: str | None) -> bool:
    """Whether ``run``'s cell label matches the glob ``cells`` (None: every cell)."""
    return cells is None or fnmatch.fnmatchcase(run.cell.label, cells)


def pending_jobs(
    spec: ScoreSpec, root: Path, runs_root: Path, cells: str | None = None, code: dict[str, Any] | None = None
) -> list[Job]:
    """The (run, mode) pairs without a record, of the runs that have a folder (``cells``: a glob their cell label
    must match too), in the source study's order, each run's modes in declared order; a mode that ``same`` declares
    another's computation in that cell, or that ``skip`` leaves out there, is not scored."""
    done = {r["key"] for r in read_records(records_file(spec, root))}
    jobs = []
    for run in source_runs(spec, root, runs_root):
        if run.folder is None or not _in_cells(run, cells):
            continue
        for mode in spec.modes:
            own = spec.scored_as(run.cell.label, mode) == mode and not spec.skipped(run.cell.label, mode)
            if own and record_key(run.key, mode) not in done:
                folder = runs_root / spec.name / run.expected.name  # named after the source run, so unique
                jobs.append(Job(spec.name, spec.study, run, mode, tuple(spec.arguments(mode)), folder, code or {}))
    return jobs


def missing_runs(spec: ScoreSpec, root: Path, runs_root: Path, cells: str | None = None) -> list[SourceRun]:
    """The recorded source runs whose folder is gone (``cells``: a glob their cell label must match too)."""
    return [run for run in source_runs(spec, root, runs_root) if run.folder is None and _in_cells(run, cells)]


def training_command(spec: ScoreSpec, run: SourceRun) -> str:
    """The command that trains a source run into its own folder, as a user would type it."""
    return " ".join(["python", *command(spec.source_spec(), Run(run.cell, run.seed), run.expected)[1:]])


def tested_text(run_dir: Path, into: Path) -> Path:
    """The text a run is tested on: its corpus folder's test.txt, else its test split written to ``into``/test.txt,
    one sentence per line (a vocabulary without ``<eos>``, a generated corpus: one line)."""
    from hydra.utils import instantiate

    from lmtrain.data.tokenizer import EOS
    from lmtrain.tools.trained import resolve_checkpoint, run_config

    datamodule = instantiate(run_config(resolve_checkpoint(run_dir), []).data)
    folder = getattr(datamodule, "path", None)
    if isinstance(folder, Path) and (folder / "test.txt").is_file():
        return folder / "test.txt"
    datamodule.setup()
    words, lines, line = list(datamodule.vocab), [], []
    for token in datamodule.test_ids.tolist():  # the split as the lines score reads back into the same ids
        if words[token] == EOS:
            lines.append(" ".join(line))
            line = []
        else:
            line.append(words[token])
    lines += [" ".join(line)] if line else []
    into.mkdir(parents=True, exist_ok=True)
    temporary = into / f".test.txt.{os.getpid()}"  # parallel modes of one run write the same text: never half of it
    temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return temporary.replace(into / "test.txt")


def _trained_test_ppl(folder: Path) -> float | None:
    """The run's own test perplexity (its run.json), for reference: it tests in eval_batch_size streams."""
    info = folder / "run.json"
    value = json.loads(info.read_text()).get("metrics", {}).get("test/ppl") if info.is_file() else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def score_job(job: Job, records: Path | None = None) -> dict[str, Any]:
    """Score one (run, mode) under its claim (``lmtrain.study.claims``) and return its record; a refusal of score (a
    ValueError other than missing data) is a record with status ``failed``; anything else raises, as does a job
    that another call holds or has recorded in ``records`` meanwhile (no record here)."""
    with claimed(job.scores_dir / f"{job.mode}.claim") as mine:
        if not mine:
            raise RuntimeError("another process is scoring it, skipped")
        if records is not None and any(r.get("key") == job.key for r in read_records(records)):
            raise RuntimeError("recorded meanwhile by another process, skipped")
        return _score(job)


def _score(job: Job) -> dict[str, Any]:
    """``score_job``'s work: ``lmtrain.tools.score.score`` over the run's test text, and the record."""
    import torch

    from lmtrain.data.errors import DataError
    from lmtrain.tools.score import score

    assert job.run.folder is not None
    started = time.perf_counter()
    text = tested_text(job.run.folder, job.scores_dir)
    out = job.scores_dir / f"{job.mode}.csv"
    argv = [f"ckpt_path={job.run.folder}", f"file={text}", f"out={out}", *job.arguments]
    result, error = None, None
    try:
        result = score(argv)
    except DataError:
        raise
    except ValueError as exc:
        error = str(exc).strip().splitlines()[0]
    extras = (result.extras if result is not None else None) or {}
    device = next((a.split("=", 1)[1] for a in job.arguments if a.startswith("device=")), "auto")
    return {
        "study": job.study,
        "key": job.key,
        "source": {"study": job.source_study, "key": job.run.key, "folder": str(job.run.folder)},
        "cell": dict(job.run.cell.values),
        "seed": job.run.seed,
        "mode": job.mode,
        "overrides": list(job.arguments),
        "file": str(text),
        "status": "failed" if error else "ok",
        "error": error,
        "ppl": None if result is None else result.ppl,
        "tokens": None if result is None else result.tokens,
        "trained_test_ppl": _trained_test_ppl(job.run.folder),
        "settings": {"cache": extras.get("cache"), "dynamic": extras.get("dynamic")},
        "scoring_seconds": extras.get("seconds"),  # the scoring pass alone (cache=true / dynamic=true)
        "seconds_per_1k_tokens": extras.get("seconds_per_1k_tokens"),
        "cpu_seconds_per_1k_tokens": extras.get("cpu_seconds_per_1k_tokens"),
        "seconds": round(time.perf_counter() - started, 2),  # the whole call: loading, searches, statistics
        "threads": torch.get_num_threads(),
        "device": device_name({"trainer": {"accelerator": "cpu" if device == "cpu" else "auto"}}),
        "torch": torch.__version__,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **job.code,
    }


def listing(spec: ScoreSpec, root: Path, runs_root: Path) -> str:
    """Two lines for ``python -m lmtrain.study list``: what the study scores and how much is recorded."""
    runs = source_runs(spec, root, runs_root)
    done = {r["key"] for r in read_records(records_file(spec, root))}
    total = {record_key(run.key, mode) for run in runs for mode in spec.modes}
    what = f"scores {len(runs)} runs of {spec.study} x {len(spec.modes)} modes"
    return f"{spec.name:<22} {what:<31} {len(done & total):>4}/{len(total):<4} recorded\n{'':<22} {spec.description}"


def dry_run(spec: ScoreSpec, root: Path, runs_root: Path, cells: str | None, limit: int | None) -> list[str]:
    """What a call would do: the runs without a folder (with the command that trains each), then the pending
    scorings as ``python -m lmtrain.score`` commands (TEST: the run's test text)."""
    missing = missing_runs(spec, root, runs_root, cells)
    lines = [
        f"# {run.key}: no run folder; train it: {training_command(spec, run)} (or add --train-missing)"
        for run in missing
    ]
    for job in pending_jobs(spec, root, runs_root, cells)[:limit]:
        paths = [f"ckpt_path={job.run.folder}", "file=TEST", f"out={job.scores_dir / job.mode}.csv"]
        lines.append(" ".join(["python -m lmtrain.score", *paths, *job.arguments]))
    return lines


def outcome(record: dict[str, Any]) -> str:
    """A scored (run, mode) in a few words."""
    if record["status"] != "ok":
        return f"{record['key']}: failed ({record['error']})"
    per = record.get("seconds_per_1k_tokens")
    speed = f", {per:.3f} s per 1,000 tokens" if per is not None else ""
    return f"{record['key']}: ppl {record['ppl']:.2f} ({record['seconds']:.0f} s{speed})"


def run_scores(
    spec: ScoreSpec, root: Path, runs_root: Path, jobs: int = 1, limit: int | None = None, cells: str | None = None
) -> int:
    """Score every (run, mode) without a record (of the cells matching ``cells``), at most ``limit`` of them,
    ``jobs`` at a time; each record is appended as it lands. Returns how many were scored."""
    for run in missing_runs(spec, root, runs_root, cells):
        where = f"no run folder with a checkpoint (looked in {run.expected})"
        print(f"{run.key}: {where}; train it: {training_command(spec, run)} (or add --train-missing)", flush=True)
    pending = pending_jobs(spec, root, runs_root, cells, code_version())[:limit]  # one commit for the whole call
    print(f"study {spec.name}: {len(pending)} (run, mode) pairs to score", flush=True)
    path, done = records_file(spec, root), 0
    with jobs_sharing_cores(jobs):
        if jobs <= 1:  # in this process, one after another
            for job in pending:
                done += _land(job, functools.partial(score_job, job, path), path)
        else:  # a fresh process per (run, mode): memory stays one model per job
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context, max_tasks_per_child=1) as pool:
                futures = {pool.submit(score_job, job, path): job for job in pending}
                for future in as_completed(futures):
                    done += _land(futures[future], future.result, path)
    return done


def _land(job: Job, result: Callable[[], dict[str, Any]], path: Path) -> int:
    """Append a finished job's record (1), or print why it has none (0: it is tried again next time)."""
    try:
        record = result()
    except Exception as exc:  # noqa: BLE001 -- one (run, mode) failing leaves the others to run; no record
        reason = (str(exc).strip().splitlines() or [""])[0]
        print(f"{job.key}: no record ({type(exc).__name__}: {reason})", flush=True)
        return 0
    append_record(path, record)
    print(outcome(record), flush=True)
    return 1
