"""The data of comparison curves: runs grouped by everything but their seed, validation perplexity against optimizer
steps, training tokens or training seconds, and the training quantity each strategy has (exact perplexity or loss).

Drawing is ``plot.py`` (``python -m lmtrain.plot``); this module only reads run folders and returns the points
it would plot.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import yaml

from lmtrain.tools.run_records import RunRecord, run_labels

AXES = ("steps", "tokens", "seconds")
AXIS_LABELS = {
    "steps": "optimizer steps",
    "tokens": "training tokens (steps x batch x bptt)",
    "seconds": "training seconds (validation left out)",
}
# config keys that name where or how a run was logged, not what it trained
_PLACE_KEYS = ("run_dir", "name", "group", "ckpt_path", "logger", "callbacks", "threads", "progress_bar")


@dataclass
class RunGroup:
    """Runs that differ only by their seed (one run where no other shares its config), with their legend label."""

    label: str
    runs: list[RunRecord]
    tokens_per_step: int | None  # batch x bptt x gradient accumulation, None where the config is unknown


@dataclass
class Line:
    """One plotted curve: the mean over a group's runs at each x, and their min and max (the band) where the group
    holds several runs. ``group`` indexes the group, so that a group keeps its color in every panel."""

    label: str
    group: int
    x: list[float]
    y: list[float]
    low: list[float] | None = None
    high: list[float] | None = None


@dataclass
class Panel:
    """One axes of the figure: what its axes show and its lines."""

    title: str
    xlabel: str
    ylabel: str
    yscale: str
    lines: list[Line]


def run_config(run: RunRecord) -> dict[str, Any]:
    """The run's resolved config (RUN/config.yaml, else Hydra's .hydra/config.yaml), {} when neither is there."""
    for file in (run.path / "config.yaml", run.path / ".hydra" / "config.yaml"):
        if file.is_file():
            return yaml.safe_load(file.read_text()) or {}
    return {}


def tokens_per_step(config: dict[str, Any]) -> int | None:
    """Training tokens in one optimizer step: the (global) batch x bptt x accumulated batches."""
    data, trainer = config.get("data") or {}, config.get("trainer") or {}
    if not data.get("batch_size") or not data.get("bptt"):
        return None
    return int(data["batch_size"]) * int(data["bptt"]) * int(trainer.get("accumulate_grad_batches") or 1)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def seed_free_config(run: RunRecord) -> str | None:
    """What the run trained, its seed left out: the flat config without the seed, the keys that copy it
    (``sampler.seed: ${seed}``; the data's own seed stays) and the run's place. None without a config."""
    config = run_config(run)
    if not config:
        return None
    seed = config.get("seed")
    flat = _flat(config)
    kept = {
        key: value
        for key, value in flat.items()
        if key.split(".", 1)[0] not in _PLACE_KEYS
        and not key.endswith("cache_dir")
        and not (key.rsplit(".", 1)[-1] == "seed" and value == seed and not key.startswith("data."))
    }
    return repr(sorted(kept.items()))


def group_by_seed(runs: list[RunRecord]) -> list[RunGroup]:
    """Runs whose configs agree but for the seed form one group, in the order of their first run; labels name
    what differs between the groups (the seed left out)."""
    keys: dict[str, list[RunRecord]] = {}
    for run in runs:
        key = seed_free_config(run) or f"path:{run.path}"
        keys.setdefault(key, []).append(run)
    members = list(keys.values())
    labels = run_labels([group[0] for group in members], ignore=("seed",))
    groups = []
    for label, group in zip(labels, members, strict=True):
        seeds = {repr(run_config(run).get("seed")) for run in group}
        kind = "seeds" if len(seeds) == len(group) else "runs"  # the same seed twice: repeated runs
        shown = label if len(group) == 1 else f"{label} ({len(group)} {kind})"
        groups.append(RunGroup(shown, group, tokens_per_step(run_config(group[0]))))
    return groups


def validations(run: RunRecord, axis: str, per_step: int | None) -> dict[int, tuple[float, float]]:
    """Optimizer steps done -> (x on ``axis``, validation perplexity) for each validation of the run. A validation's
    row is labelled with the 0-based index of the last step, so after ``step + 1`` steps; on the seconds axis only
    validations with their ``train/seconds`` count, on the tokens axis none where the batch shape is unknown."""
    seconds = {step + 1: value for step, _, value in run.series.get("train/seconds", [])}
    points = {}
    for step, _, ppl in run.series.get("val/ppl", []):
        done = step + 1
        if axis == "steps":
            x: float | None = float(done)
        elif axis == "tokens":
            x = float(done * per_step) if per_step else None
        else:
            x = seconds.get(done)
        if x is not None:
            points[done] = (x, ppl)  # the later row of a step wins (a validation repeated there)
    return points


def _band(label: str, number: int, columns: list[dict[int, tuple[float, float]]]) -> Line:
    """The mean, min and max over runs at the steps every run has."""
    steps = sorted(set.intersection(*(set(c) for c in columns))) if columns else []
    xs = [statistics.mean(c[s][0] for c in columns) for s in steps]  # seconds differ between seeds: their mean
    values = [[c[s][1] for c in columns] for s in steps]
    line = Line(label, number, xs, [statistics.mean(v) for v in values])
    if len(columns) > 1:
        line.low, line.high = [min(v) for v in values], [max(v) for v in values]
    return line


def validation_panel(groups: list[RunGroup], axis: str) -> Panel:
    """Validation perplexity (exact for every strategy) against ``axis``, one line (and band) per group."""
    lines = []
    for number, group in enumerate(groups):
        columns = [validations(run, axis, group.tokens_per_step) for run in group.runs]
        line = _band(group.label, number, [c for c in columns if c])
        if line.x:
            lines.append(line)
    return Panel(f"validation perplexity by {axis}", AXIS_LABELS[axis], "validation perplexity (exact)", "log", lines)


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _train_series(run: RunRecord, key: str) -> list[tuple[int, int, float]]:
    return run.series.get(key) or run.series.get(f"{key}_step") or []  # the latter: older metrics.csv


def training_panels(groups: list[RunGroup], axis: str, points: int = 50) -> list[Panel]:
    """Training curves in one unit per panel: the exact training perplexity (``train/ppl``) of the groups whose
    strategy has one (its loss is the exact NLL: full, hsm, adaptive), and the training loss in nats
    (``train/loss``) of every group, each strategy's own objective (a sampled loss is not the NLL). Both are
    running means over a window of 1/``points`` of the run; x is tokens on the tokens axis, else steps."""
    panels = []
    for key, title, ylabel, yscale in TRAINING_PANELS:
        lines = []
        for number, group in enumerate(groups):
            per_step = group.tokens_per_step if axis == "tokens" else 1  # x units per optimizer step
            if per_step is None:
                continue
            columns = []
            for run in group.runs:
                rows = _train_series(run, key)
                smooth = running_mean([v for _, _, v in rows], max(1, len(rows) // points))
                done = [s + 1 for s, _, _ in rows]
                columns.append({d: (float(d * per_step), v) for d, v in zip(done, smooth, strict=True)})
            line = _band(group.label, number, [c for c in columns if c])
            if line.x:
                lines.append(line)
        if lines:
            xlabel = AXIS_LABELS["tokens" if axis == "tokens" else "steps"]
            panels.append(Panel(title, xlabel, f"{ylabel}, running mean", yscale, lines))
    return panels


# (metric, panel title, y label, y scale) of the training panels
TRAINING_PANELS = (
    ("train/ppl", "training perplexity (where the loss is the exact NLL)", "training perplexity", "log"),
    ("train/loss", "training loss: each strategy's own objective", "training loss (nats)", "linear"),
)


def curve_panels(groups: list[RunGroup], x: str) -> list[Panel]:
    """The panels of the figure: validation perplexity against ``x`` (one of ``AXES``, or ``all``: one panel
    each), then the training panels."""
    axes = AXES if x == "all" else (x,)
    return [*(validation_panel(groups, a) for a in axes), *training_panels(groups, x)]
