"""Seed statistics of a study's cells and the one comparison rule the tables and the prose use.

"A beats B" only where the difference of the means exceeds twice the pooled standard deviation of the two cells'
seeds, sqrt((sd_A^2 + sd_B^2) / 2); otherwise the two are "tied". A cell with fewer than ``MIN_SEEDS`` (3) seeds
gets no verdict: one seed has no spread, and the sd of two is too unsteady to judge by.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

MIN_SEEDS = 3  # the project's rule: a verdict needs at least 3 seeds in each cell


@dataclass(frozen=True)
class CellStats:
    """The metric of one cell over its seeds (failed runs counted apart)."""

    label: str
    values: tuple[float, ...]
    failed: int = 0

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values) if self.n >= 2 else math.nan


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    """``test/ppl`` (the best checkpoint's test perplexity) or ``val/ppl`` (the best validation) of a record."""
    if record.get("status") != "ok":
        return None
    value = (record.get("test") or {}).get("ppl") if metric == "test/ppl" else record.get("best_val_ppl")
    return float(value) if value is not None and math.isfinite(value) else None


def pooled_sd(a: CellStats, b: CellStats) -> float:
    return math.sqrt((a.sd**2 + b.sd**2) / 2)


def verdict(a: CellStats, b: CellStats) -> str:
    """How ``a`` compares with ``b`` (lower perplexity is better): 'beats', 'behind', 'tied', or '' when either
    cell has fewer than 3 seeds."""
    if a.n < MIN_SEEDS or b.n < MIN_SEEDS:
        return ""
    if abs(a.mean - b.mean) <= 2 * pooled_sd(a, b):
        return "tied"
    return "beats" if a.mean < b.mean else "behind"


def relative(a: CellStats, b: CellStats) -> float:
    """a's mean relative to b's, in percent (+ = a's perplexity is higher)."""
    return 100.0 * (a.mean / b.mean - 1.0)
