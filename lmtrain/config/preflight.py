"""The command line checked before Hydra starts: every job the overrides describe is composed with the same
config search path Hydra will use (the package's tree, ``--config-dir``, ``hydra.searchpath``) and checked, so that
a mistake is one line and exit code 2 before any folder, W&B run or Trainer exists."""

from __future__ import annotations

import itertools
from pathlib import Path

from omegaconf import DictConfig

from lmtrain.config.explain import explain, one_line
from lmtrain.config.store import CONF_DIR
from lmtrain.config.validate import ConfigError, config_problems

MULTIRUN_FLAGS = ("-m", "--multirun")
CONFIG_DIR_FLAGS = ("-cd", "--config-dir")


def preflight(args: list[str]) -> None:
    """Raise ConfigError (one line) for command-line arguments whose run or sweep would fail at once.

    Arguments other than overrides, -m/--multirun and --config-dir (--help, --cfg, --config-name, ...) are
    left to Hydra."""
    overrides, flags, config_dir = split_args(args)
    if any(flag not in MULTIRUN_FLAGS for flag in flags):
        return
    multirun = bool(flags) or any(o.replace(" ", "") == "hydra.mode=MULTIRUN" for o in overrides)
    if any(o.lstrip("+~").startswith(("hydra/sweeper", "hydra.sweeper")) for o in overrides):
        return  # another sweeper decides the jobs
    jobs, primary = split_jobs(overrides, multirun)
    for number, job in enumerate(jobs):
        try:
            compose_checked(job, config_dir)
        except ConfigError as err:
            raise ConfigError(f"job {number} ({' '.join(job)}): {err}" if multirun else str(err)) from None
    if multirun:  # Hydra composes the config without the swept values before it starts the sweep
        try:
            compose_checked(primary, config_dir, check=False)
        except ConfigError as err:
            raise ConfigError(
                f"{err}; before a sweep Hydra composes the config without the swept values (default options), "
                "so a key that only the swept options have needs ++KEY=VALUE or a sweep of one: 'KEY=choice(VALUE)'"
            ) from None


def split_args(args: list[str]) -> tuple[list[str], list[str], Path | None]:
    """(overrides, flags other than --config-dir, the --config-dir folder)."""
    overrides, flags, config_dir = [], [], None
    rest = iter(args)
    for arg in rest:
        name, _, value = arg.partition("=")
        if name in CONFIG_DIR_FLAGS:
            config_dir = Path(value or next(rest, "")).expanduser().resolve()
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            overrides.append(arg)
    return overrides, flags, config_dir


def split_jobs(overrides: list[str], multirun: bool) -> tuple[list[list[str]], list[str]]:
    """The override lists of the jobs (one without -m: every combination of the swept values, as Hydra's basic
    sweeper runs them) and the sweep's primary overrides (the non-swept ones)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if not multirun:
            return [overrides], overrides
        values = [
            [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
            if o.is_sweep_override()
            else [o.input_line]
            for o in parsed
        ]
    except Exception as exc:  # OverrideParseException, a sweep the basic sweeper cannot list
        raise ConfigError(one_line(exc)) from None
    primary = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    return [list(job) for job in itertools.product(*values)], primary


def compose_checked(overrides: list[str], config_dir: Path | None = None, check: bool = True) -> DictConfig:
    """train.yaml composed with ``overrides`` (and ``config_dir`` on the search path) and, with ``check``, checked;
    every failure is a one-line ConfigError."""
    from hydra import compose, initialize_config_dir

    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir is not None else []

    def compose_with(job: list[str], hydra: bool = False) -> DictConfig:
        searched = job if any(o.startswith("hydra.searchpath=") for o in job) else [*extra, *job]
        return compose("train", overrides=searched, return_hydra_config=hydra)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = compose_with(overrides)
        except Exception as exc:  # Hydra's and OmegaConf's errors: explained in one line below
            raise ConfigError(explain(exc, overrides, compose_with)) from None
    problem = next(config_problems(cfg), None) if check else None
    if problem is not None:
        raise ConfigError(problem)
    return cfg
