"""A scoring study's declaration: which trained runs of which study ``python -m lmtrain.score`` reads, in which
modes (plain, with the neural cache, with dynamic evaluation, ...); ``lmtrain.study.scores`` runs it.

A scoring study is a YAML file like a training study, with a ``scores`` block in place of the grid::

    description: the neural cache and dynamic evaluation for every strategy, 1,000 PTB steps
    scores:
      study: survey                          # the training study whose runs are scored (a name or a YAML path)
      cells: ["data=ptb,*"]                  # globs over its cell labels (one string or a list)
      modes:                                 # name -> score's arguments; the first mode is the baseline of the gains
        plain: []
        cache: [cache=true]
        dynamic: [dynamic=true]
        both: [cache=true, dynamic=true]
      overrides: [device=cpu]                # optional: score's arguments for every mode
      reference: data=ptb,output=full        # the cell whose gains every other cell's are compared with
      speed: false                           # optional: a seconds-per-1,000-tokens column per mode in the table
      same:                                  # optional: a cell's mode that is another mode's computation there is
        "data=wt2,output=full": {train: exact}  # not scored again; its cells show that mode's records
      skip:                                  # optional: a cell's mode not scored, and why (shown under the table)
        "data=ptb,output=charcnn": {dynamic: "every step recomputes every class vector"}
    notes: ["..."]                           # optional: lines under the table
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmtrain import CONF_DIR
from lmtrain.study.spec import StudyError, StudySpec, find_spec, read_study_file

KNOWN = ("study", "cells", "modes", "overrides", "reference", "speed", "same", "skip")
PATH_ARGS = ("ckpt_path", "file", "out")  # score's arguments a scoring study sets itself, per run


@dataclass(frozen=True)
class ScoreSpec:
    """A parsed scoring study (see the module docstring for the YAML)."""

    name: str
    description: str
    study: str  # the source study: a package study's name or a YAML path
    cells: tuple[str, ...]  # globs over the source study's cell labels
    modes: dict[str, list[str]]  # mode -> score's arguments, in declared order; the first is the baseline
    overrides: tuple[str, ...] = ()  # score's arguments of every mode
    reference: str | None = None  # the source cell whose gains the others are compared with
    speed: bool = False  # a seconds-per-1,000-tokens column per mode
    notes: tuple[str, ...] = ()
    source: Path | None = None
    same: tuple[tuple[str, str, str], ...] = ()  # (cell glob, mode, the mode whose computation it is there)
    skip: tuple[tuple[str, str, str], ...] = ()  # (cell glob, mode, why that mode is not scored there)

    @property
    def baseline(self) -> str:
        """The mode every other mode's gain is measured against (the first declared)."""
        return next(iter(self.modes))

    def arguments(self, mode: str) -> list[str]:
        """score's arguments of a mode, the paths aside: the study's, then the mode's own."""
        return [*self.overrides, *self.modes[mode]]

    def source_spec(self) -> StudySpec:
        """The training study whose runs are scored."""
        return find_spec(self.study)

    def scored_as(self, label: str, mode: str) -> str:
        """The mode whose records stand for ``mode`` in the cell ``label``: ``mode`` itself unless ``same`` declares
        it another mode's computation there."""
        return next((other for glob, m, other in self.same if m == mode and fnmatch.fnmatchcase(label, glob)), mode)

    def skipped(self, label: str, mode: str) -> str | None:
        """Why ``mode`` is not scored in the cell ``label`` (``skip``); None when it is."""
        return next((why for glob, m, why in self.skip if m == mode and fnmatch.fnmatchcase(label, glob)), None)

    def matches(self, label: str) -> bool:
        """Whether a source cell (by its label) is one this study scores."""
        return any(fnmatch.fnmatchcase(label, pattern) for pattern in self.cells)


def declares_scores(path: Path) -> bool:
    """Whether a study YAML file is a scoring study (holds a ``scores`` block)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "scores" in data


def parse_scores(name: str, data: dict[str, Any], source: Path | None = None) -> ScoreSpec:
    """Check and parse a scoring study's declaration; errors name the file and the key."""
    where = f"study {name}" + (f" ({source})" if source else "")
    unknown = sorted(set(data) - {"description", "scores", "notes"})
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r} (a scoring study has description, scores, notes)")
    block = data.get("scores")
    if not isinstance(block, dict):
        raise StudyError(f"{where}: 'scores' must be a mapping with keys {', '.join(KNOWN)}")
    if unknown := sorted(set(block) - set(KNOWN)):
        raise StudyError(f"{where}: unknown key scores.{unknown[0]} (known: {', '.join(KNOWN)})")
    if not isinstance(block.get("study"), str) or not block["study"]:
        raise StudyError(f"{where}: scores.study names the training study whose runs are scored")
    cells = block.get("cells", "*")
    cells = [cells] if isinstance(cells, str) else cells
    if not isinstance(cells, list) or not cells or not all(isinstance(c, str) and c for c in cells):
        raise StudyError(f"{where}: scores.cells is a glob over the source study's cell labels, or a list of them")
    modes = block.get("modes")
    if not isinstance(modes, dict) or not modes:
        raise StudyError(f"{where}: scores.modes maps each mode's name to its list of score arguments (KEY=VALUE)")
    overrides = block.get("overrides", [])
    for what, arguments in [("overrides", overrides), *((f"modes.{m}", a) for m, a in modes.items())]:
        if not isinstance(arguments, list) or not all(isinstance(a, str) and "=" in a for a in arguments):
            raise StudyError(f"{where}: scores.{what} must be a list of KEY=VALUE arguments of python -m lmtrain.score")
        taken = [a for a in arguments if a.split("=", 1)[0] in PATH_ARGS]
        if taken:
            raise StudyError(f"{where}: scores.{what} sets {taken[0]!r}; the study sets {', '.join(PATH_ARGS)} per run")
    reference = block.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise StudyError(f"{where}: scores.reference is a cell label of the source study (data=ptb,output=full)")
    if not isinstance(block.get("speed", False), bool):
        raise StudyError(f"{where}: scores.speed is true or false")
    same = block.get("same") or {}
    pairs = same.items() if isinstance(same, dict) else [(None, None)]
    for glob, aliases in pairs:
        if not isinstance(glob, str) or not isinstance(aliases, dict):
            raise StudyError(f"{where}: scores.same maps a cell glob to {{MODE: OTHER_MODE}}")
        for mode, other in aliases.items():
            if mode not in modes or other not in modes or mode == other:
                raise StudyError(f"{where}: scores.same.{glob}: {mode}: {other} must name two different modes")
    skip = block.get("skip") or {}
    for glob, reasons in skip.items() if isinstance(skip, dict) else [(None, None)]:
        if not isinstance(glob, str) or not isinstance(reasons, dict):
            raise StudyError(f"{where}: scores.skip maps a cell glob to {{MODE: WHY}}")
        for mode, why in reasons.items():
            if mode not in modes or not isinstance(why, str) or not why.strip():
                raise StudyError(f"{where}: scores.skip.{glob}: {mode} must name a mode and say why it is not scored")
    return ScoreSpec(
        name=name,
        description=str(data.get("description", "")),
        study=block["study"],
        cells=tuple(cells),
        modes={str(mode): [str(a) for a in arguments] for mode, arguments in modes.items()},
        overrides=tuple(str(o) for o in overrides),
        reference=reference,
        speed=bool(block.get("speed", False)),
        notes=tuple(str(n) for n in data.get("notes") or []),
        source=source,
        same=tuple((glob, str(m), str(o)) for glob, aliases in same.items() for m, o in aliases.items()),
        skip=tuple((glob, str(m), str(w)) for glob, reasons in skip.items() for m, w in reasons.items()),
    )


def load_scores(path: Path) -> ScoreSpec:
    """A scoring study from its YAML file; the file name (without .yaml) is its name."""
    return parse_scores(path.stem, read_study_file(path), path)


def package_scores() -> dict[str, Path]:
    """The scoring studies that ship with lmtrain (``conf/study/NAME.yaml`` with a ``scores`` block), by name."""
    return {path.stem: path for path in (CONF_DIR / "study").glob("*.yaml") if declares_scores(path)}


def find_scores(name_or_path: str) -> ScoreSpec | None:
    """The scoring study of this name or YAML path; None when it names none (a training study, or nothing)."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = package_scores().get(name_or_path, Path("/nonexistent"))
    return load_scores(path) if path.is_file() and declares_scores(path) else None
