"""The schemas in Hydra's ConfigStore, and composing the config tree outside a Hydra app.

Every YAML file of a part names its schema as its first default (``- /schema/output@_here_: sampled``), so the
composed node is typed: Hydra rejects a key the schema lacks and a value of the wrong type. A user's own config
folder (``--config-dir DIR`` or ``hydra.searchpath=[file://DIR]``) extends the same schemas.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

import lmtrain
from lmtrain.config import parts, strategies

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


def compose_config(overrides: list[str], config_dir: Path | None = None) -> DictConfig:
    """conf/train.yaml composed with ``overrides`` outside a Hydra app (scripts, tools, tests) and checked
    (``lmtrain.config.validate``); ``config_dir`` is a user's config folder searched as well. Raises ConfigError."""
    from lmtrain.config.preflight import compose_checked

    return compose_checked(overrides, config_dir)


def choices(group: str) -> list[str]:
    """The options of ``group`` in the packaged config tree."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


register()
