"""Reading finished runs back: metrics.csv and the run's label, for plots and summaries."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


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


def read_metrics(path: Path) -> dict[str, list[tuple[int, int, float]]]:
    """Lightning's metrics.csv (one row per logging call, sparse columns) -> series per metric."""
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
                    series.setdefault(key, []).append((step, epoch, number))
    return series


def load_run(run_dir: str | Path) -> RunRecord:
    """Load a run folder written by `lmtrain.run.train` (needs metrics.csv; run.json gives the label)."""
    path = Path(run_dir)
    metrics = path / "metrics.csv"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path} holds no metrics.csv: is it an lmtrain run folder?")
    info_file = path / "run.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    return RunRecord(path=path, name=str(info.get("name", path.name)), info=info, series=read_metrics(metrics))
