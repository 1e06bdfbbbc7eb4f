"""Hydra's ConfigStore, derived from what the parts declare (``lmtrain.common.part``): nothing here names a part.

Importing the part packages (``lmtrain.data``, ``.model``, ``.sampler``, ``.output``) defines every ``Part``; each
one with a ``name`` gets its typed schema ``schema/GROUP/NAME`` (its ``Options`` with ``_target_``, the class's own
module path, and the defaults only a config has: a field's ``metadata["follows"]`` becomes ``${...}``, e.g. an
output's ``init_range`` follows ``model.init_range``) and its option ``GROUP=NAME`` (the schema and the options of
other groups it comes with, ``companions``). A YAML file of the packaged tree is a preset: it extends a schema or an
option (``conf/output/unigram.yaml``: ``- sampled`` and ``sampler=unigram``); one named like a part would stand for
its option. The top level, ``optim`` and ``trainer`` are options dataclasses that build no part of
lmtrain's; their YAML files are presets too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import typing
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import II

import lmtrain
from lmtrain.common.optim_options import OptimOptions
from lmtrain.common.part import Part
from lmtrain.common.run_options import RunConfig
from lmtrain.common.trainer_options import TrainerOptions
from lmtrain.output.cache import CacheOptions

PART_GROUPS = ("data", "model", "sampler", "output")  # the groups whose options are lmtrain's classes
# schemas that a release renamed, under their old names for one more release (a user's YAML may extend them);
# ``lmtrain.cli.callback`` names the new one when a run uses an old one
RENAMED = {
    "schema/output/cosine": "schema/output/rff",
    "schema/output/absolute": "schema/output/quadratic",
    "schema/data/folder": "schema/data/text",
}


@functools.cache
def parts() -> tuple[type[Part], ...]:
    """Every part class with a name, found by importing the part packages and walking ``Part``'s subclasses."""
    for group in PART_GROUPS:
        package = importlib.import_module(f"lmtrain.{group}")
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    found, todo = set(), list(Part.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "name" in vars(cls):
            found.add(cls)
    return tuple(sorted(found, key=lambda cls: (cls.group, cls.name)))


def schema_of(cls: type[Part]) -> type:
    """``cls.Options`` with the class to build (``_target_``: its own module path, whatever its package exports) and,
    for a field with ``metadata["follows"]``, the config's default ``${...}`` in place of the Python default (the key
    keeps its place and its range)."""
    hints, field = typing.get_type_hints(cls.Options), dataclasses.field
    fields: list[Any] = [("_target_", str, field(default=f"{cls.__module__}.{cls.__qualname__}"))]
    links = [f for f in dataclasses.fields(cls.Options) if "follows" in f.metadata]
    fields += [(f.name, hints[f.name], field(default=II(f.metadata["follows"]), metadata=f.metadata)) for f in links]
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields, bases=(cls.Options,))


def option_of(cls: type[Part]) -> dict[str, Any]:
    """The node of ``GROUP=NAME``: the part's schema and the options of other groups it comes with."""
    companions = [{f"override /{group}@_global_.{group}": name} for group, name in cls.companions.items()]
    return {"defaults": [{f"/schema/{cls.group}@_here_": cls.name}, *companions, "_self_"]}


def choices(group: str) -> list[str]:
    """The options of ``group``: the packaged YAML presets and the parts of that group."""
    presets = {path.stem for path in (lmtrain.CONF_DIR / group).glob("*.yaml")}
    return sorted(presets | {cls.name for cls in parts() if cls.group == group})


def run_schema() -> type:
    """The top level (``RunConfig``) with its ``eval`` block typed: ``eval.cache``, the neural cache's options
    (``lmtrain/output/cache.py``), which lmtrain.common cannot import."""
    block = dataclasses.make_dataclass(
        "EvalConfig", [("cache", CacheOptions, dataclasses.field(default_factory=CacheOptions))]
    )
    evaluation = dataclasses.field(default_factory=block)
    return dataclasses.make_dataclass("RunConfigSchema", [("eval", block, evaluation)], bases=(RunConfig,))


def register() -> None:
    """Store every schema as ``schema/GROUP/NAME`` (the top level as ``schema/train``) and every part's option as
    ``GROUP/NAME``, unless a packaged YAML preset of that name stands for it (idempotent)."""
    store = ConfigStore.instance().store
    schemas: dict[str, Any] = {"train": run_schema(), "optim/optim": OptimOptions, "trainer/trainer": TrainerOptions}
    for cls in parts():
        schemas[f"{cls.group}/{cls.name}"] = schema_of(cls)
        if not (lmtrain.CONF_DIR / cls.group / f"{cls.name}.yaml").is_file():
            store(group=cls.group, name=cls.name, node=option_of(cls))
    # lmtrain's sweeper (conf/train.yaml's hydra/sweeper): Hydra's basic one, scoping sampler keys (cli/sweep.py)
    sweeper = {"_target_": "hydra_plugins.lmtrain_sweeper.scoped_sweeper.ScopedSweeper", "max_batch_size": None}
    store(group="hydra/sweeper", name="lmtrain", node={**sweeper, "params": None}, provider="lmtrain")
    for old, new in RENAMED.items():
        schemas[old.removeprefix("schema/")] = schemas[new.removeprefix("schema/")]
    for path, node in schemas.items():
        group, _, name = f"schema/{path}".rpartition("/")
        store(group=group, name=name, node=node)
