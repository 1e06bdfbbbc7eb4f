"""Hydra's app with lmtrain's errors: what Hydra refuses while it composes the config (an unknown option, key or
flag, a value of the wrong type, a config folder that does not exist) and what ``lmtrain.cli.callback`` refuses
before Hydra creates a folder, as one line and exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from lmtrain.cli.callback import ConfigRefused
from lmtrain.cli.failures import SweepStopped, fail
from lmtrain.cli.sweep import as_sweep
from lmtrain.config import composer, explain
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
    if hydra_arguments(sys.argv[1:]).multirun:  # a fixed sampler.KEY=VALUE: for the jobs whose sampler takes it
        sys.argv[1:] = as_sweep(sys.argv[1:])
    try:
        app()
    except ConfigRefused as refused:  # lmtrain's checks of the config Hydra composed
        fail(str(refused))
    except SweepStopped as stopped:  # a sweep job that failed: the jobs after it do not run
        print(f"lmtrain: error: {stopped.line}", file=sys.stderr)
        sys.exit(stopped.code)
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


def hydra_arguments(argv: list[str]) -> argparse.Namespace:
    """``--config-dir``, ``--multirun`` and the overrides of a command line, read as Hydra's own parser reads them
    (its flags that take a value are declared, so that a value is not taken for an override)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--config-dir", "-cd")
    parser.add_argument("--multirun", "-m", action="store_true")
    for flags in (["--config-path", "-cp"], ["--config-name", "-cn"], ["--cfg", "-c"], ["--package", "-p"]):
        parser.add_argument(*flags)
    parser.add_argument("--info", "-i", nargs="?")
    parser.add_argument("--experimental-rerun")
    return parser.parse_known_args(argv)[0]


def refusal(exc: BaseException) -> str:
    """Hydra's error in one line, with the hints that need the command line as Hydra read it."""
    args = hydra_arguments(sys.argv[1:])
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
