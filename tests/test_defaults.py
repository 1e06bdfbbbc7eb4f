"""Every default is written once: in the part's schema dataclass. Its YAML files name the schema and set only what
differs between the options sharing it, and the class built from the config has no default of its own for a key the
config hands it. Composes every option of the part groups (docs/architecture.md, one source for every default)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from lmtrain.config import CONF_DIR, choices
from tests.conftest import make_config

PARTS = ("model", "sampler", "output", "optim", "data")  # the groups whose YAML keep only what differs
BUILT = ("model", "sampler", "output", "data")  # the groups whose node is lmtrain's class to build (``_target_``)
OPTIONS = [(g, c) for g in PARTS for c in choices(g)]
GIVEN = {("data", "text"): {"path": "/tmp/somewhere"}}  # what an option leaves ``???``, given on the command line
BUILT_OPTIONS = [(g, c) for g in BUILT for c in choices(g)]


def compose_part(group: str, choice: str) -> DictConfig:
    """The composed node of ``group=choice`` (a sampler beside the sampled softmax, which takes any)."""
    overrides = [f"{group}={choice}"]
    if group == "sampler":
        overrides.insert(0, "output=sampled")
    overrides += [f"{group}.{key}={value}" for key, value in GIVEN.get((group, choice), {}).items()]
    return make_config(overrides)[group]


def yaml_chain(group: str, choice: str) -> tuple[str, DictConfig, list[DictConfig]]:
    """(the schema's name, its default node, the YAML bodies from the schema down to ``choice``): a YAML file names
    the schema (``- /schema/GROUP@_here_: NAME``) or an option of its group that it extends (``- sampled``)."""
    body = OmegaConf.load(CONF_DIR / group / f"{choice}.yaml")
    defaults = body.pop("defaults", [])
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_":
            name, schema, bodies = yaml_chain(group, entry)
            return name, schema, [*bodies, body]
        if isinstance(entry, DictConfig):
            ((key, value),) = entry.items()
            if str(key).startswith("/schema/"):
                path = f"{str(key)[1:].split('@')[0]}/{value}.yaml"
                return str(value), ConfigStore.instance().load(path).node, [body]
    raise AssertionError(f"conf/{group}/{choice}.yaml names no schema")


def leaves(node: DictConfig, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, unresolved value) of every leaf of ``node``."""
    for key in node:
        full = f"{path}.{key}" if path else str(key)
        if not OmegaConf.is_interpolation(node, str(key)) and isinstance(node[key], DictConfig):
            yield from leaves(node[key], full)
        else:
            yield full, OmegaConf.to_container(node, resolve=False)[key]


@pytest.mark.parametrize(("group", "choice"), OPTIONS, ids=[f"{g}={c}" for g, c in OPTIONS])
def test_the_composed_part_is_its_schema_with_only_the_yaml_differences(group, choice):
    _, schema, bodies = yaml_chain(group, choice)
    expected = OmegaConf.merge(schema, *bodies, GIVEN.get((group, choice), {}))
    composed = compose_part(group, choice)
    assert OmegaConf.to_container(composed, resolve=False) == OmegaConf.to_container(expected, resolve=False)


@pytest.mark.parametrize(("group", "choice"), OPTIONS, ids=[f"{g}={c}" for g, c in OPTIONS])
def test_no_yaml_key_restates_the_default_below_it(group, choice):
    _, schema, bodies = yaml_chain(group, choice)
    below = OmegaConf.merge(schema, *bodies[:-1])
    restated = [
        f"{key}: {value!r}"
        for key, value in leaves(bodies[-1])
        if OmegaConf.select(below, key, default="<absent>", throw_on_resolution_failure=False) == value
    ]
    assert not restated, f"conf/{group}/{choice}.yaml restates the schema's defaults: {', '.join(restated)}"


# sampler=rff: schema rff; not output=rff (cosine); not the data sources, whose YAML sets the cache folder from the
# environment (LMTRAIN_CACHE_DIR), which their options leave None for a module built by hand
NAMED = [(g, c) for g, c in OPTIONS if yaml_chain(g, c)[0] == c and g != "data"]


@pytest.mark.parametrize(("group", "choice"), NAMED, ids=[f"{g}={c}" for g, c in NAMED])
def test_an_option_named_like_its_schema_is_the_schema(group, choice):
    """Extending a schema (README, your own configs) gives what the option of its name gives: sampler=rff is
    RFFSamplerConfig's defaults, unigram_share and seed included."""
    name, schema, bodies = yaml_chain(group, choice)
    composed = dict(leaves(compose_part(group, choice)))
    defaults = dict(leaves(schema))
    differ = {key: (defaults.get(key), value) for key, value in composed.items() if defaults.get(key) != value}
    assert not differ, f"{group}={choice} differs from schema {name} (schema default, composed): {differ}"
    assert [key for body in bodies for key, _ in leaves(body)] == [], f"conf/{group}/{choice}.yaml sets values"


def constructor_defaults(cls: type, keys: list[str]) -> dict[str, Any]:
    """The keys among ``keys`` that ``cls``'s constructor (or a base's constructor its ``**options`` reach) gives a
    default of its own."""
    found: dict[str, Any] = {}
    left = list(keys)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        for key in [k for k in left if k in params]:
            left.remove(key)
            if params[key].default is not inspect.Parameter.empty:
                found[key] = params[key].default
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return found


@pytest.mark.parametrize(("group", "choice"), BUILT_OPTIONS, ids=[f"{g}={c}" for g, c in BUILT_OPTIONS])
def test_no_constructor_supplies_a_default_the_schema_supplies(group, choice):
    node = compose_part(group, choice)
    keys = [str(k) for k in node if not str(k).startswith("_")]
    twice = constructor_defaults(get_class(str(node._target_)), keys)
    assert not twice, f"{node._target_} restates defaults of the {group} schema: {twice}"


def test_the_checks_see_a_default_written_twice():
    """The helpers find what the tests above must fail on: a restated YAML key, a constructor default."""

    class Restating:
        def __init__(self, num_classes: int, D: int = 1024, **options: Any) -> None: ...

    class Child(Restating):
        def __init__(self, **options: Any) -> None: ...

    assert constructor_defaults(Child, ["D", "eps"]) == {"D": 1024}
    schema = ConfigStore.instance().load("schema/sampler/rff.yaml").node
    assert OmegaConf.select(schema, "D") == 1024 and OmegaConf.select(schema, "unigram_share") == 0.25
    assert OmegaConf.to_container(schema, resolve=False)["seed"] == "${seed}"


def test_the_primary_config_restates_no_top_level_default():
    body = OmegaConf.load(CONF_DIR / "train.yaml")
    schema = ConfigStore.instance().load("schema/train.yaml").node
    restated = [key for key in body if key not in ("defaults", "hydra") and body[key] == schema.get(key)]
    assert not restated, f"conf/train.yaml restates RunConfig's defaults: {restated}"
