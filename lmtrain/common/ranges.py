"""Range metadata that many options dataclasses share (``field(metadata=...)``, checked by
``lmtrain.config.validate`` before anything is built)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

AT_LEAST_1: Mapping[str, int] = MappingProxyType({"at_least": 1})  # a count or a size: 1 or more
