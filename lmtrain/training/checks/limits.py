"""The ranges of counts and rates that a type hint cannot express, by dotted config key."""

from __future__ import annotations

from collections.abc import Callable

Check = Callable[[float], "str | None"]


def at_least(low: float, note: str = "") -> Check:
    return lambda v: None if v >= low else f"must be >= {low}{note}"


def above(low: float) -> Check:
    return lambda v: None if v > low else f"must be > {low}"


def below(high: float) -> Check:
    return lambda v: None if v < high else f"must be < {high}"


def count_or_fraction(least: int) -> Check:
    """An integer number of batches >= least, or a float fraction of the epoch in (0, 1] (or [0, 1] for least 0)."""

    def check(v: float) -> str | None:
        if isinstance(v, int):
            return None if v >= least else f"must be a number of batches >= {least} or a fraction of the epoch"
        ok = 0.0 <= v <= 1.0 if least == 0 else 0.0 < v <= 1.0
        return None if ok else "must be a fraction of the epoch in (0, 1] or an integer number of batches"

    return check


LIMITS: dict[str, tuple[Check, ...]] = {
    "trainer.max_epochs": (at_least(-1, " (-1: no limit)"),),
    "trainer.min_epochs": (at_least(0),),
    "trainer.max_steps": (at_least(-1, " (-1: no limit)"),),
    "trainer.min_steps": (at_least(0),),
    "trainer.log_every_n_steps": (at_least(1),),
    "trainer.check_val_every_n_epoch": (at_least(1),),
    "trainer.num_sanity_val_steps": (at_least(-1, " (-1: all batches)"),),
    "trainer.accumulate_grad_batches": (at_least(1),),
    "trainer.num_nodes": (at_least(1),),
    "trainer.val_check_interval": (count_or_fraction(1),),
    "trainer.limit_train_batches": (count_or_fraction(0),),
    "trainer.limit_val_batches": (count_or_fraction(0),),
    "trainer.limit_test_batches": (count_or_fraction(0),),
    "checkpoint_every_n_steps": (at_least(1),),
    "max_train_seconds": (above(0),),
    "optim.lr": (above(0),),
    "optim.clip": (above(0),),
    "optim.weight_decay": (at_least(0),),
    "optim.schedule.decay": (above(0),),
    "optim.schedule.start": (at_least(0),),
    "optim.schedule.patience": (at_least(0),),
    "model.emb_dim": (at_least(1),),
    "model.hidden_dim": (at_least(1),),
    "model.num_layers": (at_least(1),),
    "model.dropout": (at_least(0), below(1)),
    "model.init_range": (above(0),),
    "data.batch_size": (at_least(1),),
    "data.eval_batch_size": (at_least(1),),
    "data.bptt": (at_least(1),),
    "output.num_samples": (at_least(1),),
}
