"""Typed configs: schemas derived from the parts (``schema.py``) under the YAML presets of ``conf/``, composing
(``store.py``), the checks a type cannot make (``validate.py``, ``callback.py``), Hydra's errors in one line."""

from lmtrain.config.explain import explain
from lmtrain.config.schema import choices
from lmtrain.config.store import CONF_DIR, GROUPS, compose_config, composer
from lmtrain.config.validate import ConfigError, check_config

__all__ = ["CONF_DIR", "GROUPS", "ConfigError", "check_config", "choices", "compose_config", "composer", "explain"]
