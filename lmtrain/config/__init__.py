"""Typed configs: one dataclass schema per part in Hydra's ConfigStore (``parts.py``, ``strategies.py``,
``store.py``) under the YAML tree in ``conf/``, the checks a type cannot make (``validate.py``), and the
command line checked before Hydra starts (``preflight.py``, with ``explain.py`` for Hydra's errors)."""

from lmtrain.config.preflight import compose_checked, preflight
from lmtrain.config.store import CONF_DIR, GROUPS, choices, compose_config
from lmtrain.config.validate import ConfigError, check_config, config_problems

__all__ = [
    "CONF_DIR",
    "GROUPS",
    "ConfigError",
    "check_config",
    "choices",
    "compose_checked",
    "compose_config",
    "config_problems",
    "preflight",
]
