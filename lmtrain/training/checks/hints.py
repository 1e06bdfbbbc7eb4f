"""Config values against annotated types: does a value fit a parameter's type hint, and how to say the type."""

from __future__ import annotations

import collections.abc as abc
import os
import types
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig

_SEQUENCES = (list, tuple, set, frozenset, abc.Sequence, abc.Iterable, abc.Collection, abc.MutableSequence)
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _arms(hint: Any) -> tuple[Any, ...] | None:
    """The members of a Union (``X | Y`` or ``Optional[X]``); None for any other hint."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return None


def matches(value: Any, hint: Any) -> bool:
    """Whether a (resolved) config value fits ``hint``. Unknown typing constructs match anything; a class
    that is not a plain value type matches a config node (built from its ``_target_``) or a string."""
    if hint is Any or isinstance(hint, (typing.TypeVar, str)):
        return True
    if hint is None or hint is type(None):
        return value is None
    arms = _arms(hint)
    if arms is not None:
        return any(matches(value, arm) for arm in arms)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return _is_number(value)
    if hint is str:
        return isinstance(value, str)
    container = origin or hint
    if container in _SEQUENCES:
        if not isinstance(value, (list, tuple, ListConfig)):
            return False
        if container is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args, strict=True))
        return not args or all(matches(v, args[0]) for v in value)
    if container in _MAPPINGS:
        return isinstance(value, (dict, DictConfig))
    if isinstance(container, type):
        if issubclass(container, (str, os.PathLike)):  # Path
            return isinstance(value, str)
        return isinstance(value, (str, dict, DictConfig, container)) and not isinstance(value, bool)
    return True


def describe(hint: Any) -> str:
    """``hint`` in words: 'an integer', 'a number or null', "one of 'exact', 'classic'", ..."""
    arms = _arms(hint)
    if arms is None:
        arms = (hint,)
    words: list[str] = []
    literals: list[Any] = []
    for arm in arms:
        if typing.get_origin(arm) is typing.Literal:
            literals.extend(typing.get_args(arm))
        else:
            words.append(_word(arm))
    if literals:
        words.insert(0, "one of " + ", ".join(repr(v) for v in literals))
    if "a number" in words and "an integer" in words:
        words.remove("an integer")
    unique = list(dict.fromkeys(words))
    unique.sort(key=lambda w: w == "null")  # null last
    return " or ".join(unique)


def _word(hint: Any) -> str:
    if hint is None or hint is type(None):
        return "null"
    simple = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in simple:
        return simple[hint]
    container = typing.get_origin(hint) or hint
    if container in _SEQUENCES:
        return "a list"
    if container in _MAPPINGS:
        return "a mapping"
    if isinstance(container, type):
        if issubclass(container, (str, os.PathLike)):
            return "a path"
        return f"a {container.__name__}"
    return str(hint)
