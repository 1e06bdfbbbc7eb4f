"""The config schemas of the run and of the parts that are not strategies: the top level, data, model, optim,
trainer. Each is a dataclass registered in Hydra's ConfigStore (``store.py``) and named as the first default of its
YAML files, so Hydra checks every key and type; ``metadata`` holds the ranges a type cannot say (``validate.py``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from lmtrain.common.execution import Execution
from lmtrain.common.optim_options import OptimOptions, torch_optimizer
from lmtrain.common.ranges import AT_LEAST_1, Choice
from lmtrain.data.options import BatchOptions, SyntheticDataOptions, TextOptions, ZipfDataOptions
from lmtrain.model.lstm import LSTMOptions


class LossReduction(Choice):
    """The loss the optimizer sees (docs/workflow.md): the per-token mean, or the mean summed over the T steps of a
    window (the classic PTB recipes, whose SGD learning rates assume it)."""

    mean = "mean"
    sum = "sum"


@dataclass
class RunConfig:
    """The top level of conf/train.yaml: the parts (data, model, ...) and the run's own keys, with their defaults
    (conf/train.yaml holds only the defaults list and Hydra's own settings)."""

    seed: int = 1234
    ckpt_path: str | None = None  # null | last | auto (last.ckpt here if any) | a path to a .ckpt
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
    # glibc keeps freed blocks <= 32 MiB for reuse: no page faults per step (lmtrain/training/memory.py)
    reuse_freed_memory: bool = True
    # code paths: cpu (cache blocks, dedup) or gpu (fixed shapes, no host syncs); auto: by the device it trains on
    execution: Execution = Execution.auto
    data: Any = None
    model: Any = None
    sampler: Any = None
    output: Any = None
    optim: Any = None
    trainer: Any = None
    logger: Any = None


@dataclass
class DataConfig(BatchOptions):
    """What every corpus takes (``lmtrain.data.options.BatchOptions``) and its name; ``data/`` names the corpora."""

    _target_: str = "lmtrain.data.TextDataModule"
    name: str = "???"


@dataclass
class TextDataConfig(DataConfig, TextOptions):
    """``data=ptb|wikitext2|wikitext103|text``: text files in a folder, downloaded when ``hub_dataset`` is set."""


@dataclass
class FolderDataConfig(TextDataConfig):
    """``data=text``: a folder of the user's own, which must be given (``data.path=DIR``)."""

    path: str | None = "???"


@dataclass
class SyntheticDataConfig(SyntheticDataOptions):
    """``data=synthetic``: the seeded Zipf-Markov source."""

    _target_: str = "lmtrain.data.SyntheticDataModule"


@dataclass
class ZipfDataConfig(ZipfDataOptions):
    """``data=zipf``: the seeded large-vocabulary topic source."""

    _target_: str = "lmtrain.data.ZipfDataModule"


@dataclass
class LSTMConfig(LSTMOptions):
    """``model=lstm``: the LSTM encoder (its keys: ``lmtrain.model.lstm.LSTMOptions``)."""

    _target_: str = "lmtrain.model.LSTMEncoder"


@dataclass
class OptimConfig(OptimOptions):
    """``optim=sgd|adam|adagrad``: lmtrain's keys; any other argument of the torch optimizer may be added."""

    @staticmethod
    def extra_keys(node: Any) -> tuple[str, list[str]]:
        """The torch optimizer ``name`` selects and the arguments it takes besides lmtrain's keys."""
        optimizer = torch_optimizer(str(node.get("name")))
        names = [] if optimizer is None else list(inspect.signature(optimizer).parameters)
        return f"optim={node.get('name')}", [name for name in names if name != "params"]


@dataclass
class TrainerConfig:
    """``trainer=default|cpu|ddp``: the Lightning Trainer arguments lmtrain sets in its configs; any other
    argument of ``lightning.Trainer`` may be added (``+trainer.KEY=VALUE``)."""

    _target_: str = "lightning.Trainer"
    max_epochs: int | None = field(default=13, metadata={"at_least": -1, "note": " (-1: no limit)"})
    max_steps: int = field(default=-1, metadata={"at_least": -1, "note": " (-1: no limit)"})
    val_check_interval: int | float | str | None = field(default=None, metadata={"batches": 1})
    check_val_every_n_epoch: int | None = field(default=1, metadata=AT_LEAST_1)
    limit_train_batches: int | float | None = field(default=None, metadata={"batches": 0})
    limit_val_batches: int | float | None = field(default=None, metadata={"batches": 0})
    limit_test_batches: int | float | None = field(default=None, metadata={"batches": 0})
    accelerator: str = "auto"
    strategy: str = "auto"
    devices: Any = 1
    num_nodes: int = field(default=1, metadata=AT_LEAST_1)
    precision: str | int = "32-true"
    log_every_n_steps: int = field(default=20, metadata=AT_LEAST_1)
    num_sanity_val_steps: int = field(default=0, metadata={"at_least": -1, "note": " (-1: all batches)"})
    enable_model_summary: bool = False
    accumulate_grad_batches: int = field(default=1, metadata=AT_LEAST_1)
    use_distributed_sampler: bool = False

    @staticmethod
    def extra_keys(node: Any) -> tuple[str, list[str]]:
        """Any other argument of the Lightning Trainer."""
        import lightning

        return "lightning.Trainer", list(inspect.signature(lightning.Trainer).parameters)
