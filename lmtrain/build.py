"""Build parts from `_target_` configs, passing only the run-time sizes each constructor accepts."""

from __future__ import annotations

import inspect
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch import Tensor


def accepted(target: str, runtime: dict[str, Any]) -> dict[str, Any]:
    """The subset of `runtime` kwargs that `target`'s __init__ takes.

    A constructor with ``**kwargs`` forwards them to its base class, so the named parameters along the
    class hierarchy count, up to the first constructor without ``**kwargs``.
    """
    names: set[str] = set()
    for cls in get_class(target).__mro__:
        if "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return {k: v for k, v in runtime.items() if k in names}


def build(cfg: DictConfig, **runtime: Any) -> Any:
    """instantiate(cfg) with the run-time kwargs its target accepts; config values win over nothing else."""
    return instantiate(cfg, **accepted(cfg._target_, runtime), _convert_="all")


def build_output(cfg: DictConfig, num_classes: int, dim: int, counts: Tensor, train_ids: Tensor | None = None) -> Any:
    """The sampler (if the config has one) and then the output strategy that uses it. Each gets the run-time
    values its constructor names: ``num_classes``, ``dim``, ``counts`` (training counts per class) and
    ``train_ids`` (the training token stream, e.g. for a bigram proposal)."""
    runtime: dict[str, Any] = {"num_classes": num_classes, "dim": dim, "counts": counts, "train_ids": train_ids}
    sampler_cfg = cfg.get("sampler")
    if sampler_cfg is not None:
        target_params = inspect.signature(get_class(cfg.output._target_).__init__).parameters
        if "sampler" not in target_params:
            raise ValueError(
                f"output {cfg.output._target_.rsplit('.', 1)[-1]} takes no sampler; drop the sampler=... override"
            )
        runtime["sampler"] = build(sampler_cfg, **runtime)
    return build(cfg.output, **runtime)


def needs_train_ids(cfg: DictConfig) -> bool:
    """Whether the output strategy or its sampler is built from the training token stream (``train_ids``)."""
    parts = [part for part in (cfg.output, cfg.get("sampler")) if part is not None]
    return any(accepted(part._target_, {"train_ids": None}) for part in parts)
