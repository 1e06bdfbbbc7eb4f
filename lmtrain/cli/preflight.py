"""The command line checked before Hydra starts: compose every job the overrides describe and check its config, so
that a mistake is one line and exit code 2 before any folder, W&B run or Trainer exists.

Hydra's own errors (a key that is not in the config, a malformed override) become one line that names the key and
the keys that do exist next to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lmtrain.cli.overrides import CONF_DIR, OverrideError, check_overrides

MULTIRUN_FLAGS = ("-m", "--multirun")


def preflight(args: list[str]) -> None:
    """Raise OverrideError (a one-line message) for command-line arguments whose run or sweep would fail at once.

    Arguments other than overrides and -m/--multirun (--help, --cfg, --config-name, ...) are left to Hydra."""
    check_overrides(args)
    flags = [a for a in args if a.startswith("-")]
    if any(flag not in MULTIRUN_FLAGS for flag in flags):
        return
    overrides = [a for a in args if not a.startswith("-")]
    multirun = bool(flags) or any(o.replace(" ", "") == "hydra.mode=MULTIRUN" for o in overrides)
    if any(o.lstrip("+~").startswith(("hydra/sweeper", "hydra.sweeper")) for o in overrides):
        return  # another sweeper decides the jobs
    jobs, primary = split_jobs(overrides, multirun)
    with _config_dir():
        for number, job in enumerate(jobs):
            cfg = compose_checked(job)
            problem = first_problem(cfg)
            if problem is not None:
                raise OverrideError(f"job {number} ({' '.join(job)}): {problem}" if multirun else problem)
        if multirun:  # Hydra composes the config without the swept values before it starts the sweep
            try:
                compose_checked(primary)
            except OverrideError as err:
                raise OverrideError(
                    f"{err}; before a sweep Hydra composes the config without the swept values (default options), "
                    "so a key that only the swept options have needs ++KEY=VALUE or a sweep of one: 'KEY=choice(VALUE)'"
                ) from None


def split_jobs(overrides: list[str], multirun: bool) -> tuple[list[list[str]], list[str]]:
    """The override lists of the jobs (one without -m) and the sweep's primary overrides (the non-swept ones)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if not multirun:
            return [overrides], overrides
        jobs = BasicSweeper.split_arguments(parsed, None)[0]
    except Exception as exc:  # OverrideParseException, an unsupported sweep
        raise OverrideError(one_line(exc)) from None
    primary = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    return jobs, primary


def first_problem(cfg: DictConfig) -> str | None:
    from lmtrain.training.checks import config_problems

    return next(config_problems(cfg), None)


@contextmanager
def _config_dir() -> Iterator[None]:
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def compose_checked(overrides: list[str], hydra: bool = False) -> DictConfig:
    """compose(train, overrides) inside an initialized config dir, its errors as one-line OverrideErrors."""
    from hydra import compose

    try:
        return compose("train", overrides=overrides, return_hydra_config=hydra)
    except Exception as exc:
        raise OverrideError(explain(exc, overrides)) from None


def explain(exc: BaseException, overrides: list[str]) -> str:
    """A compose error in one line; a key that is not in the config gets the closest existing key."""
    from lmtrain.training.checks import unknown_key

    full_key = _missing_key(exc)
    if full_key is None:
        return one_line(exc)
    culprit = [o for o in overrides if _key(o) == full_key or _key(o).startswith(full_key + ".")]
    parent, _, leaf = full_key.rpartition(".")
    try:
        reference = compose_checked([o for o in overrides if o not in culprit], hydra=full_key.startswith("hydra."))
        node = OmegaConf.select(reference, parent) if parent else reference
    except Exception:
        node = None
    if not isinstance(node, DictConfig):
        return one_line(exc)
    known = [str(k) for k in node if not str(k).startswith("_")]
    extra = _target_params(node)
    if leaf in extra and culprit:
        return f"{full_key} is an argument of {node._target_} that the config does not set: add it with +{culprit[0]}"
    return unknown_key(full_key, sorted(set(known) | set(extra)), str(node.get("_target_", parent)), known)


def _target_params(node: DictConfig) -> list[str]:
    if "_target_" not in node:
        return []
    from hydra.utils import get_class

    from lmtrain.training.build import RUNTIME_ARGS, constructor_params

    try:
        params, _ = constructor_params(get_class(str(node._target_)))
    except Exception:
        return []
    return [p for p in params if p not in RUNTIME_ARGS]


def _missing_key(exc: BaseException) -> str | None:
    """The full key of a 'not in struct' error in ``exc``'s cause chain."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
            return str(cause.full_key)
        cause = cause.__cause__
    return None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def one_line(exc: Any) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines) if lines else type(exc).__name__
