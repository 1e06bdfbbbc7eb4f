"""Sparse row path: same parameters as the dense path, sparse-aware clipping, mixed Adam, the benchmark."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lmtrain.config import ConfigError, compose_config
from lmtrain.output import NCE, SampledSoftmax
from lmtrain.output.rows import gather_rows, row_scores
from lmtrain.sampler import UniformSampler, UnigramSampler
from lmtrain.training.optim import MixedOptimizer, build_optimizer, clip_grad_norm

N_CLASSES, DIM, IN = 50, 6, 4
ROOT = Path(__file__).resolve().parent.parent


class Tiny(nn.Module):
    """A dense encoder (Linear) and a sampled output layer: the split the app's optimizer sees."""

    def __init__(self, output_cls=SampledSoftmax, sparse: bool = True, sampler=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(IN, DIM)
        sampler = sampler or UniformSampler(N_CLASSES)
        # one set of negatives for the batch leaves rows untouched; the biases start at zero (no counts here)
        options = {"num_samples": 8, "sparse": sparse, "shared_negatives": True, "bias_init": "zero"}
        self.output = output_cls(N_CLASSES, DIM, sampler, **options)

    def optimizer(self, name: str, lr: float = 0.5, **kwargs) -> torch.optim.Optimizer:
        sparse = self.output.sparse_parameters()
        dense = [p for p in self.parameters() if all(p is not s for s in sparse)]
        return build_optimizer(name, dense, sparse, lr=lr, **kwargs)

    def train_step(self, optimizer: torch.optim.Optimizer, seed: int, clip: float | None = 0.5) -> torch.Tensor:
        gen = torch.Generator().manual_seed(1000 + seed)
        inputs, target = torch.randn(10, IN, generator=gen), torch.randint(N_CLASSES, (10,), generator=gen)
        calls = []

        def closure() -> torch.Tensor:
            calls.append(1)
            optimizer.zero_grad(set_to_none=True)
            torch.manual_seed(seed)  # the same negatives on both paths
            loss = self.output.loss(self.encoder(inputs), target)
            loss.backward()
            if clip is not None:
                clip_grad_norm(self.parameters(), clip)
            return loss

        loss = optimizer.step(closure)
        assert len(calls) == 1  # Lightning passes a closure: it must run exactly once
        self.output.after_optimizer_step()
        return loss


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("output_cls", [SampledSoftmax, NCE])
def test_sparse_and_dense_paths_give_the_same_parameters(name, output_cls):
    counts = torch.arange(N_CLASSES, 0, -1)
    sparse = Tiny(output_cls, sparse=True, sampler=UnigramSampler(N_CLASSES, counts))
    dense = Tiny(output_cls, sparse=False, sampler=UnigramSampler(N_CLASSES, counts))
    initial = sparse.output.weight.detach().clone()
    opt_sparse, opt_dense = sparse.optimizer(name), dense.optimizer(name)
    for step in range(4):
        sparse.train_step(opt_sparse, step)
        dense.train_step(opt_dense, step)
        assert sparse.output.weight.grad.is_sparse and not dense.output.weight.grad.is_sparse
    for (key, a), b in zip(sparse.state_dict().items(), dense.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    changed = (sparse.output.weight != initial).any(1)
    assert 0 < changed.sum() < N_CLASSES  # some rows were trained, untouched rows are bit-for-bit the same


def test_row_scores_match_a_written_out_dot_product_in_value_and_gradient():
    """row_scores writes its own backward: a wrong outer product or a transposed query gradient fails here."""
    torch.manual_seed(0)
    query = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(5, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(row_scores, (query, rows))
    assert torch.autograd.gradcheck(row_scores, (query, rows[:, :1]))  # one row per position: its own backward
    weight = torch.randn(10, 3, requires_grad=True)
    ids = torch.tensor([[1, 1, 7], [2, 9, 1]])  # a repeated row: its sparse entries add up
    h = torch.randn(2, 3, requires_grad=True)
    (row_scores(h, gather_rows(weight, ids)) * torch.arange(6.0).view(2, 3)).sum().backward()
    sparse_grad, h_grad = weight.grad.to_dense(), h.grad
    weight.grad, h.grad = None, None
    (torch.einsum("nd,nkd->nk", h, weight[ids]) * torch.arange(6.0).view(2, 3)).sum().backward()
    torch.testing.assert_close(sparse_grad, weight.grad)
    torch.testing.assert_close(h_grad, h.grad)


def test_clip_grad_norm_handles_sparse_gradients_with_duplicate_rows():
    param, dense_param = nn.Parameter(torch.zeros(6, 3)), nn.Parameter(torch.zeros(2))
    indices = torch.tensor([[1, 4, 1]])  # row 1 twice: the duplicates add up
    values = torch.tensor([[1.0, 2.0, 2.0], [0.0, 3.0, 0.0], [1.0, 0.0, 2.0]])
    param.grad = torch.sparse_coo_tensor(indices, values, (6, 3))
    dense_param.grad = torch.tensor([4.0, 0.0])
    as_dense = param.grad.to_dense()
    expected = torch.sqrt(as_dense.pow(2).sum() + 16.0)
    total = clip_grad_norm([param, dense_param], 1.0)
    torch.testing.assert_close(total, expected)
    assert param.grad.is_sparse and param.grad.coalesce().indices().shape[1] == 2  # still only two rows
    clipped = torch.sqrt(param.grad.to_dense().pow(2).sum() + dense_param.grad.pow(2).sum())
    torch.testing.assert_close(clipped, torch.tensor(1.0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(param.grad.to_dense(), as_dense / expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("sparse_optimizer", "child"), [("sparse_adam", torch.optim.SparseAdam), ("adagrad", torch.optim.Adagrad)]
)
def test_adam_with_sparse_rows_is_one_checkpointable_optimizer(sparse_optimizer, child):
    model = Tiny()
    opt = model.optimizer("adam", lr=0.01, sparse_optimizer=sparse_optimizer)
    assert isinstance(opt, MixedOptimizer) and isinstance(opt, torch.optim.Optimizer)
    assert [type(o) for o in opt.optimizers] == [torch.optim.Adam, child]
    initial = model.output.weight.detach().clone()
    for step in range(3):
        model.train_step(opt, step)
    assert 0 < (model.output.weight != initial).any(1).sum() < N_CLASSES  # only touched rows moved

    resumed = Tiny()
    resumed.load_state_dict(model.state_dict())
    resumed_opt = resumed.optimizer("adam", lr=0.01, sparse_optimizer=sparse_optimizer)
    resumed_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # as if saved to disk
    model.train_step(opt, 3)
    resumed.train_step(resumed_opt, 3)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)

    schedule = torch.optim.lr_scheduler.LambdaLR(resumed_opt, lambda epoch: 0.5**epoch)
    resumed_opt.step()  # no closure: grads from the last step
    schedule.step()
    assert [g["lr"] for o in resumed_opt.optimizers for g in o.param_groups] == [0.005, 0.005]


def test_lightning_trains_and_resumes_with_the_mixed_optimizer(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Tiny()

        def training_step(self, batch, batch_idx):
            inputs, target = batch
            return self.net.output.loss(self.net.encoder(inputs), target)

        def configure_optimizers(self):
            opt = self.net.optimizer("adam", lr=0.01)
            return {
                "optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5**e),
            }

        def configure_gradient_clipping(self, optimizer, *args, **kwargs) -> None:
            clip_grad_norm(self.parameters(), 1.0)

        def optimizer_step(self, *args, **kwargs) -> None:
            super().optimizer_step(*args, **kwargs)
            self.net.output.after_optimizer_step()

    gen = torch.Generator().manual_seed(0)
    data = DataLoader(
        TensorDataset(torch.randn(40, IN, generator=gen), torch.randint(N_CLASSES, (40,), generator=gen)),
        batch_size=10,
    )
    options = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        "default_root_dir": str(tmp_path),
    }
    first = L.Trainer(max_steps=6, enable_checkpointing=False, **options)
    module = Module()
    first.fit(module, data)
    first.save_checkpoint(tmp_path / "step6.ckpt")
    resumed, trainer = Module(), L.Trainer(max_steps=8, enable_checkpointing=False, **options)
    trainer.fit(resumed, data, ckpt_path=str(tmp_path / "step6.ckpt"))
    opt = trainer.optimizers[0]
    assert isinstance(opt, MixedOptimizer) and trainer.global_step == 8
    assert opt.state[resumed.net.output.weight]["step"] == 8  # the SparseAdam state was restored
    assert opt.optimizers[1].param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**2)  # after 2 epochs of 4 steps


def test_sparse_lr_sets_the_output_rows_learning_rate():
    model = Tiny()
    opt = model.optimizer("sgd", lr=0.5, sparse_lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.1]


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("sgd", {"weight_decay": 1e-4}, "weight_decay=0.0001 would update every row of the sparse-gradient weights"),
        ("sgd", {"momentum": 0.9}, "momentum=0.9 would update every row of the sparse-gradient weights"),
        # built without a config (scripts, tests): the schema's choices are still the check, not a silent adam
        ("rmsprop", {}, r"^optim\.name must be one of 'sgd', 'adagrad', 'adam', got 'rmsprop'$"),
        ("adam", {"sparse_optimizer": "lamb"}, r"^optim\.sparse_optimizer must be one of 'sparse_adam', 'adagrad', "),
    ],
)
def test_bad_optimizer_options_raise_value_error(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Tiny().optimizer(name, **kwargs)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.name=rmsprop", r"optim\.name must be one of 'sgd', 'adagrad', 'adam', got 'rmsprop'"),
        ("optim.sparse_optimizer=lamb", r"optim\.sparse_optimizer must be one of 'sparse_adam', 'adagrad'"),
        ("optim.schedule.kind=cosine", r"optim\.schedule\.kind must be one of 'step', 'plateau', 'none'"),
    ],
)
def test_out_of_range_optimizer_options_are_refused_by_the_schema(override, message):
    with pytest.raises(ConfigError, match=message):  # checked once, before anything is built
        compose_config(["optim=adam", override])


def test_dense_outputs_keep_weight_decay():
    model = Tiny(sparse=False)
    opt = model.optimizer("adam", lr=0.01, weight_decay=1e-4)
    assert type(opt) is torch.optim.Adam and opt.param_groups[0]["weight_decay"] == 1e-4


def test_bench_quick_mode_writes_the_expected_json(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_output", ROOT / "scripts" / "bench_output.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    argv = "--quick --sizes 300,200 --positions 12 --dim 8 --num-samples 5 --repeats 3 --outputs full,uniform"
    bench.main([*argv.split(), "--json", str(out)])
    data = json.loads(out.read_text())
    assert set(data) == {"config", "results", "scaling", "ratios", "targets"}
    cells = {(r["output"], r["n"]) for r in data["results"]}
    assert cells == {(o, n) for o in ("plain_sampled", "full", "uniform") for n in (200, 300)}
    for row in data["results"]:
        assert row["repeats"] >= 3 and row["median_s"] > 0 and row["iqr_s"] >= 0
    assert set(data["ratios"]["uniform"]) == {"plain_over", "full_over", "scaling", "scaling_interleaved"}
    assert data["scaling"]["uniform"]["sizes"] == [200, 300] and data["scaling"]["uniform"]["ratio"] > 0
    assert data["targets"]["n"] == 300 and data["targets"]["plain_over_uniform"] > 0
