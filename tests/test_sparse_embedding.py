"""The input embedding's sparse row gradients (model.sparse_embedding) and training for a time budget
(max_train_seconds, train/seconds in metrics.csv)."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from lmtrain.run.build import build_module
from lmtrain.run.run import train


def module_of(cfg):
    return build_module(cfg, num_classes=50, counts=torch.ones(50), train_ids=None)


@pytest.mark.parametrize(
    ("overrides", "sparse"),
    [
        ([], True),  # sgd: sparse rows update exactly as dense ones would
        (["optim=adagrad"], True),
        (["optim=adam"], False),  # SparseAdam would train the embedding differently
        (["optim.weight_decay=0.0001"], False),  # decay moves every row
        (["+optim.momentum=0.9"], False),
        (["optim=adam", "model.sparse_embedding=true"], True),  # asked for: honoured
        (["model.sparse_embedding=false"], False),
    ],
)
def test_auto_makes_the_embedding_sparse_only_where_the_optimizer_treats_sparse_rows_as_dense(
    tiny_config, overrides, sparse
):
    module = module_of(tiny_config(*overrides))
    assert module.encoder.embedding.sparse is sparse
    assert (module.encoder.embedding.weight in module.sparse_parameters()) is sparse
    optimizer = module.configure_optimizers()["optimizer"]
    optimized = any(p is module.encoder.embedding.weight for group in optimizer.param_groups for p in group["params"])
    assert optimized  # every parameter is optimized, whichever path it takes
    assert "sparse_embedding" not in module.signature["model"]  # checkpoints of either kind load into both


def csv_rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]


def test_sparse_and_dense_embeddings_train_the_same_weights(tiny_config, tmp_path):
    """SGD with clipping: the sparse path must give the dense path's weights (up to float summation order)."""
    weights = {}
    for sparse in ("true", "false"):
        run = tmp_path / sparse
        cfg = tiny_config(
            f"model.sparse_embedding={sparse}", "trainer.max_steps=15", "test_after_fit=false", run_dir=run
        )
        train(cfg)
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        weights[sparse] = ckpt["state_dict"]
    assert weights["true"].keys() == weights["false"].keys()
    for name, value in weights["true"].items():
        torch.testing.assert_close(value, weights["false"][name], atol=2e-5, rtol=1e-4, msg=name)
    moved = weights["true"]["encoder.embedding.weight"]
    assert not torch.equal(moved, torch.zeros_like(moved))


def test_max_train_seconds_ends_training_then_validates_and_tests(tiny_config, tmp_path):
    budget = 1.5
    # a validation every 2 steps: at least two fall within the budget even on a loaded machine (slow steps)
    cfg = tiny_config(f"max_train_seconds={budget}", "trainer.max_epochs=1000", "trainer.val_check_interval=2")
    metrics = train(cfg)
    assert math.isfinite(metrics["test/ppl"])
    rows = csv_rows(tmp_path / "run" / "metrics.csv")
    seconds = [float(r["train/seconds"]) for r in rows if "val/ppl" in r]
    assert len(seconds) >= 2 and seconds == sorted(seconds) and seconds[0] > 0
    assert seconds[-1] >= budget  # stopped on the first step past the budget, then validated there
    steps = [int(r["step"]) for r in rows if "train/loss" in r]
    assert steps[-1] < 1000 * 188  # far from max_epochs
    val_steps = [int(r["step"]) for r in rows if "val/ppl" in r]
    assert val_steps[-1] == steps[-1]  # the closing validation is at the step where the budget ran out
    # training seconds exclude validation: the gaps between validations are roughly the training steps' time
    wall_per_step = seconds[-1] / (steps[-1] + 1)
    assert seconds[-1] < budget + 20 * wall_per_step + 1.0
