"""The config schemas of the run and of the parts that are not strategies: the top level, data, model, optim,
trainer. Each is a dataclass registered in Hydra's ConfigStore (``store.py``) and named as the first default of its
YAML files, so Hydra checks every key and type; ``metadata`` holds the ranges a type cannot say (``validate.py``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from lmtrain.common.execution import Execution
from lmtrain.common.optim_options import OptimOptions, torch_optimizer
from lmtrain.data.synthetic import SyntheticOptions
from lmtrain.data.zipf_topics import ZipfTopicOptions

AT_LEAST_1 = {"at_least": 1}


@dataclass
class RunConfig:
    """The top level of conf/train.yaml: the parts (data, model, ...) and the run's own keys."""

    seed: int = 1234
    ckpt_path: str | None = None
    group: str | int | float | None = None
    name: str | int | float | None = None
    run_dir: str = "???"
    checkpoint_every_n_steps: int = field(default=500, metadata=AT_LEAST_1)
    checkpoint_every_minutes: float = field(default=5.0, metadata={"above": 0})
    loss_reduction: str = field(default="sum", metadata={"choices": ("mean", "sum")})
    test_after_fit: bool = True
    max_train_seconds: float | None = field(default=None, metadata={"above": 0})
    callbacks: dict[str, Any] = field(default_factory=dict)
    progress_bar: bool = True
    threads: int | str = field(default="auto", metadata=AT_LEAST_1)  # or auto
    reuse_freed_memory: bool = True
    execution: Execution = Execution.auto  # cpu or gpu code paths; auto: by the device the run trains on
    data: Any = None
    model: Any = None
    sampler: Any = None
    output: Any = None
    optim: Any = None
    trainer: Any = None
    logger: Any = None


@dataclass
class DataConfig:
    """What every corpus takes: the batch layout and where token ids are cached."""

    _target_: str = "lmtrain.data.TextDataModule"
    name: str = "???"
    cache_dir: str | None = None
    batch_size: int = field(default=20, metadata=AT_LEAST_1)
    bptt: int = field(default=35, metadata=AT_LEAST_1)
    eval_batch_size: int = field(default=10, metadata=AT_LEAST_1)


@dataclass
class TextDataConfig(DataConfig):
    """``data=ptb|wikitext2|wikitext103|text``: text files in a folder, downloaded when ``hub_dataset`` is set."""

    root: str = "data"
    path: str | None = None
    hub_dataset: str | None = None
    hub_config: str | None = None
    hub_data_files: dict[str, str] | None = None
    hub_field: str = "text"


@dataclass
class FolderDataConfig(TextDataConfig):
    """``data=text``: a folder of the user's own, which must be given (``data.path=DIR``)."""

    path: str | None = "???"


@dataclass
class SyntheticDataConfig(DataConfig, SyntheticOptions):
    """``data=synthetic``: the seeded Zipf-Markov source."""

    _target_: str = "lmtrain.data.SyntheticDataModule"


@dataclass
class ZipfDataConfig(DataConfig, ZipfTopicOptions):
    """``data=zipf``: the seeded large-vocabulary topic source."""

    _target_: str = "lmtrain.data.ZipfDataModule"


@dataclass
class LSTMConfig:
    """``model=lstm``: the LSTM encoder."""

    _target_: str = "lmtrain.model.LSTMEncoder"
    emb_dim: int = field(default=200, metadata=AT_LEAST_1)
    hidden_dim: int = field(default=200, metadata=AT_LEAST_1)
    num_layers: int = field(default=2, metadata=AT_LEAST_1)
    dropout: float = field(default=0.0, metadata={"at_least": 0, "below": 1})
    init_range: float = field(default=0.1, metadata={"above": 0})
    sparse_embedding: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})


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
