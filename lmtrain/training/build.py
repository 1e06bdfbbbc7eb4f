"""Build parts from `_target_` configs, passing only the run-time sizes each constructor accepts."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch import Tensor

# the values lmtrain passes to constructors at run time (from the data and the model), never read from the config
RUNTIME_ARGS = ("num_classes", "dim", "counts", "train_ids", "sampler")


def _hints(function: Any, module: str) -> dict[str, Any]:
    """``function``'s parameter annotations as types; one that cannot be evaluated is ``Any``."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # e.g. a name imported only for type checkers: evaluate the annotations one by one
        names = vars(sys.modules[module]) if module in sys.modules else {}
        hints = {}
        for name, param in inspect.signature(function).parameters.items():
            annotation = param.annotation
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, dict(names))  # noqa: S307 (the library's own annotation)
                except Exception:
                    annotation = Any
            hints[name] = Any if annotation is inspect.Parameter.empty else annotation
        return hints


def constructor_params(cls: type) -> tuple[dict[str, Any], bool]:
    """The keyword parameters ``cls(...)`` takes, with their annotated types, and whether it takes any keyword.

    A constructor with ``**kwargs`` forwards them to its base class, so the named parameters along the
    class hierarchy count, up to the first constructor without ``**kwargs``; open is True when there is none.
    A class whose ``Options`` is a dataclass (the sampled strategies) takes that dataclass's fields as its
    ``**options``.
    """
    params: dict[str, Any] = {}
    options = getattr(cls, "Options", None)
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        signature = inspect.signature(klass.__init__).parameters
        hints = _hints(klass.__init__, klass.__module__)
        for name, param in signature.items():
            if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                params.setdefault(name, hints.get(name, Any))
        if not any(p.kind is p.VAR_KEYWORD for p in signature.values()):
            return params, False
        if isinstance(options, type) and dataclasses.is_dataclass(options):
            option_hints = typing.get_type_hints(options)
            return {**params, **{f.name: option_hints[f.name] for f in dataclasses.fields(options)}}, False
    return params, True


def accepted(target: str, runtime: dict[str, Any]) -> dict[str, Any]:
    """The subset of `runtime` kwargs that `target`'s __init__ takes (see :func:`constructor_params`)."""
    names = constructor_params(get_class(target))[0]
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
