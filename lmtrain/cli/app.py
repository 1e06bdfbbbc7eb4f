"""Hydra's app with lmtrain's errors: what Hydra refuses while it composes the config (an unknown option, key or
flag, a value of the wrong type, a config folder that does not exist) and what ``lmtrain.config.callback`` refuses
before Hydra creates a folder, as one line and exit code 2."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from lmtrain.cli.failures import fail
from lmtrain.config import composer, explain
from lmtrain.config.callback import ConfigRefused
from lmtrain.config.explain import innermost, one_line

# raised by Hydra before it writes anything: composing the config (MissingConfigException is one), reading the
# overrides, finding --config-dir
REFUSALS = (ConfigCompositionException, OverrideParseException, SearchPathException)
SWEEP_HINT = (
    "; before a sweep Hydra composes the config without the swept values (default options), so a key that only "
    "the swept options have needs ++KEY=VALUE or a sweep of one: 'KEY=choice(VALUE)'"
)


def run_app(app: Callable[[], Any]) -> None:
    """Run ``app``, a ``@hydra.main`` function over conf/train.yaml; a refused command line ends in one line."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors instead of printing them and exiting with 1
    try:
        app()
    except ConfigRefused as refused:  # lmtrain's checks of the config Hydra composed
        fail(str(refused))
    except REFUSALS as exc:
        fail(refusal(exc))


def unswept(overrides: list[str]) -> list[str]:
    """The overrides without the swept ones: what Hydra composes before a sweep (its primary config)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return overrides
    return [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]


def refusal(exc: BaseException) -> str:
    """Hydra's error in one line, with the hints that need the command line as Hydra read it."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args()  # the arguments as Hydra read them, with its own parser (as hydra.main)
    config_dir = Path(args.config_dir).resolve() if args.config_dir else None
    if isinstance(exc, SearchPathException):
        return str(exc)
    overrides = unswept(list(args.overrides)) if args.multirun else list(args.overrides)
    with composer(config_dir) as compose:
        try:
            message = explain(exc, overrides, compose)
        except Exception:  # the hint needs a composition that fails too: Hydra's own message, in one line
            message = one_line(exc)
    unknown_key = isinstance(innermost(exc), (ConfigKeyError, ConfigAttributeError))  # a key the config lacks
    return message + (SWEEP_HINT if args.multirun and unknown_key else "")
