"""Checking a composed config before anything starts: every value has the type and range its reader expects,
and every key is read by some part (a typo added with ``+`` or ``++`` would otherwise be ignored silently).

Where a part is built from ``_target_``, its constructor's signature says which keys exist and their types
(``lightning.Trainer`` for ``trainer``); ``optim`` follows ``OptimOptions`` plus the torch optimizer's
arguments, the top level ``RunOptions``. ``LIMITS`` holds the ranges a type cannot say.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from lmtrain.build import RUNTIME_ARGS, constructor_params
from lmtrain.hints import describe, matches
from lmtrain.optim import OptimOptions, torch_optimizer
from lmtrain.schedule import ScheduleOptions


class ConfigError(ValueError):
    """A config value of the wrong type or range, or a key that no part of lmtrain reads."""


@dataclasses.dataclass
class RunOptions:
    """The top-level keys of lmtrain/conf/train.yaml besides the parts (data, model, output, ...)."""

    seed: int
    ckpt_path: str | None
    group: str | int | float | None
    name: str | int | float | None
    run_dir: str
    checkpoint_every_n_steps: int
    loss_reduction: Literal["mean", "sum"]
    test_after_fit: bool
    callbacks: dict[str, Any] | None
    progress_bar: bool
    reuse_freed_memory: bool
    threads: int | Literal["auto"]


PARTS = ("data", "model", "sampler", "output", "optim", "trainer", "logger", "callbacks")
# Trainer arguments lmtrain sets itself, and what to use instead
SET_BY_LMTRAIN = {
    "logger": "choose logger=wandb or logger=csv",
    "callbacks": "add a callback with +callbacks.NAME._target_=CLASS",
    "default_root_dir": "the run folder is hydra.run.dir",
    "plugins": "its checkpoints are written atomically by lmtrain",
    "enable_progress_bar": "use progress_bar=true|false",
    "gradient_clip_val": "use optim.clip (the global gradient norm, sparse gradients included)",
    "gradient_clip_algorithm": "use optim.clip (the global gradient norm, sparse gradients included)",
}
Check = Callable[[float], "str | None"]


def at_least(low: float, note: str = "") -> Check:
    return lambda v: None if v >= low else f"must be >= {low}{note}"


def above(low: float) -> Check:
    return lambda v: None if v > low else f"must be > {low}"


def below(high: float) -> Check:
    return lambda v: None if v < high else f"must be < {high}"


def count_or_fraction(least: int) -> Check:
    """An integer number of batches >= least, or a float fraction of the epoch in (0, 1] (or [0, 1] for least 0)."""

    def check(v: float) -> str | None:
        if isinstance(v, int):
            return None if v >= least else f"must be a number of batches >= {least} or a fraction of the epoch"
        ok = 0.0 <= v <= 1.0 if least == 0 else 0.0 < v <= 1.0
        return None if ok else "must be a fraction of the epoch in (0, 1] or an integer number of batches"

    return check


LIMITS: dict[str, tuple[Check, ...]] = {
    "trainer.max_epochs": (at_least(-1, " (-1: no limit)"),),
    "trainer.min_epochs": (at_least(0),),
    "trainer.max_steps": (at_least(-1, " (-1: no limit)"),),
    "trainer.min_steps": (at_least(0),),
    "trainer.log_every_n_steps": (at_least(1),),
    "trainer.check_val_every_n_epoch": (at_least(1),),
    "trainer.num_sanity_val_steps": (at_least(-1, " (-1: all batches)"),),
    "trainer.accumulate_grad_batches": (at_least(1),),
    "trainer.num_nodes": (at_least(1),),
    "trainer.val_check_interval": (count_or_fraction(1),),
    "trainer.limit_train_batches": (count_or_fraction(0),),
    "trainer.limit_val_batches": (count_or_fraction(0),),
    "trainer.limit_test_batches": (count_or_fraction(0),),
    "checkpoint_every_n_steps": (at_least(1),),
    "optim.lr": (above(0),),
    "optim.clip": (above(0),),
    "optim.weight_decay": (at_least(0),),
    "optim.schedule.decay": (above(0),),
    "optim.schedule.start": (at_least(0),),
    "optim.schedule.patience": (at_least(0),),
    "model.emb_dim": (at_least(1),),
    "model.hidden_dim": (at_least(1),),
    "model.num_layers": (at_least(1),),
    "model.dropout": (at_least(0), below(1)),
    "model.init_range": (above(0),),
    "data.batch_size": (at_least(1),),
    "data.eval_batch_size": (at_least(1),),
    "data.bptt": (at_least(1),),
    "output.num_samples": (at_least(1),),
}
_UNRESOLVED = object()


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError with the first problem of ``cfg`` (one line naming the key and what it must be)."""
    problem = next(config_problems(cfg), None)
    if problem is not None:
        raise ConfigError(problem)


def config_problems(cfg: DictConfig) -> Iterator[str]:
    for key in missing_keys(cfg):
        yield f"{key} must be set ({key}=...)"
    top_level = {**{part: Any for part in PARTS}, **dataclass_hints(RunOptions)}
    yield from _plain_node(cfg, "", top_level, "lmtrain")
    for part in ("data", "model", "output"):
        yield from _target_node(cfg.get(part), part)
    if cfg.get("sampler") is not None:
        yield from _target_node(cfg.sampler, "sampler")
    if cfg.get("trainer") is not None:
        for key, advice in SET_BY_LMTRAIN.items():
            if key in cfg.trainer:
                yield f"trainer.{key} is set by lmtrain: {advice}"
        yield from _target_node(cfg.trainer, "trainer")
    for part in ("logger", "callbacks"):
        for name, spec in (cfg.get(part) or {}).items():
            yield from _target_node(spec, f"{part}.{name}")
    if cfg.get("optim") is not None:
        yield from _optim(cfg.optim)
    for path, checks in LIMITS.items():
        value = _value(cfg, path)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for check in checks:
                if (problem := check(value)) is not None:
                    yield f"{path} {problem}, got {value!r}"


def check_against_data(cfg: DictConfig, windows: int) -> None:
    """What needs the data's size: an integer val_check_interval must fit into an epoch of ``windows`` training
    windows (after limit_train_batches), unless validation counts steps across epochs."""
    interval, limit = cfg.trainer.get("val_check_interval"), cfg.trainer.get("limit_train_batches")
    batches = min(windows, limit) if isinstance(limit, int) else int(windows * (1.0 if limit is None else limit))
    if isinstance(interval, int) and interval > batches and cfg.trainer.get("check_val_every_n_epoch") is not None:
        raise ConfigError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches of an epoch: use "
            "a fraction of the epoch (0.5), or trainer.check_val_every_n_epoch=null to count steps across epochs"
        )


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


def _optim(node: DictConfig) -> Iterator[str]:
    params = dataclass_hints(OptimOptions)
    optimizer = torch_optimizer(str(node.get("name")))
    if optimizer is not None:
        extra, _ = constructor_params(optimizer)
        params = {**{k: v for k, v in extra.items() if k != "params"}, **params}
    yield from _plain_node(node, "optim", params, f"optim={node.get('name')}", skip=("schedule",))
    if isinstance(node.get("schedule"), DictConfig):
        yield from _plain_node(node.schedule, "optim.schedule", dataclass_hints(ScheduleOptions), "optim.schedule")


def _target_node(node: Any, path: str) -> Iterator[str]:
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
    yield from _plain_node(node, path, params, str(node._target_), takes_any=takes_any)


def _plain_node(
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
        value = _value(node, key)
        if value is not _UNRESOLVED and not matches(value, params[key]):
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


def _value(node: DictConfig, path: str) -> Any:
    """The resolved value at ``path``; _UNRESOLVED when it is missing or cannot be resolved here
    (``${hydra:...}`` outside a Hydra app)."""
    try:
        return OmegaConf.select(node, path, default=_UNRESOLVED, throw_on_missing=True)
    except Exception:
        return _UNRESOLVED
