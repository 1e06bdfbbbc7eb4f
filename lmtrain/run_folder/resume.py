"""Exact resume: before the fit, the checkpoint checked and the run's metrics.csv carried over (``prepare_resume``);
what a checkpoint carries beyond the weights, the optimizer and Lightning's loops, and how a fit takes it back. Which
checkpoint a run resumes: ``ckpt_path.py``.

A checkpoint's ``lmtrain`` entry (``checkpoint_entry``) holds

- ``batches_done``: the training windows finished in the current epoch;
- ``state``: the carried LSTM state (h, c) after them, for all rows of the global batch (gathered from the ranks);
- ``rng``: the torch (CPU and, in use, every CUDA device), numpy and python RNG states (``rng.py``);
- ``train_seconds``: training time so far, validation left out (the clock of ``max_train_seconds``);
- ``kept_state``, only in a checkpoint written off the run's step schedule (a stop's, a timed one): the output's
  derived state as the steps kept it (``OutputLayer.kept_state``: a kernel tree's sums), which such a checkpoint
  carries instead of rebuilding it, so that writing it changes nothing in the run; a resume puts it back over the
  state its load rebuilt, at the first training batch;
- ``signature`` and ``wandb_id``: read before the fit starts, by ``prepare_resume`` (refuse a checkpoint of another
  model, continue the same W&B run).

When a fit resumes, ``resume_fit`` reads that entry back and sets the data position, and ``LanguageModel`` applies
the rest: the time at once, the carried state and window count when the checkpoint was taken mid-epoch, and the RNG
states at the first training batch (creating the loader iterator may draw random numbers, so earlier would be
undone). Lightning restores the weights, the optimizer, the schedule and its loop counters itself; the progress
bar's position after a resume is display only (``lmtrain.run.progress.ProgressBar`` reads the global step).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only

from lmtrain.common.trainer_options import epoch_batches
from lmtrain.model import State
from lmtrain.run_folder.checkpoints import check_compatible, read_checkpoint
from lmtrain.run_folder.ckpt_path import shown_path
from lmtrain.run_folder.metrics_csv import drop_rows_from
from lmtrain.run_folder.rng import get_rng_states

log = logging.getLogger("lmtrain")


def prepare_resume(ckpt: Path, signature: dict[str, Any], run_dir: Path) -> str | None:
    """Check that ``ckpt`` fits this model (``signature``), carry its run's metrics.csv over into ``run_dir`` (a
    copy: the old file is never touched) without the rows the resumed run logs again (``drop_rows_from``), and
    return its W&B run id. Only rank 0 touches metrics.csv (the one that writes it)."""
    saved = read_checkpoint(ckpt)
    check_compatible(saved, signature, ckpt)
    previous_csv, metrics = ckpt.parent.parent / "metrics.csv", run_dir / "metrics.csv"
    if rank_zero_only.rank == 0:
        if previous_csv.is_file() and previous_csv.parent != run_dir:  # keep the history; never touch the old file
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(previous_csv, metrics)
        step = int(saved.get("global_step", 0))
        if metrics.is_file() and (dropped := drop_rows_from(metrics, step)):
            log.info("metrics.csv: %d rows from step %d on, which this run logs again, dropped", dropped, step)
    log.info("resuming from %s", ckpt)
    if ckpt.parent.name == "checkpoints" and ckpt.parent.parent != run_dir:
        log.info(
            "the run goes on in the new folder %s (its metrics.csv copied there, the same W&B run), not in %s: "
            "its best checkpoint so far stays there; hydra.run.dir=%s ckpt_path=last goes on in that folder",
            shown_path(run_dir),
            shown_path(ckpt.parent.parent),
            shown_path(ckpt.parent.parent),
        )
    return saved["lmtrain"].get("wandb_id")


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
    module: L.LightningModule, batches_done: int, state: State | None, kept: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``lmtrain`` entry of a checkpoint written now (see the module docstring); ``module``: the LanguageModel,
    whose signature, W&B run id and training clock it records."""
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
    data = trainer.datamodule.data  # lmtrain.run.lightning_data.LightningData's data module
    data.set_train_epoch(int(checkpoint.get("epoch", 0)))  # its windows (variable_bptt: by epoch)
    if not finished and 0 < done < epoch_batches(data.num_train_windows, trainer.limit_train_batches):
        data.train_sampler.set_start(done)
        resumed.mid_epoch, resumed.batches_done = True, done
        resumed.state = rank_block(saved["state"], trainer)  # this rank's rows of the global batch
    return resumed


def global_state(state: State | None, module: L.LightningModule) -> State | None:
    """The carried training state for all rows of the global batch: under DDP gathered from the ranks."""
    if state is None or module.trainer.world_size <= 1:
        return state
    h, c = (module.all_gather(s) for s in state)  # (world, layers, B / world, d): rank blocks in row order
    return h.transpose(0, 1).flatten(1, 2), c.transpose(0, 1).flatten(1, 2)  # (layers, B, d)


def rank_block(state: State | None, trainer: L.Trainer) -> State | None:
    """This rank's block of rows of a global batch's carried state (``global_state`` inverted)."""
    if state is None or trainer.world_size <= 1:
        return state
    rows, rank = state[0].shape[1] // trainer.world_size, trainer.global_rank
    return state[0][:, rank * rows : (rank + 1) * rows], state[1][:, rank * rows : (rank + 1) * rows]
