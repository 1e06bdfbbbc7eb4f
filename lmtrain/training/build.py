"""Building a part from its config: ``instantiate(cfg)`` plus the run-time values its class declares.

Every part class names the values it takes from the data and the model in ``runtime_args`` (``num_classes``,
``dim``, ``counts``, ``train_ids``, ``sampler``); the config holds everything else (``lmtrain/config/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch import Tensor


@dataclass
class Runtime:
    """The values lmtrain passes to constructors at run time (from the data and the model), never read from the
    config: the vocabulary size, the hidden size, the training counts and token stream, the built sampler."""

    num_classes: int
    dim: int = 0
    counts: Tensor | None = None
    train_ids: Tensor | None = None
    sampler: Any = None


def runtime_args(target: str) -> tuple[str, ...]:
    """The run-time values the class ``target`` declares (``runtime_args``; none when it declares nothing)."""
    return tuple(getattr(get_class(target), "runtime_args", ()))


def build(cfg: DictConfig, runtime: Runtime, **resolved: Any) -> Any:
    """The part ``cfg`` describes: its ``_target_`` built from the config (with the ``resolved`` values in place of
    the config's, e.g. a ``sparse_embedding: auto``) and the run-time values its class declares."""
    values = {name: getattr(runtime, name) for name in runtime_args(str(cfg._target_))}
    return instantiate(cfg, **values, **resolved, _convert_="all")


def build_output(cfg: DictConfig, num_classes: int, dim: int, counts: Tensor, train_ids: Tensor | None = None) -> Any:
    """The sampler (if the config has one) and then the output strategy that uses it."""
    runtime = Runtime(num_classes, dim, counts, train_ids)
    if cfg.get("sampler") is not None:
        if "sampler" not in runtime_args(str(cfg.output._target_)):
            raise ValueError(
                f"output {cfg.output._target_.rsplit('.', 1)[-1]} takes no sampler; drop the sampler=... override"
            )
        runtime.sampler = build(cfg.sampler, runtime)
    return build(cfg.output, runtime)


def needs_train_ids(cfg: DictConfig) -> bool:
    """Whether the output strategy or its sampler is built from the training token stream (``train_ids``)."""
    parts = [part for part in (cfg.output, cfg.get("sampler")) if part is not None]
    return any("train_ids" in runtime_args(str(part._target_)) for part in parts)
