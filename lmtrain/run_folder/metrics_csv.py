"""A CSV logger whose metrics.csv survives a resume: new rows are appended, old rows are deleted only where the
resumed run writes them again (``drop_rows_from``); and one row per step, also when a step's metrics arrive in
several calls (lmtrain's per-step loss, then Lightning's metrics)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class AppendingExperimentWriter(ExperimentWriter):
    """Lightning's writer deletes an existing metrics.csv; this one adopts its columns and appends."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = list(next(csv.reader(f), []))

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        """Record a row; metrics for the step of the previous (unsaved) row join that row where they agree."""
        if isinstance(metrics_dict.get("epoch"), float) and float(metrics_dict["epoch"]).is_integer():
            metrics_dict = {**metrics_dict, "epoch": int(metrics_dict["epoch"])}  # a logged epoch arrives as a float
        super().log_metrics(metrics_dict, step)
        if len(self.metrics) >= 2:
            new, last = self.metrics[-1], self.metrics[-2]
            if all(last[key] == value for key, value in new.items() if key in last):  # same step, same epoch
                last.update(self.metrics.pop())


class MetricsCSVLogger(CSVLogger):
    """CSVLogger writing `save_dir/metrics.csv` (with name="" and version="") and keeping earlier rows."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment


def drop_rows_from(path: Path, step: int) -> int:
    """Delete the rows of metrics.csv at ``path`` logged at ``step`` or later, and return how many: a run resumed from
    a checkpoint of global step ``step`` logs them again (the loss of optimizer step k is logged at step k - 1, a
    validation at its last step), and a killed run may have written some after its checkpoint. The rows before stay
    as they are; the file is replaced through a temporary file and a rename, so a kill keeps the old one whole."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "step" not in rows[0]:
        return 0
    column = rows[0].index("step")
    kept = [row for row in rows[1:] if not logged_from(row, column, step)]
    dropped = len(rows) - 1 - len(kept)
    if dropped:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([rows[0], *kept])  # the dialect Lightning's writer uses (excel: \r\n)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return dropped


def logged_from(row: list[str], column: int, step: int) -> bool:
    """Whether a metrics.csv row was logged at ``step`` or later (a row without a readable step: no)."""
    try:
        return int(float(row[column])) >= step
    except (IndexError, ValueError):
        return False
