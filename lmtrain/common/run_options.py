"""The top level of the config: the run's own keys with their defaults (read by ``lmtrain.run.run``), and a
slot per group; the schema ``schema/train`` that conf/train.yaml extends (``lmtrain/config/``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from lmtrain.common.ranges import AT_LEAST_1, Choice


class LossReduction(Choice):
    """The loss the optimizer sees (docs/workflow.md): the per-token mean, or the mean summed over the T steps of a
    window (the classic PTB recipes, whose SGD learning rates assume it)."""

    mean = "mean"
    sum = "sum"


class StepFormsChoice(Choice):
    """``step_forms``: the forms of the training step's code (``lmtrain.common.runtime.StepForms``), a CPU's or a
    GPU's (fixed shapes, no host sync); auto by where the run trains."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


@dataclass
class RunConfig:
    """The top level of conf/train.yaml: the parts (data, model, ...) and the run's own keys, with their defaults
    (conf/train.yaml holds only the defaults list and Hydra's own settings)."""

    seed: int = 1234
    ckpt_path: str | None = None  # null | last | auto (last.ckpt here if any) | a path to a .ckpt
    # a fresh fit from this checkpoint's weights (its averaged ones, if it averaged): the finetune stage with
    # optim.average=always; a resume (ckpt_path) takes its own weights instead
    init_from: str | None = None
    group: str | int | float | None = None  # W&B group; default in sweeps: the sweep folder
    name: str | int | float | None = None  # run name in W&B and plots; default: the job's overrides, else the output
    run_dir: str = II("hydra:runtime.output_dir")  # where checkpoints, metrics.csv, config.yaml and wandb/ go
    # a periodic last.ckpt (atomic), so a kill loses at most this many steps, and at least this often while training
    checkpoint_every_n_steps: int = field(default=500, metadata=AT_LEAST_1)
    checkpoint_every_minutes: float = field(default=5.0, metadata={"above": 0})
    # the classic PTB recipes apply SGD to the loss summed over the T steps (mean over the batch): sum scales the
    # per-token mean loss by T; mean keeps the per-token mean (docs/workflow.md: the loss the optimizer sees)
    loss_reduction: LossReduction = LossReduction.sum
    test_after_fit: bool = True
    # end training after this much training time (validation left out), then validate and test: strategies
    # compared at equal time; each validation logs train/seconds
    max_train_seconds: float | None = field(default=None, metadata={"above": 0})
    callbacks: dict[str, Any] = field(default_factory=dict)  # extra Lightning callbacks: +callbacks.NAME._target_=X
    progress_bar: bool = True
    # torch compute threads: auto = usable cores / jobs running at once (joblib n_jobs, LMTRAIN_CONCURRENT_JOBS,
    # DDP ranks); or a number
    threads: int | str = field(default="auto", metadata=AT_LEAST_1)
    # glibc keeps freed blocks <= 32 MiB for reuse: no page faults per step (lmtrain/process/memory.py)
    reuse_freed_memory: bool = True
    # the training step's forms: auto = a GPU's where the run trains on a CUDA GPU (trainer.accelerator), else a
    # CPU's; cpu | gpu force them on any device (tests and benchmarks; lmtrain.common.runtime.StepForms)
    step_forms: StepFormsChoice = StepFormsChoice.auto
    # evaluation additions: eval.cache, the neural cache (lmtrain/output/cache.py; typed by lmtrain/config/schema.py)
    eval: Any = None
    data: Any = None
    model: Any = None
    sampler: Any = None
    output: Any = None
    optim: Any = None
    trainer: Any = None
    logger: Any = None

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """The config check's rule across groups: a sampler only beside an output that takes one (a sampler key
        forced into every job of a sweep, ``++sampler.KEY``, would otherwise fail only when its job starts)."""
        from hydra.utils import get_class

        sampler, output = node.get("sampler"), node.get("output")
        if sampler is None or output is None:
            return
        try:
            part = get_class(str(output._target_))
            chosen = get_class(str(sampler._target_)) if sampler.get("_target_") else None
        except Exception:  # no such class: the check of the part's own keys says so
            return
        if "sampler" in getattr(part, "runtime_args", ("sampler",)):
            return
        name = getattr(part, "name", part.__name__)
        if chosen is not None:
            sampler_name = getattr(chosen, "name", chosen.__name__)
            yield f"output={name} takes no sampler, but the config chooses sampler={sampler_name}: leave it out"
        else:
            keys = ", ".join(f"sampler.{key}" for key in sampler) or "sampler"
            yield f"output={name} takes no sampler, but the config sets {keys}: leave it out (in a sweep a " + (
                "sampler.KEY=VALUE without + or ++ goes only to the jobs whose sampler takes it)"
            )
