"""Walking a config node: unknown keys (with the nearest ones), values against their readers' type hints."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from lmtrain.training.build import RUNTIME_ARGS, constructor_params
from lmtrain.training.checks.hints import describe, matches
from lmtrain.training.optim import OptimOptions, torch_optimizer
from lmtrain.training.schedule import ScheduleOptions

UNRESOLVED = object()


class ConfigError(ValueError):
    """A config value of the wrong type or range, or a key that no part of lmtrain reads."""


def missing_keys(node: DictConfig, path: str = "") -> Iterator[str]:
    """Dotted keys whose value is ``???`` (without resolving interpolations, unlike OmegaConf.missing_keys)."""
    for key in node:
        full = f"{path}.{key}" if path else str(key)
        if OmegaConf.is_missing(node, key):
            yield full
        elif not OmegaConf.is_interpolation(node, key) and isinstance(node[key], DictConfig):
            yield from missing_keys(node[key], full)


def dataclass_hints(cls: type) -> dict[str, Any]:
    return {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls)}


def optim_node(node: DictConfig) -> Iterator[str]:
    params = dataclass_hints(OptimOptions)
    optimizer = torch_optimizer(str(node.get("name")))
    if optimizer is not None:
        extra, _ = constructor_params(optimizer)
        params = {**{k: v for k, v in extra.items() if k != "params"}, **params}
    yield from plain_node(node, "optim", params, f"optim={node.get('name')}", skip=("schedule",))
    if isinstance(node.get("schedule"), DictConfig):
        yield from plain_node(node.schedule, "optim.schedule", dataclass_hints(ScheduleOptions), "optim.schedule")


def target_node(node: Any, path: str) -> Iterator[str]:
    if not isinstance(node, DictConfig) or not node.get("_target_"):
        yield f"{path} needs a _target_ (the class to build), got {node!r}"
        return
    try:
        cls = get_class(str(node._target_))
    except Exception as exc:
        yield f"{path}._target_={node._target_} cannot be imported ({str(exc).splitlines()[0]})"
        return
    params, takes_any = constructor_params(cls)
    for key in node:
        if str(key) in RUNTIME_ARGS and path != "trainer":
            yield f"{path}.{key} is set by lmtrain from the data and the model; remove it"
    params = {k: v for k, v in params.items() if k not in RUNTIME_ARGS or path == "trainer"}
    yield from plain_node(node, path, params, str(node._target_), takes_any=takes_any)


def plain_node(
    node: DictConfig,
    path: str,
    params: dict[str, Any],
    owner: str,
    skip: tuple[str, ...] = (),
    takes_any: bool = False,
) -> Iterator[str]:
    """Unknown keys and values of the wrong type among ``node``'s keys (except ``skip`` and ``_target_``-like)."""
    for key in node:
        key = str(key)
        full = f"{path}.{key}" if path else key
        if key.startswith("_") or key in skip:
            continue
        if key not in params:
            if not takes_any:
                present = [str(k) for k in node if str(k) in params and not str(k).startswith("_")]
                yield unknown_key(full, sorted(params), owner, present)
            continue
        value = value_at(node, key)
        if value is not UNRESOLVED and not matches(value, params[key]):
            yield f"{full} must be {describe(params[key])}, got {value!r}"


def unknown_key(full: str, known: list[str], owner: str, present: list[str] | None = None) -> str:
    """'unknown key trainer.max_epoch: did you mean trainer.max_epochs? (trainer has: ...)'.

    Long lists (the Trainer's ~45 arguments) show the keys ``present`` in the config and name the ``owner``."""
    parent, _, key = full.rpartition(".")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    guess = f": did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    where = parent or "the top level"
    if present is not None and len(known) > 20:
        listed = f"{where} has {', '.join(present)}, or any other argument of {owner}"
    else:
        listed = f"{where} takes {', '.join(known)}"
    return f"unknown key {full}{guess} ({listed})"


def value_at(node: DictConfig, path: str) -> Any:
    """The resolved value at ``path``; UNRESOLVED when it is missing or cannot be resolved here
    (``${hydra:...}`` outside a Hydra app)."""
    try:
        return OmegaConf.select(node, path, default=UNRESOLVED, throw_on_missing=True)
    except Exception:
        return UNRESOLVED
