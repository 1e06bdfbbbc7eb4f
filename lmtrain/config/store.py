"""Composing the config tree outside a Hydra app, with the schemas of ``schema.py`` in Hydra's ConfigStore, which a
user's own config folder (``--config-dir DIR`` or ``hydra.searchpath=[file://DIR]``) extends too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

import lmtrain
from lmtrain.config.explain import Compose, explain
from lmtrain.config.schema import register
from lmtrain.config.validate import ConfigError, check_config

CONF_DIR = lmtrain.CONF_DIR  # the Hydra config tree: conf/ of the repository, shipped in the wheel as lmtrain/conf
GROUPS = ("data", "model", "sampler", "output", "optim", "trainer", "logger", "experiment")


@contextmanager
def composer(config_dir: Path | None = None) -> Iterator[Compose]:
    """``compose(overrides, hydra=False)``: train.yaml composed by Hydra's compose API while the block runs, with
    ``config_dir`` searched as ``--config-dir`` adds it (unless the overrides set ``hydra.searchpath``)."""
    from hydra import compose, initialize_config_dir

    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir is not None else []

    def compose_with(overrides: list[str], hydra: bool = False) -> DictConfig:
        searched = overrides if any(o.startswith("hydra.searchpath=") for o in overrides) else [*extra, *overrides]
        return compose("train", overrides=searched, return_hydra_config=hydra)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield compose_with


def compose_config(overrides: list[str], config_dir: Path | None = None, check: bool = True) -> DictConfig:
    """conf/train.yaml composed with ``overrides`` outside a Hydra app (scripts, tools, tests) and, with ``check``,
    checked (``lmtrain.config.validate``); ``config_dir`` is a user's config folder searched as well. Every failure
    is a one-line ConfigError."""
    with composer(config_dir) as compose:
        try:
            cfg = compose(overrides)
        except Exception as exc:  # Hydra's and OmegaConf's errors, in one line
            raise ConfigError(explain(exc, overrides, compose)) from None
    if check:
        check_config(cfg)
    return cfg


register()
