"""What Hydra's typed configs cannot check, in one walk of the composed config: keys added with ``+``/``++`` that
no schema has (Hydra adds them; a schema's ``extra_keys`` may admit more), the ranges in the schemas' field
``metadata`` (``lmtrain.common.ranges``), a schema's own rules across keys (``problems``), and the keys of parts
whose class is not lmtrain's (callbacks, loggers) against that class's arguments. Values left ``???`` are found by
OmegaConf (``MissingMandatoryValue``) and named here."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from lmtrain.common.ranges import did_you_mean, value_problems
from lmtrain.common.runtime import Runtime

UNRESOLVED = object()
RUNTIME = {f.name for f in dataclasses.fields(Runtime)}


class ConfigError(ValueError):
    """A config value of the wrong type or range, or a key that no part of lmtrain reads (one line)."""


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError with the first problem of ``cfg`` (one line naming the key and what it must be)."""
    problem = next(config_problems(cfg), None)
    if problem is not None:
        raise ConfigError(problem)


def config_problems(cfg: DictConfig) -> Iterator[str]:
    try:
        OmegaConf.to_container(cfg, resolve=False, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        yield f"{exc.full_key} must be set ({exc.full_key}=...)"
    yield from node_problems(cfg, "")
    yield from tying_problems(cfg)
    for part in ("logger", "callbacks"):
        for name, spec in (cfg.get(part) or {}).items():
            yield from target_problems(spec, f"{part}.{name}")


def node_problems(node: DictConfig, path: str) -> Iterator[str]:
    """Keys that ``node``'s schema lacks, and values outside its fields' ranges; then the typed nodes below."""
    schema = OmegaConf.get_type(node)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return
    fields = {f.name: f for f in dataclasses.fields(schema) if not f.name.startswith("_")}
    owner, extra = schema.extra_keys(node) if hasattr(schema, "extra_keys") else (path, [])
    for key in map(str, node):
        full = f"{path}.{key}" if path else key
        if key.startswith("_"):
            continue
        if key not in fields:
            if path and key in RUNTIME:
                yield f"{full} is set by lmtrain from the data and the model; remove it"
            elif key not in extra:
                present = [str(k) for k in node if str(k) in fields]
                yield unknown_key(full, sorted({*fields, *extra}), owner or "the top level", present if extra else None)
            continue
        value = value_at(node, key)
        if value is not UNRESOLVED:
            yield from value_problems(full, value, None, fields[key].metadata)  # OmegaConf has checked the Enums
        if not OmegaConf.is_interpolation(node, key) and isinstance(node[key], DictConfig):
            yield from node_problems(node[key], full)
    yield from schema.problems(node, path) if hasattr(schema, "problems") else ()  # its rules across keys


def tying_problems(cfg: DictConfig) -> Iterator[str]:
    """``model.tie_weights=true`` with an output strategy that has no class vectors to share (its class says why:
    ``tie_refusal``), or whose options do not fit the tied matrix (its class's ``tie_problems(output, model)``)."""
    model, output = cfg.get("model"), cfg.get("output")
    if not isinstance(model, DictConfig) or not isinstance(output, DictConfig) or not output.get("_target_"):
        return
    if value_at(model, "tie_weights") is not True:
        return
    try:
        cls = get_class(str(output._target_))
    except Exception:  # an output that cannot be imported fails where it is built, naming the import
        return
    refusal = getattr(cls, "tie_refusal", "")
    if refusal:
        name = getattr(cls, "name", cls.__name__)
        yield f"model.tie_weights=true cannot apply to output={name}: {refusal}; set model.tie_weights=false"
    elif hasattr(cls, "tie_problems"):
        yield from cls.tie_problems(output, model)


def target_problems(spec: Any, path: str) -> Iterator[str]:
    """A part built from a class that is not lmtrain's (a logger, a callback): its keys are that class's arguments."""
    if not isinstance(spec, DictConfig) or not spec.get("_target_"):
        yield f"{path} needs a _target_ (the class to build), got {spec!r}"
        return
    try:
        params = inspect.signature(get_class(str(spec._target_))).parameters
    except Exception as exc:  # an import error of any kind: report it as the key's problem
        yield f"{path}._target_={spec._target_} cannot be imported ({str(exc).splitlines()[0]})"
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for key in map(str, spec):
        if not key.startswith("_") and key not in params:
            known = sorted(p for p in params if p != "self")
            yield unknown_key(f"{path}.{key}", known, str(spec._target_), [str(k) for k in spec if str(k) in params])


def unknown_key(full: str, known: list[str], owner: str, present: list[str] | None = None) -> str:
    """'unknown key trainer.max_epoch: did you mean trainer.max_epochs? (trainer has: ...)'.

    Long lists (the Trainer's ~45 arguments) show the keys ``present`` in the config and name the ``owner``."""
    parent, _, key = full.rpartition(".")
    guess = did_you_mean(key, known, (parent + "." if parent else "") + "{}", cutoff=0.6)
    guess = f": {guess}" if guess else ""
    where = parent or "the top level"
    if present is not None and len(known) > 20:
        listed = f"{where} has {', '.join(present)}, or any other argument of {owner}"
    else:
        listed = f"{where} takes {', '.join(known)}"
    return f"unknown key {full}{guess} ({listed})"


def value_at(node: DictConfig, key: str) -> Any:
    """The resolved value of ``key``; UNRESOLVED when it cannot be resolved here (``${hydra:...}`` outside an app)."""
    try:
        return OmegaConf.select(node, key, default=UNRESOLVED, throw_on_missing=True)
    except Exception:  # an interpolation that only resolves inside a Hydra app
        return UNRESOLVED
