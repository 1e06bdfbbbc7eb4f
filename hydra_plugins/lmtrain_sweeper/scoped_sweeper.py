"""Hydra's basic sweeper, whose jobs take a ``sampler.KEY=VALUE`` only when their sampler has KEY
(``lmtrain.cli.sweep``). Hydra imports every module of ``hydra_plugins`` when any Hydra app starts, so lmtrain is
imported only when a sweep runs."""

from __future__ import annotations

# Hydra's basic sweeper has no public import path (hydra.plugins exposes only the abstract Sweeper); subclassing it
# keeps its job order and launch loop, which a public reimplementation would have to copy
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override


class ScopedSweeper(BasicSweeper):
    """The jobs of Hydra's basic sweeper (the product of the swept values, in its order), each without the sampler
    keys its sampler lacks; jobs that this makes identical run once."""

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        from lmtrain.cli.sweep import scope_jobs

        assert self.hydra_context is not None and self.config is not None  # set by setup(), before sweep()
        loader, primary = self.hydra_context.config_loader, self.config
        [jobs] = BasicSweeper.split_arguments(overrides, None)
        scoped = scope_jobs(jobs, lambda job: loader.load_sweep_config(primary, job)).jobs
        return list(BasicSweeper.split_overrides_to_chunks(scoped, max_batch_size))
