"""Hydra's composition errors as one line that names the key: what its value must be, the closest existing key,
the options of a group, and which strategies take a sampler option."""

from __future__ import annotations

import enum
import os
import re
import typing
from collections.abc import Callable
from typing import Any

from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from lmtrain.common.ranges import arms, did_you_mean, enum_of
from lmtrain.config.validate import unknown_key

Compose = Callable[..., DictConfig]  # compose(overrides, hydra=False): train.yaml with these overrides


def explain(exc: BaseException, overrides: list[str], compose: Compose) -> str:
    """``exc``, raised by Hydra or OmegaConf while composing ``overrides``, in one line."""
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        options = ", ".join(sorted(exc.options))
        if guess := did_you_mean(name, sorted(exc.options), f"{group}={{}}"):  # as a misspelt key gets its own
            return f"unknown {group} '{name}': {guess} (choose one of {options})"
        return f"unknown {group} '{name}': choose one of {options}"
    cause = innermost(exc)
    full_key = getattr(cause, "full_key", None)
    if isinstance(cause, ValidationError) and full_key:
        hint = field_type(cause.object_type, str(cause.key))
        if hint is not None:
            guess = did_you_mean(cause.value, [m.value for m in enum_of(hint) or ()])
            return f"{full_key} must be {describe(hint)}, got {cause.value!r}" + (f"; {guess}" if guess else "")
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and isinstance(cause.parent_node, DictConfig):
        culprit = [o for o in overrides if key_of(o) == full_key or key_of(o).startswith(f"{full_key}.")]
        if str(full_key).startswith("sampler.") and culprit:
            return sampler_option(str(full_key), [o for o in overrides if o not in culprit], compose)
        return missing_key(str(full_key), cause.parent_node, culprit)
    return one_line(exc) + package_line_hint(one_line(exc))


def package_line_hint(message: str) -> str:
    """Where the package line must stand, when a file's ``override /GROUP`` fails because Hydra read the file
    under its own package (no ``# @package _global_`` on its first line)."""
    found = re.match(r"In '([\w/.-]+)': Could not override '[\w.]+@", message)
    first_line = "its first line must be '# @package _global_'; Hydra ignores a package line below any other line"
    return "" if found is None else f" ({found.group(1)}.yaml sets other groups: {first_line}, a comment included)"


def missing_key(full_key: str, node: DictConfig, culprit: list[str]) -> str:
    """A key that ``node`` (its parent in the config Hydra composed) lacks: the keys beside it, or how to add an
    argument of the class the node builds that the config leaves out."""
    parent, _, leaf = full_key.rpartition(".")
    known = [str(k) for k in node if not str(k).startswith("_")]
    schema = OmegaConf.get_type(node)
    owner, extra = schema.extra_keys(node) if hasattr(schema, "extra_keys") else (parent, [])
    if leaf in extra and culprit:
        return f"{full_key} is an argument of {owner} that the config does not set: add it with +{culprit[0]}"
    return unknown_key(full_key, sorted({*known, *extra}), owner, known)


def sampler_option(key: str, others: list[str], compose: Compose) -> str:
    """``sampler.KEY`` that the chosen strategy's sampler lacks: a close key, or the strategies that take it."""
    option, top = key.split(".", 1)[1], key.split(".")[1]
    others = [o for o in others if not key_of(o).startswith("sampler.")]  # another sampler key may not fit either
    reference = compose(others, hydra=True)
    output = reference.hydra.runtime.choices.get("output")
    known = sorted(str(k) for k in (reference.get("sampler") or {}) if not str(k).startswith("_"))
    takers = sampler_takers(top, others, compose)
    if not takers and known:  # no strategy's sampler has it: a typo of one of the chosen sampler's keys
        hint = did_you_mean(top, known, "sampler.{}", n=3, cutoff=0.6)
        return f"sampler.{option} is not an option of any sampler; {hint or 'the options: ' + ', '.join(known)}"
    return f"sampler.{option} is not an option of output={output}; " + (
        f"it applies to output={'|'.join(takers)}" if takers else "no sampler takes it"
    )


def sampler_takers(top: str, others: list[str], compose: Compose) -> list[str]:
    """The outputs whose sampler has the key ``top`` (each composed with ``others``, its output and sampler left
    out)."""
    from hydra.core.global_hydra import GlobalHydra

    others = [o for o in others if key_of(o) not in ("output", "sampler")]
    outputs = GlobalHydra.instance().config_loader().get_group_options("output")
    return [o for o in outputs if top in (compose([*others, f"output={o}"]).get("sampler") or {})]


def innermost(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def field_type(schema: Any, key: str) -> Any:
    """The annotated type of ``schema``'s field ``key`` (None when ``schema`` is not a dataclass with it)."""
    try:
        return typing.get_type_hints(schema).get(key)
    except (TypeError, NameError):  # not a class with annotations
        return None


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def one_line(exc: Any) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines) if lines else type(exc).__name__


def describe(hint: Any) -> str:
    """``hint`` in words: 'an integer', 'a number or null', 'true or false', ..."""
    words = list(dict.fromkeys(_word(arm) for arm in arms(hint)))
    if "a number" in words and "an integer" in words:
        words.remove("an integer")
    words.sort(key=lambda w: w == "null")  # null last
    return " or ".join(words)


def _word(hint: Any) -> str:
    if hint is None or hint is type(None):
        return "null"
    simple = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Any: "any value"}
    if hint in simple:
        return simple[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(member.value) for member in hint)
    container = typing.get_origin(hint) or hint
    if container in (list, tuple):
        return "a list"
    if container is dict or (isinstance(container, type) and not issubclass(container, (str, os.PathLike))):
        return "a mapping"
    return str(hint)
