"""The ``trainer`` keys: the Lightning Trainer arguments lmtrain sets in its configs, with their defaults (the config
schema of ``trainer``, ``lmtrain/config/``); any other argument of ``lightning.Trainer`` may be added
(``+trainer.KEY=VALUE``). Gradient clipping is lmtrain's own (``optim.clip``); the loggers, callbacks and progress bar
are set by lmtrain."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lmtrain.common.ranges import AT_LEAST_1

NO_LIMIT = {"at_least": -1, "note": " (-1: no limit)"}
# Trainer arguments lmtrain sets itself, and what to use instead
SET_BY_LMTRAIN = {
    "logger": "choose logger=wandb or logger=csv",
    "callbacks": "add a callback with +callbacks.NAME._target_=CLASS",
    "default_root_dir": "the run folder is hydra.run.dir",
    "plugins": "its checkpoints are written atomically by lmtrain",
    "enable_progress_bar": "use progress_bar=true|false",
    "gradient_clip_val": "use optim.clip (the global gradient norm, sparse gradients included)",
    "gradient_clip_algorithm": "use optim.clip (the global gradient norm, sparse gradients included)",
}
# a limit of 0 steps or epochs, and what to set instead
ZERO_TRAINS_NOTHING = {
    "max_steps": "set a positive number of optimizer steps, or -1 for no limit (trainer.max_epochs decides)",
    "max_epochs": "set a positive number of epochs, or -1 for no limit (trainer.max_steps decides)",
}
# precisions that store the weights themselves in 16 bits: nothing could then be evaluated in float32
LOW_PRECISION_WEIGHTS = ("bf16-true", "16-true")


@dataclass
class TrainerOptions:
    """``trainer=default|cpu|ddp``: the Trainer arguments lmtrain sets, built as ``lightning.Trainer``."""

    _target_: str = "lightning.Trainer"
    max_epochs: int | None = field(default=13, metadata=NO_LIMIT)
    max_steps: int = field(default=-1, metadata=NO_LIMIT)  # > 0 ends training after this many optimizer steps
    # null: validate at the end of each epoch; N: every N steps; 0.25: 4 times per epoch
    val_check_interval: int | float | str | None = field(default=None, metadata={"batches": 1})
    # null with an integer val_check_interval: every N steps across epoch ends
    check_val_every_n_epoch: int | None = field(default=1, metadata=AT_LEAST_1)
    # null: whole epochs; N: N windows per epoch; 0.1: a tenth of each epoch
    limit_train_batches: int | float | None = field(default=None, metadata={"batches": 0})
    # null: the whole validation split (exact perplexity); N or a fraction: a part of it
    limit_val_batches: int | float | None = field(default=None, metadata={"batches": 0})
    limit_test_batches: int | float | None = field(default=None, metadata={"batches": 0})  # null: the whole split
    accelerator: str = "auto"
    strategy: str = "auto"
    devices: Any = 1
    num_nodes: int = field(default=1, metadata=AT_LEAST_1)
    precision: str | int = "32-true"
    # train/ppl, lr and tokens_per_sec; train/loss is written at every step
    log_every_n_steps: int = field(default=20, metadata=AT_LEAST_1)
    num_sanity_val_steps: int = field(default=0, metadata={"at_least": -1, "note": " (-1: all batches)"})
    enable_model_summary: bool = False
    accumulate_grad_batches: int = field(default=1, metadata=AT_LEAST_1)
    use_distributed_sampler: bool = False  # lmtrain splits the token streams across ranks itself

    @staticmethod
    def extra_keys(node: Any) -> tuple[str, list[str]]:
        """Any other argument of the Lightning Trainer."""
        import lightning

        return "lightning.Trainer", list(inspect.signature(lightning.Trainer).parameters)

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """What the config check refuses beyond the ranges: an argument lmtrain sets itself, 16-bit weights."""
        for key, advice in SET_BY_LMTRAIN.items():
            if key in node:
                yield f"{path}.{key} is set by lmtrain: {advice}"
        for key, instead in ZERO_TRAINS_NOTHING.items():
            if node.get(key) == 0:  # Lightning would skip training and the run test the untrained model
                yield f"{path}.{key}=0 trains nothing: {instead}"
        precision = str(node.get("precision"))
        if precision in LOW_PRECISION_WEIGHTS:
            yield (
                f"{path}.precision={precision} keeps the weights in 16 bits, so exact evaluation, a sampler's log q "
                "and the kernel tree's sums cannot stay float32: use trainer.precision=bf16-mixed (float32 weights, "
                "16-bit products; docs/workflow.md, mixed precision)"
            )


def epoch_batches(windows: int, limit: int | float | None) -> int:
    """Training batches in an epoch of ``windows`` windows under ``trainer.limit_train_batches`` = ``limit`` (an
    integer: at most that many; a fraction: that part of the epoch; None: all), as Lightning counts them
    (``num_training_batches``), also before Lightning knows them."""
    return min(windows, limit) if isinstance(limit, int) else int(windows * (1.0 if limit is None else limit))
