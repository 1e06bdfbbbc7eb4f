"""What an options dataclass declares besides its defaults, and the one check of it: a field's choices are an Enum
(``Choice``, which OmegaConf checks as a config is composed), its range is ``metadata`` (``at_least``, ``above``,
``below``, ``at_most``, ``batches``, or ``choices`` for the few fields whose values mix strings and booleans).
``lmtrain.config.validate`` runs ``value_problems`` over a composed config, naming the config key; ``Checked`` runs
it over an options dataclass built in Python, so a class built without a config is held to the same ranges and no
constructor checks them again."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

AT_LEAST_1: Mapping[str, int] = MappingProxyType({"at_least": 1})  # a count or a size: 1 or more


class Choice(str, enum.Enum):
    """The choices of a field: a str Enum, so a config (YAML or the command line) names a member by its name and code
    compares it with plain strings; members print as their value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclasses.dataclass
class Checked:
    """The base of an options dataclass: building one checks every field's value (``value_problems``) and refuses
    the first problem with a one-line ValueError naming the field."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            problem = next(value_problems(f.name, getattr(self, f.name), hints.get(f.name), f.metadata), None)
            if problem is not None:
                raise ValueError(problem)


def arms(hint: Any) -> tuple[Any, ...]:
    """The types of a union annotation (``int | None``: int, NoneType); the annotation itself otherwise."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def enum_of(hint: Any) -> type[enum.Enum] | None:
    """The Enum of a field annotated ``E`` or ``E | None``; None for any other annotation."""
    return next((arm for arm in arms(hint) if isinstance(arm, type) and issubclass(arm, enum.Enum)), None)


def did_you_mean(value: Any, options: Any, shown: str = "{!r}", n: int = 1, cutoff: float = 0.7) -> str:
    """ "did you mean 'mean'?" when a string ``value`` is close to one of the string ``options`` (each guess shown
    with the format ``shown``; up to ``n`` of them, joined by "or"), else ''."""
    names = [str(o) for o in options if isinstance(o, str)]
    close = difflib.get_close_matches(value, names, n=n, cutoff=cutoff) if isinstance(value, str) else []
    return f"did you mean {' or '.join(shown.format(c) for c in close)}?" if close else ""


def choices_of(hint: Any, limits: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The values a field may take: its Enum's (and None where the annotation allows it), or its ``choices``."""
    options = enum_of(hint)
    if options is None:
        return limits.get("choices")
    optional = type(None) in typing.get_args(hint)
    return (*(member.value for member in options), *((None,) if optional else ()))


def value_problems(label: str, value: Any, hint: Any, limits: Mapping[str, Any]) -> Iterator[str]:
    """``value`` of the field ``label`` against its choices (``choices_of``) and its range (``limits``)."""
    if value == "???":  # OmegaConf's MISSING: a key with no default that must be given
        yield f"{label} must be set"
        return
    allowed = choices_of(hint, limits)
    plain = value.value if isinstance(value, enum.Enum) else value
    if allowed is not None and not any(plain == c and type(plain) is type(c) for c in allowed):
        message = f"{label} must be one of {', '.join(repr(c) for c in allowed)}, got {plain!r}"
        yield message + (f"; {guess}" if (guess := did_you_mean(plain, allowed)) else "")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if "at_least" in limits and value < limits["at_least"]:
        yield f"{label} must be >= {limits['at_least']}{limits.get('note', '')}, got {value!r}"
    if "above" in limits and not value > limits["above"]:
        yield f"{label} must be > {limits['above']}, got {value!r}"
    if "below" in limits and not value < limits["below"]:
        yield f"{label} must be < {limits['below']}, got {value!r}"
    if "at_most" in limits and not value <= limits["at_most"]:
        yield f"{label} must be <= {limits['at_most']}, got {value!r}"
    if "batches" in limits:
        least = limits["batches"]
        if isinstance(value, int) and value < least:
            yield f"{label} must be a number of batches >= {least} or a fraction of the epoch, got {value!r}"
        if isinstance(value, float) and not (0.0 <= value <= 1.0 if least == 0 else 0.0 < value <= 1.0):
            yield f"{label} must be a fraction of the epoch in (0, 1] or an integer number of batches, got {value!r}"


def require_choice(options: type, key: str, value: Any, label: str) -> None:
    """Refuse a ``value`` of ``options``' field ``key`` outside its choices: a one-line ``ValueError`` naming the
    config key ``label``, for a builder that code calls with loose values (the config check refuses it first when
    the value comes from a config)."""
    limits = next(f.metadata for f in dataclasses.fields(options) if f.name == key)
    hint = typing.get_type_hints(options)[key]
    problem = next(value_problems(label, value, hint, {"choices": limits.get("choices")}), None)
    if problem is not None:
        raise ValueError(problem)
