"""The checks Hydra cannot make, run by Hydra itself before it creates a run or sweep folder: a Hydra callback
(``hydra.callbacks`` in conf/train.yaml) that checks the config Hydra composed, and in a sweep of Hydra's basic
sweeper every job's config, composed by Hydra's config loader from the overrides Hydra hands over."""

from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lmtrain.cli.machine import check_machine, check_output_folder, ddp_child
from lmtrain.cli.sweep import SAMPLER, scope_jobs, top_of, unused_key
from lmtrain.config.explain import explain, sampler_takers
from lmtrain.config.schema import RENAMED
from lmtrain.config.validate import ConfigError, check_config

SCOPED_SWEEPER = ".ScopedSweeper"  # lmtrain's sweeper (hydra_plugins/lmtrain_sweeper)


class ConfigRefused(BaseException):  # noqa: N818 (it travels like SystemExit)
    """A ConfigError out of a Hydra callback. Hydra turns a callback's ``Exception`` into a warning and goes on, so
    the refusal travels as a BaseException, like SystemExit, up to lmtrain's entry (``lmtrain.cli.app``)."""


class CheckConfig(Callback):
    """Refuses (ConfigRefused, one line) before Hydra writes anything a run's or a sweep job's config with a value
    out of range, a key no part reads, a value left ``???``, what this machine cannot give
    (``lmtrain.cli.machine``) or an output folder this user cannot write."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        warn_renamed(config)
        try:
            task = without_hydra(config)
            check_config(task)
            if not ddp_child():  # a rank that Lightning's launcher started: rank 0 checked all this
                check_output_folder(str(config.hydra.run.dir), "hydra.run.dir")
                check_machine(task)
        except ConfigError as err:
            raise ConfigRefused(str(err)) from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        warn_renamed(config)
        try:
            check_output_folder(str(config.hydra.sweep.dir), "hydra.sweep.dir")
            check_sweep(config)
        except ConfigError as err:
            raise ConfigRefused(str(err)) from None


def check_sweep(config: DictConfig) -> None:
    """Every job of a sweep of Hydra's basic sweeper or lmtrain's (the primary config for another sweeper, which
    chooses its jobs as it goes): ConfigError naming the first job that fails. With lmtrain's sweeper a sampler key
    goes only to the jobs whose sampler takes it (``lmtrain.cli.sweep``): one line on stderr names the jobs that
    run without it, and a key that no job takes is refused."""
    target = str(config.hydra.sweeper.get("_target_"))
    if not target.endswith((".BasicSweeper", SCOPED_SWEEPER)):
        check_config(without_hydra(config))
        check_machine(without_hydra(config))
        return
    loader = GlobalHydra.instance().config_loader()
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *config.hydra.overrides.task])
    jobs = sweep_jobs(parsed)

    def compose(overrides: list[str], hydra: bool = False) -> DictConfig:
        return loader.load_configuration(str(config.hydra.job.config_name), overrides, RunMode.RUN)

    if target.endswith(SCOPED_SWEEPER):
        scoped = scope_jobs(jobs, lambda job: loader.load_sweep_config(config, job))
        for key in scoped.unused():
            others = [o for o in jobs[0] if not o.startswith(SAMPLER)]
            raise ConfigError(unused_key(key, scoped, sampler_takers(top_of(key), others, compose)))
        for note in scoped.notes():
            sys.stderr.write(f"lmtrain: {note}\n")
        jobs = scoped.jobs
    for number, job in enumerate(jobs):
        try:
            task = without_hydra(loader.load_sweep_config(config, list(job)))
            check_config(task)
            check_machine(task)
        except ConfigError as err:
            raise ConfigError(f"job {number} ({' '.join(job)}): {err}") from None
        except Exception as exc:  # Hydra's own errors composing the job
            raise ConfigError(f"job {number} ({' '.join(job)}): {explain(exc, list(job), compose)}") from None


def without_hydra(config: DictConfig) -> DictConfig:
    """The task's config: ``config`` without its ``hydra`` node, as Hydra hands it to the task function."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    OmegaConf.set_struct(task, True)
    return task


def sweep_jobs(overrides: list[Override]) -> list[list[str]]:
    """The jobs of Hydra's basic sweeper, in its order, by the sweeper's own rule (``split_arguments``: the product
    of every key's values, a key given twice counting once), so this check and the sweep cannot disagree."""
    # no public import path exists for the basic sweeper (hydra_plugins/lmtrain_sweeper/scoped_sweeper.py)
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    [jobs] = BasicSweeper.split_arguments(overrides, None)
    return jobs


def warn_renamed(config: DictConfig) -> None:
    """One line on stderr for each schema the config extends by a name that a release changed (``RENAMED``)."""
    for key, name in (config.hydra.runtime.get("choices") or {}).items():
        if (old := f"{str(key).split('@')[0]}/{name}") in RENAMED:
            sys.stderr.write(f"lmtrain: warning: {old} is now {RENAMED[old]}; the old name goes in the next release\n")
