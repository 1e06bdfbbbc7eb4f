"""A training step of a real Lightning run waits for the device once: the loss value it reads for the non-finite
check and all of the step's metrics (``lmtrain.training.step.window_loss``); Lightning's hooks and logging, the
progress bar and lmtrain's callbacks read nothing more. Counted on the CPU with ``DispatchCounter``, where a read of
a tensor's value is the same operator that waits for a GPU. The run takes a GPU's step forms (``step_forms=gpu``):
in a CPU's the kernel tree's walk and update and torch's adaptive softmax size tensors by the data (``unique``,
``nonzero``), which a GPU would have to report back."""

from __future__ import annotations

import pytest

from lmtrain.run.run import train
from tests.helpers import CountStepSyncs

# the full softmax (one form on every device), and the strategies whose GPU forms differ from their CPU ones: a
# kernel sampler (the tree's fixed backend: its draws, log q and update) and the adaptive softmax (its fixed-shape
# loss)
OUTPUTS = {"full": [], "rff": ["output=rff", "sampler.D=32"], "adaptive": ["output=adaptive"]}


@pytest.mark.parametrize("output", list(OUTPUTS))
def test_one_host_sync_per_training_step(tiny_config, output):
    """30 steps with the metrics written every 4 steps, the progress bar on, validation and a checkpoint every 10
    steps: every step in between reads the device exactly once (the old step read it 4-6 times: the non-finite
    check, the logged loss, and Lightning reading each progress-bar tensor back after every batch)."""
    cfg = tiny_config(
        *OUTPUTS[output],
        "trainer.max_steps=30",
        "trainer.val_check_interval=10",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=4",
        "checkpoint_every_n_steps=10",
        "progress_bar=true",
        "test_after_fit=false",
        "+callbacks.syncs._target_=tests.helpers.CountStepSyncs",
        "step_forms=gpu",
    )
    train(cfg)
    counted = CountStepSyncs.last
    assert counted is not None and len(counted.marks) == 31  # every step's start, then the end of training
    quiet = counted.per_step()
    assert len(quiet) >= 25 and {3, 7, 11, 15} <= set(quiet)  # steps that write ppl, lr and tokens/s among them
    assert counted.busy >= {9, 19, 29}  # the steps that validated were counted apart
    assert set(quiet.values()) == {1}, quiet
