"""Range metadata that many options dataclasses share (``field(metadata=...)``, checked by
``lmtrain.config.validate`` before anything is built), and the check of a field's ``choices`` for the builders that
code calls without a config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any

AT_LEAST_1: Mapping[str, int] = MappingProxyType({"at_least": 1})  # a count or a size: 1 or more


def require_choice(options: type, key: str, value: Any, label: str) -> None:
    """Refuse a ``value`` of ``options``' field ``key`` that its ``choices`` metadata does not list: a one-line
    ``ValueError`` naming the config key ``label``. The config check refuses it first when the value comes from a
    config; this is for a builder called directly (scripts, tests)."""
    choices = next(f.metadata["choices"] for f in fields(options) if f.name == key)
    if value not in choices:
        raise ValueError(f"{label} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
