"""Typed configs: one dataclass schema per part in Hydra's ConfigStore (``parts.py``, ``strategies.py``,
``store.py``) under the YAML tree in ``conf/``, the checks a type cannot make (``validate.py``), run by Hydra
before it writes anything (``callback.py``), and Hydra's own errors in one line (``explain.py``)."""

from lmtrain.config.explain import explain
from lmtrain.config.store import CONF_DIR, GROUPS, choices, compose_config, composer
from lmtrain.config.validate import ConfigError, check_config

__all__ = [
    "CONF_DIR",
    "GROUPS",
    "ConfigError",
    "check_config",
    "choices",
    "compose_config",
    "composer",
    "explain",
]
