"""Reusing what another study already measured: a run whose resolved config (paths left out) and device kind match
a record of another study takes a copy of that record instead of training again.

Two studies often share runs (``negatives``' per-position cells are ``ptb_m100``'s cells). A run's resolved config is
what ``python -m lmtrain`` would save as its ``config.yaml``; two configs match when they are equal except for the
paths in ``PATH_KEYS`` (where the run folder, the corpora and the token cache are, and so the study's name). A key
that today's config has and an older record lacks (an option added since) matches when it holds the value that the
run's config groups alone give it (``output=uniform``, ``experiment=ptb_study``: its default there), not one that a
``KEY=VALUE`` override of the cell or the study sets. The copy names its origin (``reused_from``) and keeps the
origin's commit, device and timings, so a table still says where and under which code each number was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmtrain.study.records import device_name, read_records
from lmtrain.study.spec import Run, StudySpec

PATH_KEYS = ("run_dir", "ckpt_path", "data.root", "data.cache_dir")  # where things are, not what is trained
# keys today's config dropped, with the values under which a record trained as today's code trains (``execution``
# was accepted and ignored once ``step_forms`` took its place)
DROPPED = {"execution": (None,)}
MISSING = object()


def resolved_config(overrides: list[str]) -> dict[str, Any]:
    """The config a run with these overrides saves as its config.yaml (its run folder left empty)."""
    from omegaconf import OmegaConf

    from lmtrain.config import compose_config

    cfg = compose_config(overrides, check=False)
    cfg.run_dir = ""  # an interpolation of Hydra's run folder, which exists only inside a Hydra job
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data.bptt": 20, ...}``: every leaf of a nested config by its dotted key, the paths left out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_leaves(value, f"{dotted}."))
        elif dotted not in PATH_KEYS:
            flat[dotted] = value
    return flat


def same_run(wanted: dict[str, Any], have: dict[str, Any], defaults: dict[str, Any]) -> bool:
    """Whether a record's config leaves ``have`` train what the leaves ``wanted`` train: equal leaves, paths aside; a
    leaf the record lacks must hold its default (``defaults``: the leaves the run's config groups alone give); a
    dropped key (``DROPPED``) holding a value that trained as today's code does is left out."""
    have = {key: value for key, value in have.items() if value not in DROPPED.get(key, (MISSING,))}
    for key, value in wanted.items():
        if have.get(key, MISSING) is MISSING:
            if defaults.get(key, MISSING) != value:
                return False
        elif have[key] != value:
            return False
    return set(have) <= set(wanted)  # an option the record had and today's code lacks: not comparable


def other_records(spec: StudySpec, root: Path) -> list[dict[str, Any]]:
    """The finished records of every other study under ``root`` (the records a run of ``spec`` may reuse)."""
    paths = sorted(p for p in root.glob("*/records.jsonl") if p.parent.name != spec.name)
    return [r for path in paths for r in read_records(path) if isinstance(r.get("config"), dict)]


def reusable(
    spec: StudySpec, runs: list[Run], root: Path, overrides_of: Any, device: str | None = None
) -> dict[str, dict[str, Any]]:
    """For each run (by key) that another study's record already measured on this device kind: that record.
    ``overrides_of(run)`` gives the overrides the run would train with; ``device`` defaults to this machine's."""
    candidates = [(r, _leaves(r["config"])) for r in other_records(spec, root)]
    if not runs or not candidates:
        return {}
    defaults: dict[tuple[str, ...], dict[str, Any]] = {}
    found: dict[str, dict[str, Any]] = {}
    for run in runs:
        overrides = overrides_of(run)
        config = resolved_config(overrides)
        groups = tuple(o for o in overrides if "." not in o.split("=", 1)[0])  # output=uniform, not output.bias=x
        if groups not in defaults:
            defaults[groups] = _leaves(resolved_config(list(groups)))
        kind, wanted = device or device_name(config), _leaves(config)
        match = next(
            (r for r, have in candidates if r.get("device") == kind and same_run(wanted, have, defaults[groups])),
            None,
        )
        if match is not None:
            found[run.key] = match
    return found


def reused_record(spec: StudySpec, run: Run, source: dict[str, Any]) -> dict[str, Any]:
    """The copy of ``source`` that stands for ``run`` in ``spec``'s records, naming where it came from."""
    origin = source.get("reused_from") or {"study": source.get("study"), "key": source.get("key")}
    return {**source, "study": spec.name, "key": run.key, "cell": dict(run.cell.values), "reused_from": origin}
