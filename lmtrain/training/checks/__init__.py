"""Checking a composed config before anything starts: every value has the type and range its reader expects,
and every key is read by some part (a typo added with ``+`` or ``++`` would otherwise be ignored silently).

Where a part is built from ``_target_``, its constructor's signature says which keys exist and their types
(``lightning.Trainer`` for ``trainer``); ``optim`` follows ``OptimOptions`` plus the torch optimizer's
arguments, the top level ``RunOptions``. ``LIMITS`` (``limits.py``) holds the ranges a type cannot say;
``keys.py`` walks the nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Literal

from omegaconf import DictConfig

from lmtrain.training.checks.keys import (
    ConfigError,
    dataclass_hints,
    missing_keys,
    optim_node,
    plain_node,
    target_node,
    unknown_key,
    value_at,
)
from lmtrain.training.checks.limits import LIMITS

__all__ = ["PARTS", "ConfigError", "RunOptions", "check_against_data", "check_config", "config_problems", "unknown_key"]


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
    max_train_seconds: float | None


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
# precisions that store the weights themselves in 16 bits: nothing could then be evaluated in float32
LOW_PRECISION_WEIGHTS = ("bf16-true", "16-true")


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError with the first problem of ``cfg`` (one line naming the key and what it must be)."""
    problem = next(config_problems(cfg), None)
    if problem is not None:
        raise ConfigError(problem)


def config_problems(cfg: DictConfig) -> Iterator[str]:
    for key in missing_keys(cfg):
        yield f"{key} must be set ({key}=...)"
    top_level = {**{part: Any for part in PARTS}, **dataclass_hints(RunOptions)}
    yield from plain_node(cfg, "", top_level, "lmtrain")
    for part in ("data", "model", "output"):
        yield from target_node(cfg.get(part), part)
    if cfg.get("sampler") is not None:
        yield from target_node(cfg.sampler, "sampler")
    if cfg.get("trainer") is not None:
        for key, advice in SET_BY_LMTRAIN.items():
            if key in cfg.trainer:
                yield f"trainer.{key} is set by lmtrain: {advice}"
        if str(cfg.trainer.get("precision")) in LOW_PRECISION_WEIGHTS:
            yield (
                f"trainer.precision={cfg.trainer.precision} keeps the weights in 16 bits, so exact evaluation, a "
                "sampler's log q and the kernel tree's sums cannot stay float32: use trainer.precision=bf16-mixed "
                "(float32 weights, 16-bit products; docs/workflow.md, mixed precision)"
            )
        yield from target_node(cfg.trainer, "trainer")
    for part in ("logger", "callbacks"):
        for name, spec in (cfg.get(part) or {}).items():
            yield from target_node(spec, f"{part}.{name}")
    if cfg.get("optim") is not None:
        yield from optim_node(cfg.optim)
    for path, checks in LIMITS.items():
        value = value_at(cfg, path)
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
