"""The schemas in Hydra's ConfigStore, and composing the config tree outside a Hydra app.

Every YAML file of a part names its schema as its first default (``- /schema/output@_here_: sampled``), so the
composed node is typed: Hydra rejects a key the schema lacks and a value of the wrong type. A user's own config
folder (``--config-dir DIR`` or ``hydra.searchpath=[file://DIR]``) extends the same schemas.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

import lmtrain
from lmtrain.config import parts, strategies
from lmtrain.config.explain import Compose, explain
from lmtrain.config.validate import ConfigError, check_config

CONF_DIR = lmtrain.CONF_DIR  # the Hydra config tree: conf/ of the repository, shipped in the wheel as lmtrain/conf
GROUPS = ("data", "model", "sampler", "output", "optim", "trainer", "logger", "experiment")


def register() -> None:
    """Store every schema as ``schema/<group>/<name>`` and the top level as ``schema/train`` (idempotent)."""
    store = ConfigStore.instance().store
    store(group="schema", name="train", node=parts.RunConfig)
    store(group="schema/data", name="text", node=parts.TextDataConfig)
    store(group="schema/data", name="folder", node=parts.FolderDataConfig)
    store(group="schema/data", name="synthetic", node=parts.SyntheticDataConfig)
    store(group="schema/data", name="zipf", node=parts.ZipfDataConfig)
    store(group="schema/model", name="lstm", node=parts.LSTMConfig)
    store(group="schema/optim", name="optim", node=parts.OptimConfig)
    store(group="schema/trainer", name="trainer", node=parts.TrainerConfig)
    store(group="schema/output", name="full", node=strategies.FullConfig)
    store(group="schema/output", name="adaptive", node=strategies.AdaptiveConfig)
    store(group="schema/output", name="hsm", node=strategies.HSMConfig)
    store(group="schema/output", name="sampled", node=strategies.SampledConfig)
    store(group="schema/output", name="absolute", node=strategies.AbsoluteConfig)
    store(group="schema/output", name="cosine", node=strategies.CosineConfig)
    store(group="schema/output", name="nce", node=strategies.NCEConfig)
    store(group="schema/output", name="negative", node=strategies.NegativeConfig)
    store(group="schema/sampler", name="uniform", node=strategies.UniformSamplerConfig)
    store(group="schema/sampler", name="softmax", node=strategies.SoftmaxSamplerConfig)
    store(group="schema/sampler", name="unigram", node=strategies.UnigramSamplerConfig)
    store(group="schema/sampler", name="bigram", node=strategies.BigramSamplerConfig)
    store(group="schema/sampler", name="quadratic", node=strategies.QuadraticSamplerConfig)
    store(group="schema/sampler", name="rff", node=strategies.RFFSamplerConfig)


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


def choices(group: str) -> list[str]:
    """The options of ``group`` in the packaged config tree."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


register()
