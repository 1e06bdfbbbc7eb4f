"""A study's declaration: the runs of its grid (cells x seeds), the metric it reports, how it is compared and drawn.

A study is a YAML file (the package's own in ``conf/study/``, or any file a user passes by path)::

    description: every strategy at m = 100, 1,000 PTB steps
    overrides: [experiment=ptb_study]      # given to every run
    grid:                                  # blocks; each block is the cartesian product of its lists
      - output: [full, unigram, rff]
      - output: [rff]
        sampler.unigram_share: [0]
        seeds: [1]                         # optional: this block's cells run with these seeds only
    seeds: [1, 2, 3]                       # every other cell runs once per seed
    metric: test/ppl                       # test/ppl | val/ppl (the best validation)
    reference: output=full                 # the cell every other is compared with (optional), or
    within: data                           # optional, with reference: compared with the reference cell that has
                                           # the same value of this grid key (one reference per corpus)
    pair: output.shared_negatives=false    # each cell compared with its twin that has this value (optional)
    x: output.num_samples                  # optional: drawn on the x axis (lines), else one bar per cell
    budgets: [1, 2, 4, 7]                  # optional, runs limited by training time: the best val ppl within each
                                           # of these minutes, and the curves against time (summary.md, PNG)
    survey: {...}                          # optional: a table of approaches beside published ratings
                                           # (lmtrain.study.survey, survey.md)

A cell is one combination of a block's values; its label is its overrides joined by commas (``output=rff,
sampler.unigram_share=0``), and a run is a cell with ``seed=S``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmtrain import CONF_DIR

METRICS = ("test/ppl", "val/ppl")


class StudyError(ValueError):
    """A study that cannot be found or whose declaration is malformed (the message names the file and key)."""


@dataclass(frozen=True)
class Cell:
    """One combination of the grid's values: ``(("output", "rff"), ("output.num_samples", "100"))``."""

    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return ",".join(f"{key.lstrip('+')}={value}" for key, value in self.values)

    def overrides(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.values]

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.values if k.lstrip("+") == key), None)


@dataclass(frozen=True)
class Run:
    """A cell with a seed: what one training process trains."""

    cell: Cell
    seed: int

    @property
    def key(self) -> str:
        return f"{self.cell.label},seed={self.seed}"


@dataclass
class StudySpec:
    """A parsed study declaration (see the module docstring for the YAML)."""

    name: str
    description: str
    overrides: list[str]
    cells: list[Cell]
    seeds: list[int]
    metric: str = "test/ppl"
    reference: str | None = None
    within: str | None = None
    pair: str | None = None
    x: str | None = None
    budgets: list[float] | None = None  # training minutes of the equal-time summary (summary.md), if any
    source: Path | None = None
    notes: list[str] = field(default_factory=list)
    cell_seeds: dict[Cell, list[int]] = field(default_factory=dict)  # a block's own seeds, where it names them
    survey: dict[str, Any] | None = None  # the survey table's declaration (lmtrain.study.survey), if any

    def reference_of(self, cell: Cell) -> Cell | None:
        """The declared reference cell that ``cell`` is compared with: the one with the reference's values and, with
        ``within``, the same value of that key as ``cell``."""
        if self.reference is None:
            return None
        wanted = dict(pair.split("=", 1) for pair in self.reference.split(","))
        if self.within:
            wanted[self.within] = cell.get(self.within) or ""
        return next((c for c in self.cells if {k.lstrip("+"): v for k, v in c.values} == wanted), None)

    def seeds_of(self, cell: Cell) -> list[int]:
        """The seeds a cell runs with: its block's, else the study's."""
        return self.cell_seeds.get(cell, self.seeds)

    def runs(self) -> list[Run]:
        return [Run(cell, seed) for cell in self.cells for seed in self.seeds_of(cell)]


def _value(value: Any) -> str:
    """A YAML value as Hydra's override syntax writes it (booleans lower case, null as null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_spec(name: str, data: dict[str, Any], source: Path | None = None) -> StudySpec:
    """Check and parse one declaration; errors name the file and the key."""
    where = f"study {name}" + (f" ({source})" if source else "")
    known = {"description", "overrides", "grid", "seeds", "metric", "reference", "within", "pair", "x", "budgets"}
    known |= {"notes", "survey"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    if not isinstance(data.get("grid"), list) or not data["grid"]:
        raise StudyError(f"{where}: 'grid' must be a list of blocks, each a mapping of key -> list of values")
    cells: list[Cell] = []
    cell_seeds: dict[Cell, list[int]] = {}
    for block in data["grid"]:
        if not isinstance(block, dict) or not all(isinstance(v, list) and v for v in block.values()):
            raise StudyError(f"{where}: each grid block maps override keys to non-empty lists, got {block!r}")
        block = dict(block)
        block_seeds = _seeds(block.pop("seeds", None), where) if "seeds" in block else None
        keys = list(block)
        for combo in itertools.product(*(block[k] for k in keys)):
            cell = Cell(tuple((k, _value(v)) for k, v in zip(keys, combo, strict=True)))
            if cell not in cells:
                cells.append(cell)
            if block_seeds is not None:
                cell_seeds[cell] = block_seeds
    seeds = _seeds(data.get("seeds", [1, 2, 3]), where)
    metric = data.get("metric", "test/ppl")
    if metric not in METRICS:
        raise StudyError(f"{where}: metric must be one of {', '.join(METRICS)}, got {metric!r}")
    reference, within = data.get("reference"), data.get("within")
    if within is not None and (reference is None or within not in {k.lstrip("+") for c in cells for k, _ in c.values}):
        raise StudyError(f"{where}: 'within' names a grid key and needs a 'reference'")
    labels = {c.label for c in cells}
    if within is not None:  # the reference's values, completed by each value of the within key
        labels = {",".join(p for p in c.label.split(",") if not p.startswith(f"{within}=")) for c in cells}
    if reference is not None and reference not in labels:
        raise StudyError(f"{where}: reference {reference!r} is not a cell of the grid")
    pair = data.get("pair")
    if pair is not None and (reference is not None or "=" not in str(pair)):
        raise StudyError(f"{where}: 'pair' is KEY=VALUE (a grid value), and excludes 'reference'")
    budgets = data.get("budgets")
    if budgets is not None and (
        not isinstance(budgets, list) or not budgets or not all(isinstance(b, int | float) and b > 0 for b in budgets)
    ):
        raise StudyError(f"{where}: 'budgets' must be a list of positive training minutes, got {budgets!r}")
    return StudySpec(
        name=name,
        description=str(data.get("description", "")),
        overrides=[str(o) for o in data.get("overrides", [])],
        cells=cells,
        seeds=seeds,
        metric=metric,
        reference=reference,
        within=within,
        pair=None if pair is None else str(pair),
        x=data.get("x"),
        budgets=None if budgets is None else [float(b) for b in budgets],
        source=source,
        notes=[str(n) for n in data.get("notes", [])],
        cell_seeds=cell_seeds,
        survey=data.get("survey"),
    )


def _seeds(seeds: Any, where: str) -> list[int]:
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise StudyError(f"{where}: 'seeds' must be a list of integers")
    return seeds


def read_study_file(path: Path) -> dict[str, Any]:
    """A study file's YAML mapping (a training or a scoring study); one line naming the file when it is not one."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise StudyError(f"cannot read study {path}: {err}") from err
    if not isinstance(data, dict):
        raise StudyError(f"study {path} must be a YAML mapping")
    return data


def load_spec(path: Path) -> StudySpec:
    """A study from its YAML file; the file name (without .yaml) is its name."""
    return parse_spec(path.stem, read_study_file(path), path)


def package_studies() -> dict[str, Path]:
    """The training studies that ship with lmtrain (``conf/study/NAME.yaml``), by name; the scoring studies there
    (a ``scores`` block in place of the grid) are ``lmtrain.study.scores.package_scores``."""
    paths = (CONF_DIR / "study").glob("*.yaml")
    return {path.stem: path for path in paths if "scores" not in (yaml.safe_load(path.read_text()) or {})}


def find_spec(name_or_path: str) -> StudySpec:
    """A package study by name, or a user's study by the path of its YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise StudyError(f"study file {path} does not exist")
        return load_spec(path)
    known = package_studies()
    if name_or_path not in known:
        raise StudyError(
            f"unknown study {name_or_path!r}: one of {', '.join(sorted(known))}, or the path of a study YAML file"
        )
    return load_spec(known[name_or_path])
