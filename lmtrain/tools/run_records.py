"""Run folders read back (``RunRecord``): finding them under a folder, their metrics.csv and run.json, their
legend labels; for the plots, the summaries and the studies."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunRecord:
    """One run folder: its label, identifying config values, and metric series as (step, epoch, value) rows."""

    path: Path
    name: str
    info: dict[str, object] = field(default_factory=dict)
    series: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)

    def values(self, key: str) -> list[float]:
        return [v for _, _, v in self.series.get(key, [])]

    def last(self, key: str) -> float | None:
        vals = self.values(key)
        return vals[-1] if vals else None

    def best(self, key: str) -> float | None:
        vals = self.values(key)
        return min(vals) if vals else None


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """One JSON object per line (a study's records.jsonl); [] when the file is missing, a line that does not parse
    (cut off by a kill while it was written) left out."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def read_metrics(path: Path) -> dict[str, list[tuple[int, int, float]]]:
    """metrics.csv (sparse columns) -> series per metric. A run resumed from a checkpoint repeats the steps after
    it that the interrupted run had written already: the later rows replace those."""
    series: dict[str, list[tuple[int, int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(float(row.get("step") or 0))
            epoch = int(float(row.get("epoch") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                number = float(value)
                if math.isfinite(number):
                    rows = series.setdefault(key, [])
                    if rows and step < rows[-1][0]:  # a resumed run redid these steps: its rows count
                        while rows and rows[-1][0] >= step:
                            rows.pop()
                    rows.append((step, epoch, number))
    return series


def training_throughput(run_dir: str | Path, warmup: int) -> float:
    """Tokens per second of a run's training after ``warmup`` steps: total tokens over total time, from the
    ``tokens_per_sec`` values in its metrics.csv (each the mean over an equal number of steps)."""
    rates = [v for step, _, v in read_metrics(Path(run_dir) / "metrics.csv")["tokens_per_sec"] if step >= warmup]
    return statistics.harmonic_mean(rates)  # equal tokens per interval: total tokens / total time


def load_run(run_dir: str | Path) -> RunRecord:
    """Load a run folder written by `lmtrain.run.run.train` (needs metrics.csv; run.json gives the label)."""
    path = Path(run_dir)
    metrics = path / "metrics.csv"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path} holds no metrics.csv: is it an lmtrain run folder?")
    info_file = path / "run.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    return RunRecord(path=path, name=str(info.get("name", path.name)), info=info, series=read_metrics(metrics))


def natural_key(path: Path) -> list[Any]:
    """Sorts job folders in job order: numbers by value (2 before 10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(root: str | Path) -> list[RunRecord]:
    """Every job folder under ``root`` (holding metrics.csv or .hydra/), in job order; unfinished jobs included."""
    root = Path(root)
    folders = set()
    for here, dirs, files in os.walk(root, followlinks=True):  # symlinked run folders count: pick runs by linking
        if "metrics.csv" in files or ".hydra" in dirs:
            folders.add(Path(here))
        dirs[:] = [d for d in dirs if d != "wandb" and d != ".hydra"]
    runs = []
    for folder in sorted(folders, key=natural_key):
        if (folder / "metrics.csv").is_file():
            runs.append(load_run(folder))
        else:  # failed before its first logged step
            runs.append(RunRecord(path=folder, name=folder.name))
    return runs


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """The runs in ``paths``: a run folder (holding metrics.csv) or a sweep folder (every job with a metrics.csv
    under it, in job order). Plain files among several paths are passed over, so that a shell glob such as
    ``runs/study/NAME/output-rff__*`` may also match the study's ``.log`` files beside the run folders."""
    paths = list(paths)
    folders = [p for p in paths if not Path(p).is_file()] if len(paths) > 1 else paths
    runs = []
    for path in folders:
        found = [r for r in find_runs(path) if (r.path / "metrics.csv").is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds no metrics.csv: is it an lmtrain run or sweep folder?")
        runs.extend(found)
    return runs


def run_labels(
    runs: list[RunRecord], width: int = 40, ignore: tuple[str, ...] = (), distinct: bool = True
) -> list[str]:
    """The label of each run in the plots (``lmtrain.plot``) and the summaries (``lmtrain.summarize``): its
    ``name=`` if given, else ``compose_labels`` of its strategy and command-line overrides. ``distinct``: labels that
    still agree get the run folder's name (a plot's lines); a summary that groups runs by label (their m on the x
    axis, in ``ignore``) keeps them."""
    settings = [[o for o in _overrides(run) if not o.startswith(("hydra.", "ckpt_path=", "run_dir="))] for run in runs]
    composed = compose_labels([strategy_of(run) for run in runs], settings, ignore, width)
    labels = [
        run.name if any(o.startswith("name=") for o in given) or not label else label
        for run, given, label in zip(runs, settings, composed, strict=True)
    ]
    if not distinct:
        return labels
    pairs = zip(labels, runs, strict=True)
    return [f"{label} ({run.path.name})" if labels.count(label) > 1 else label for label, run in pairs]


def compose_labels(
    strategies: list[str | None], settings: list[list[str]], ignore: tuple[str, ...] = (), width: int = 40
) -> list[str]:
    """The one rule of a run's label: its strategy, then the settings (``KEY=VALUE``) that differ between the runs
    given, keys cut to their last part (``rff num_samples=100``, ``full lr=0.5``); ``output=`` (the strategy) and
    the keys in ``ignore`` (full or last part: ``seed``, ``num_samples``) left out; at most ``width`` characters.
    '' for a run with neither (its caller names it otherwise)."""

    def kept(setting: str) -> bool:
        key = setting.split("=", 1)[0].lstrip("+")
        return key != "output" and key not in ignore and key.rsplit(".", 1)[-1] not in ignore

    settings = [[s.lstrip("+") for s in given if kept(s)] for given in settings]
    common = set.intersection(*map(set, settings)) if settings else set()
    labels = []
    for strategy, given in zip(strategies, settings, strict=True):
        varying = [s.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + s.split("=", 1)[1] for s in given if s not in common]
        label = " ".join([*([strategy] if strategy else []), *varying])
        labels.append(label if len(label) <= width else label[: width - 1] + "…")
    return labels


def strategy_of(run: RunRecord) -> str | None:
    """The run's ``output=`` choice: from its command line, else from run.json (a run made in Python names its
    class there); None where neither says."""
    given = [o.split("=", 1)[1] for o in _overrides(run) if o.split("=", 1)[0] == "output"]
    return given[-1] if given else str(run.info["output"]) if run.info.get("output") else None


def _overrides(run: RunRecord) -> list[str]:
    """The command-line overrides of a run (Hydra's .hydra/overrides.yaml), [] when unknown."""
    import yaml

    saved = run.path / ".hydra" / "overrides.yaml"
    return [str(o).lstrip("+") for o in (yaml.safe_load(saved.read_text()) or [])] if saved.is_file() else []
