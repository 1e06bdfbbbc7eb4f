"""Every default is written once, in an options dataclass: the config of a part is its options with the class to
build (``lmtrain.config.schema``), a YAML preset sets only what differs from what it extends, and no constructor of
the part packages restates an option's default. Each check is shown to fail on a restated default."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from lmtrain.common.part import NoOptions, Part
from lmtrain.common.ranges import Checked
from lmtrain.config import CONF_DIR, choices
from lmtrain.config.schema import PART_GROUPS, parts
from tests.conftest import make_config

PARTS = [pytest.param(cls, id=f"{cls.group}={cls.name}") for cls in parts()]
PRESET_GROUPS = ("data", "sampler", "output", "optim", "trainer")
PRESETS = [(g, p.stem) for g in PRESET_GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def compose_part(group: str, choice: str, resolve: bool = False) -> dict[str, Any]:
    """The composed node of ``group=choice`` as plain values (a sampler beside the sampled softmax, a folder for
    data=text)."""
    overrides = [f"{group}={choice}", "run_dir=/tmp/unused"] + (["data.path=/tmp/x"] if choice == "text" else [])
    overrides = ["output=sampled", *overrides] if group == "sampler" else overrides
    cfg = make_config(overrides)
    return OmegaConf.to_container(cfg[group], resolve=resolve, enum_to_str=True)


def plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def config_defaults(options: type) -> dict[str, Any]:
    """What a config of ``options`` holds before any YAML: each field's default, or ``${...}`` where the field
    follows another key (``metadata["follows"]``)."""
    defaults = {}
    for f in dataclasses.fields(options):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        defaults[f.name] = f"${{{f.metadata['follows']}}}" if "follows" in f.metadata else plain(value)
    return defaults


@pytest.mark.parametrize("cls", PARTS)
def test_a_parts_config_is_its_options_and_its_class(cls):
    """GROUP=NAME composes to the part's options dataclass defaults, its ``_target_`` and nothing else: no schema,
    YAML or store entry restates a default (the bias_init trap: output=nce's log_unigram is NCEOptions' own)."""
    if (CONF_DIR / cls.group / f"{cls.name}.yaml").is_file():
        pytest.skip("a YAML preset stands for this option (test_no_yaml_key_restates_the_default_below_it)")
    composed = compose_part(cls.group, cls.name)
    assert composed.pop("_target_") == f"{cls.__module__}.{cls.__qualname__}"  # no export needed
    assert composed == config_defaults(cls.Options) | ({"path": "/tmp/x"} if cls.name == "text" else {})
    assert cls.name in choices(cls.group)


def part(group: str, name: str) -> type[Part]:
    return next(cls for cls in parts() if (cls.group, cls.name) == (group, name))


BUILT = [p for p in PARTS if p.values[0].name != "text"]  # data=text needs a folder of files


@pytest.mark.parametrize("cls", BUILT)
def test_a_part_built_in_python_starts_where_its_config_does(cls):
    """Built directly, without options, a part keeps its options dataclass defaults, which are its config's (an
    ``NCE(...)`` built in Python starts its biases at the log unigram, as output=nce does)."""
    import torch

    from lmtrain.sampler.uniform import UniformSampler

    counts, train_ids = torch.arange(40, 0, -1), torch.arange(400) % 40
    runtime = {"num_classes": 40, "dim": 8, "counts": counts, "train_ids": train_ids, "sampler": UniformSampler(40)}
    built = cls(**{k: v for k, v in runtime.items() if k in cls.runtime_args})
    if cls.Options is NoOptions:
        return
    composed = compose_part(cls.group, cls.name, resolve=True)
    follows = {f.name for f in dataclasses.fields(cls.Options) if "follows" in f.metadata}
    kept = {k: plain(v) for k, v in dataclasses.asdict(built.options).items() if k not in follows}
    assert kept == {k: v for k, v in composed.items() if k in kept} and set(kept) | follows | {"_target_"} == set(
        composed
    )


def yaml_chain(group: str, name: str) -> tuple[DictConfig, list[DictConfig]]:
    """(the schema node at the root of ``group=name``, the YAML bodies from the root down to ``name``): a preset
    extends a schema (``- /schema/GROUP@_here_: NAME``), a derived option or another preset (``- sampled``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.is_file():  # a part's derived option: its schema
        return ConfigStore.instance().load(f"schema/{group}/{name}.yaml").node, []
    body = OmegaConf.load(path)
    for entry in body.pop("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            schema, bodies = yaml_chain(group, entry)
            return schema, [*bodies, body]
        if isinstance(entry, DictConfig) and str(next(iter(entry))).startswith("/schema/"):
            ((key, value),) = entry.items()
            return ConfigStore.instance().load(f"{str(key)[1:].split('@')[0]}/{value}.yaml").node, [body]
    raise AssertionError(f"conf/{group}/{name}.yaml extends no schema and no option")


def leaves(node: DictConfig, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, unresolved value) of every leaf of ``node``."""
    for key in node:
        full = f"{path}.{key}" if path else str(key)
        if not OmegaConf.is_interpolation(node, str(key)) and isinstance(node[key], DictConfig):
            yield from leaves(node[key], full)
        else:
            yield full, plain(OmegaConf.to_container(node, resolve=False)[key])


def restated(schema: DictConfig, bodies: list[DictConfig]) -> list[str]:
    """The keys of the last YAML body equal to what lies below it (the schema and the bodies it extends)."""
    below = OmegaConf.merge(schema, *bodies[:-1])
    missing = "<absent>"
    return [
        f"{key}: {value!r}"
        for key, value in leaves(bodies[-1])
        if plain(OmegaConf.select(below, key, default=missing, throw_on_resolution_failure=False)) == value
    ]


@pytest.mark.parametrize(("group", "name"), PRESETS, ids=[f"{g}={n}" for g, n in PRESETS])
def test_no_yaml_key_restates_the_default_below_it(group, name):
    schema, bodies = yaml_chain(group, name)
    overrides = [e for e in OmegaConf.load(CONF_DIR / group / f"{name}.yaml").defaults if "override" in str(e)]
    assert bodies[-1] or overrides or name == "default", f"conf/{group}/{name}.yaml sets nothing: a derived option"
    assert not restated(schema, bodies), f"conf/{group}/{name}.yaml restates: {restated(schema, bodies)}"
    expected = OmegaConf.to_container(OmegaConf.merge(schema, *bodies), resolve=False, enum_to_str=True)
    assert compose_part(group, name) == expected


def option_fields(group: str) -> dict[str, set[Any]]:
    """name -> the defaults of that name among the fields of every options dataclass of ``group``'s parts."""
    found: dict[str, set[Any]] = {}
    for cls in parts():
        if cls.group == group:
            for f in dataclasses.fields(cls.Options):
                if f.default is not dataclasses.MISSING:
                    found.setdefault(f.name, set()).add(plain(f.default))
    return found


def classes_of(group: str) -> Iterator[type]:
    package = importlib.import_module(f"lmtrain.{group}")
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        yield from (c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__)


def restated_by_constructors(classes: Iterator[type], fields: dict[str, set[Any]]) -> list[str]:
    """``Class(param=default)`` among ``classes`` where ``param`` is an option and ``default`` its default."""
    found = []
    for cls in classes:
        if dataclasses.is_dataclass(cls) or "__init__" not in vars(cls):
            continue
        for name, param in inspect.signature(cls.__init__).parameters.items():
            default = param.default
            if default is not inspect.Parameter.empty and default in fields.get(name, ()):
                found.append(f"{cls.__qualname__}({name}={default!r})")
    return found


@pytest.mark.parametrize("group", PART_GROUPS)
def test_no_constructor_restates_an_options_default(group):
    """KernelTree(eps=1e-6), RandomFourierFeatures(D=1024), ZipfMarkovSource(mix=0.3): each took its options'
    default again; they take the options dataclass (or its keywords) now."""
    assert not restated_by_constructors(classes_of(group), option_fields(group))


def test_the_checks_see_a_default_written_twice():
    """The helpers find what the tests above must fail on: a constructor default, a restated YAML key, a schema
    default in place of the options' own."""

    class Restating:
        def __init__(self, num_classes: int, D: int = 1024, eps: float = 0.5) -> None: ...

    fields = option_fields("sampler")
    assert fields["D"] == {1024} and 1e-6 in fields["eps"]
    assert restated_by_constructors(iter([Restating]), fields) == [
        "test_the_checks_see_a_default_written_twice.<locals>.Restating(D=1024)"
    ]
    schema = ConfigStore.instance().load("schema/sampler/unigram.yaml").node
    assert restated(schema, [OmegaConf.create({"power": 1.0, "smoothing": 2.0})]) == ["power: 1.0"]
    nce = part("output", "nce")
    assert (
        config_defaults(nce.Options)["bias_init"]
        == "log_unigram"
        != config_defaults(part("output", "sampled").Options)["bias_init"]
    )


def test_the_primary_config_restates_no_top_level_default():
    body = OmegaConf.load(CONF_DIR / "train.yaml")
    schema = ConfigStore.instance().load("schema/train.yaml").node
    restated_keys = [key for key in body if key not in ("defaults", "hydra") and body[key] == schema.get(key)]
    assert not restated_keys, f"conf/train.yaml restates RunConfig's defaults: {restated_keys}"


def test_every_options_dataclass_checks_itself():
    """The options of every part check their ranges when built in Python (``Checked``): no constructor re-checks."""
    assert all(issubclass(cls.Options, Checked) for cls in parts())
    with pytest.raises(ValueError, match="nu must be > 0, got 0"):
        part("sampler", "rff").Options(nu=0)
