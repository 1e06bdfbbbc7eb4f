"""output=quadratic / output=rff: exact evaluation, sparse training with tree refresh, resume, configs."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import InstantiationException

from lmtrain.output import AbsoluteSampledSoftmax, CosineSampledSoftmax
from lmtrain.run.build import build_output
from lmtrain.sampler import QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel import KernelTree
from lmtrain.training.optim import build_optimizer
from tests.conftest import make_config
from tests.helpers import sample_from

pytestmark = pytest.mark.usefixtures("one_thread")


def train(output: torch.nn.Module, steps: int, seed: int = 0) -> list[float]:
    """A few sparse-SGD steps on random hidden states, refreshing the tree after each step."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = build_optimizer("sgd", [], output.sparse_parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        hidden = torch.randn(16, output.dim, generator=gen)
        target = torch.randint(0, output.num_classes, (16,), generator=gen)
        optimizer.zero_grad()
        loss = output.loss(hidden, target)
        loss.backward()
        assert output.weight.grad.is_sparse
        optimizer.step()
        output.after_optimizer_step()
        losses.append(loss.item())
    return losses


def assert_tree_matches_weights(output: torch.nn.Module) -> None:
    fresh = KernelTree(output.sampler.features, leaf_size=output.sampler.tree.store.leaf_size)
    fresh.rebuild(output.weight.detach())
    torch.testing.assert_close(output.sampler.tree.nodes, fresh.nodes, rtol=1e-5, atol=1e-5)


def test_absolute_softmax_scores_and_normalizes():
    torch.manual_seed(0)
    output = AbsoluteSampledSoftmax(50, 6, QuadraticSampler(leaf_size=4), num_samples=8, eval_chunk=16)
    output.weight.data[:, -1].uniform_(-0.5, 0.5)  # a non-zero bias
    hidden = torch.randn(3, 6)
    logits = (torch.cat([hidden, torch.ones(3, 1)], 1) @ output.weight.T).abs()  # |W h + b|
    every = torch.arange(50)
    log_p = torch.stack([output.log_prob(hidden, every[i].expand(3)) for i in range(50)], 1)  # (3, 50)
    torch.testing.assert_close(log_p, torch.log_softmax(logits, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_eps", [0.0, 1.0])
def test_cosine_softmax_scores_and_normalizes(norm_eps):
    torch.manual_seed(1)
    output = CosineSampledSoftmax(
        40, 5, RFFSampler(D=32, seed=0, unigram_share=0.0), num_samples=8, tau=7.0, norm_eps=norm_eps, eval_chunk=16
    )
    assert output.weight.shape == (40, 5)  # bias=False
    hidden = torch.randn(3, 5)
    unit = hidden / (hidden.square().sum(1, keepdim=True) + norm_eps**2).sqrt()  # exact h / |h| when eps = 0
    cos = unit @ torch.nn.functional.normalize(output.weight, dim=1).T
    log_p = torch.stack([output.log_prob(hidden, torch.full((3,), i)) for i in range(40)], 1)
    torch.testing.assert_close(log_p, torch.log_softmax(7.0 * cos, 1), rtol=1e-5, atol=1e-5)


def test_soft_normalization_bounds_the_hidden_gradient():
    """With norm_eps the gradient into a small hidden state stays below tau / eps; exact normalization's does not."""
    torch.manual_seed(3)
    grads = {}
    for eps in (0.0, 1.0):
        output = CosineSampledSoftmax(
            30, 8, RFFSampler(D=16, seed=0, unigram_share=0.0), num_samples=5, tau=10.0, norm_eps=eps
        )
        hidden = (0.01 * torch.randn(4, 8)).requires_grad_()  # |h| ~ 0.03, as a small LSTM output
        output.log_prob(hidden, torch.arange(4)).sum().backward()
        grads[eps] = hidden.grad.norm(dim=1).max().item()
    assert grads[1.0] <= 2 * 10.0 / 1.0  # |d log p / d unit| <= 2, times at most tau / eps
    assert grads[0.0] > 10 * grads[1.0]


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_sparse_training_keeps_the_tree_current(kind):
    torch.manual_seed(2)
    if kind == "quadratic":
        output = AbsoluteSampledSoftmax(300, 8, QuadraticSampler(), num_samples=20)
    else:
        output = CosineSampledSoftmax(300, 8, RFFSampler(D=64, seed=0, unigram_share=0.0), num_samples=20)
    before = output.sampler.tree.nodes.clone()
    losses = train(output, steps=5)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(output.sampler.tree.nodes, before)  # the hook refreshed it...
    assert_tree_matches_weights(output)  # ...to exactly what the current weights give


def test_resume_restores_omega_and_the_same_draws():
    torch.manual_seed(3)
    first = CosineSampledSoftmax(300, 8, RFFSampler(D=64, seed=11, unigram_share=0.0), num_samples=20)
    train(first, steps=3)
    state = {k: v.clone() for k, v in first.state_dict().items()}
    assert set(state) == {"weight", "sampler.tree.features.omega"}  # the tree itself is not stored

    resumed = CosineSampledSoftmax(300, 8, RFFSampler(D=64, seed=12, unigram_share=0.0), num_samples=20)
    omega = resumed.sampler.features.omega
    assert not torch.equal(omega, state["sampler.tree.features.omega"])
    resumed.load_state_dict(state)
    assert torch.equal(resumed.sampler.features.omega, first.sampler.features.omega)
    assert_tree_matches_weights(resumed)

    query = torch.randn(6, 8)
    torch.manual_seed(5)
    ids_a, log_q_a = sample_from(first.sampler, query, 50)
    torch.manual_seed(5)
    ids_b, log_q_b = sample_from(resumed.sampler, query, 50)
    assert torch.equal(ids_a, ids_b)
    torch.testing.assert_close(log_q_a, log_q_b)
    torch.manual_seed(6)  # and training goes on identically
    losses_a = train(first, steps=2, seed=9)
    torch.manual_seed(6)
    losses_b = train(resumed, steps=2, seed=9)
    assert losses_a == pytest.approx(losses_b, rel=1e-5)
    torch.testing.assert_close(first.weight, resumed.weight)


def test_configs_build_the_kernel_strategies():
    counts = torch.arange(500, 0, -1)
    cfg = make_config(["~data", "output=rff", "sampler.D=96", "seed=7"])
    output = build_output(cfg, num_classes=500, dim=16, counts=counts)
    assert isinstance(output, CosineSampledSoftmax) and isinstance(output.sampler, RFFSampler)
    features = output.sampler.features
    assert features.num_frequencies == 96 and features.nu == pytest.approx(4.0) and features.seed == 7
    assert features.omega.shape == (96, 16)
    assert output.options.tau == pytest.approx(1 / 0.3**2) and output.num_samples == 100

    cfg = make_config(["~data", "output=rff", "sampler.temperature=0.25", "output.tau=5"])
    output = build_output(cfg, num_classes=500, dim=16, counts=counts)
    assert output.sampler.features.nu == pytest.approx(16.0) and output.options.tau == 5.0

    cfg = make_config(["~data", "output=quadratic", "sampler.leaf_size=8"])
    output = build_output(cfg, num_classes=500, dim=16, counts=counts)
    assert isinstance(output, AbsoluteSampledSoftmax) and isinstance(output.sampler, QuadraticSampler)
    assert output.sampler.features.alpha == 100.0 and output.sampler.tree.bucket_size <= 8
    assert output.weight.shape == (500, 17)  # [W, b]

    with pytest.raises((ValueError, InstantiationException), match=r"output\.tau must be > 0"):
        build_output(make_config(["~data", "output=rff", "output.tau=0"]), 500, 16, counts)
    with pytest.raises((ValueError, InstantiationException), match="leaf_size must be"):
        build_output(make_config(["~data", "output=quadratic", "sampler.leaf_size=0"]), 500, 16, counts)


@pytest.mark.parametrize(
    "make",
    [
        lambda: CosineSampledSoftmax(300, 8, RFFSampler(D=64, seed=11, unigram_share=0.0), num_samples=20),
        lambda: AbsoluteSampledSoftmax(300, 8, QuadraticSampler(leaf_size=4), num_samples=2),
        lambda: AbsoluteSampledSoftmax(300, 8, QuadraticSampler(leaf_size=4), num_samples=2, shared_negatives=True),
    ],
    ids=["rff", "quadratic", "quadratic-shared"],
)
def test_a_checkpoint_write_leaves_the_tree_a_resumed_process_builds(make):
    """The tree kept by deltas differs from a rebuilt one by rounding: writing a checkpoint rebuilds it, so the writer
    and a process resumed from that checkpoint go on bit for bit alike."""
    torch.manual_seed(3)
    first = make()
    train(first, steps=12)
    drifted = first.sampler.tree.nodes.clone()
    first.before_checkpoint()  # what LanguageModel.on_save_checkpoint does
    assert not torch.equal(drifted, first.sampler.tree.nodes)  # the deltas had rounded differently
    resumed = make()
    resumed.load_state_dict({k: v.clone() for k, v in first.state_dict().items()})
    assert torch.equal(resumed.sampler.tree.nodes, first.sampler.tree.nodes)
    torch.manual_seed(6)
    losses_a = train(first, steps=6, seed=9)
    torch.manual_seed(6)
    losses_b = train(resumed, steps=6, seed=9)
    assert losses_a == losses_b
    assert torch.equal(first.weight, resumed.weight) and torch.equal(
        first.sampler.tree.nodes, resumed.sampler.tree.nodes
    )
