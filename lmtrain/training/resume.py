"""Exact resume: what a checkpoint carries beyond the weights, the optimizer and Lightning's loops, in one place.

A checkpoint's ``lmtrain`` entry (``checkpoint_entry``) holds

- ``batches_done``: the training windows finished in the current epoch;
- ``state``: the carried LSTM state (h, c) after them, for all rows of the global batch (gathered from the ranks);
- ``rng``: the torch (CPU and, in use, every CUDA device), numpy and python RNG states (``training.rng``);
- ``train_seconds``: training time so far, validation left out (the clock of ``max_train_seconds``);
- ``kept_state``, only in a checkpoint written off the run's step schedule (a stop's, a timed one): the output's
  derived state as the steps kept it (``OutputLayer.kept_state``: a kernel tree's sums), which such a checkpoint
  carries instead of rebuilding it, so that writing it changes nothing in the run; a resume puts it back over the
  state its load rebuilt, at the first training batch;
- ``signature`` and ``wandb_id``: read before the fit starts, by ``run_folder.prepare_resume`` (refuse a checkpoint
  of another model, continue the same W&B run), not here.

When a fit resumes, ``resume_fit`` reads that entry back and sets the data position, and ``LanguageModel`` applies
the rest: the time at once, the carried state and window count when the checkpoint was taken mid-epoch, and the RNG
states at the first training batch (creating the loader iterator may draw random numbers, so earlier would be
undone). Lightning restores the weights, the optimizer, the schedule and its loop counters itself; the progress
bar's position after a resume is display only (``progress.ProgressBar`` reads the global step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L

from lmtrain.model import State
from lmtrain.training.ddp import global_state, rank_block
from lmtrain.training.metered_module import MeteredModule
from lmtrain.training.rng import get_rng_states


@dataclass
class Resumed:
    """What a resumed fit takes from its checkpoint. ``mid_epoch``: the checkpoint was taken inside an epoch, which
    continues at window ``batches_done`` with this rank's rows of the carried ``state``; otherwise the next epoch
    starts afresh (``batches_done`` 0, no state)."""

    rng: dict[str, Any]
    train_seconds: float
    mid_epoch: bool = False
    batches_done: int = 0
    state: State | None = None
    kept: dict[str, Any] = field(default_factory=dict)  # the output's derived state as kept (``kept_state``)


def checkpoint_entry(
    module: MeteredModule, batches_done: int, state: State | None, kept: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``lmtrain`` entry of a checkpoint written now: see the module docstring."""
    entry = {
        "batches_done": batches_done,
        "state": global_state(state, module),
        "signature": getattr(module, "signature", {}),
        "wandb_id": getattr(module, "wandb_id", None),
        "rng": get_rng_states(),
        "train_seconds": module.training_seconds(),
    }
    return entry | {"kept_state": kept} if kept else entry


def resume_fit(checkpoint: dict[str, Any], trainer: L.Trainer) -> Resumed | None:
    """What a fit resumed from ``checkpoint`` restores (None for a checkpoint without an ``lmtrain`` entry). A
    mid-epoch resume also sets the training sampler to start at the next window: this runs before Lightning creates
    (and prefetches from) the loader iterator, and the window count is the training loop's own, as the loader runs a
    window ahead of training."""
    saved = checkpoint.get("lmtrain")
    if saved is None:
        return None
    resumed = Resumed(saved["rng"], float(saved.get("train_seconds", 0.0)), kept=saved.get("kept_state", {}))
    # Lightning marks an epoch completed when max_steps stopped it: then the next epoch starts afresh
    epoch = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    finished = epoch.get("completed", 0) >= epoch.get("ready", 0)
    done = saved["batches_done"]
    trainer.datamodule.set_train_epoch(int(checkpoint.get("epoch", 0)))  # its windows (variable_bptt: by epoch)
    if not finished and 0 < done < batches_per_epoch(trainer):
        trainer.datamodule.train_sampler.set_start(done)
        resumed.mid_epoch, resumed.batches_done = True, done
        resumed.state = rank_block(saved["state"], trainer)  # this rank's rows of the global batch
    return resumed


def batches_per_epoch(trainer: L.Trainer) -> int:
    """Lightning's num_training_batches, computed before Lightning knows it (windows and limit_train_batches)."""
    windows = trainer.datamodule.num_train_windows
    limit = trainer.limit_train_batches
    return min(windows, limit) if isinstance(limit, int) else int(windows * (1.0 if limit is None else limit))
