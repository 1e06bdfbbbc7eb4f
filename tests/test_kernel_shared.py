"""Batch-shared kernel negatives: one walk of the mixture query psi draws m ids from q-bar = (1/N) sum_i q_i."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from lmtrain.output import AbsoluteSampledSoftmax, CosineSampledSoftmax
from lmtrain.run.build import build_output
from lmtrain.sampler import QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel import KernelTree, RandomFourierFeatures
from lmtrain.training.optim import build_optimizer
from tests.conftest import make_config
from tests.helpers import draw_negatives
from tests.test_kernel_outputs import assert_tree_matches_weights
from tests.test_kernel_tree import PATHS, augmented, make_tree

pytestmark = pytest.mark.usefixtures("one_thread")


def queries(count: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([scale * torch.randn(count, d, generator=gen), torch.ones(count, 1)], 1)  # [h, 1]


def assert_draws_follow(ids: torch.Tensor, q: torch.Tensor) -> None:
    """Chi-square of the draws (m,) against q (n,), rare classes pooled so the approximation holds."""
    observed = torch.bincount(ids, minlength=q.numel()).double()
    expected = q.double() * ids.numel()
    big = expected >= 5
    obs, exp = observed[big], expected[big]
    if not big.all():
        obs = torch.cat([obs, observed[~big].sum().view(1)])
        exp = torch.cat([exp, expected[~big].sum().view(1)])
    assert chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-4


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", ["quadratic", "rff", "rff_nocache", "rff_bf16cache"])
def test_shared_draws_follow_log_q_bar(kind, path):
    n, d = 37, 5  # leaf_size 3 -> 16 buckets, the last 3 empty
    tree = make_tree(kind, augmented(n, d, seed=0), path)
    psi = tree.mixture(queries(6, d, seed=1))  # (F,)
    log_q = tree.log_q_all_mixture(psi)  # (n,)
    torch.testing.assert_close(log_q.exp().sum(), torch.tensor(1.0), rtol=0, atol=1e-5)
    torch.testing.assert_close(tree.log_q_mixture(psi, torch.arange(n).view(1, n)), log_q.view(1, n))  # any shape
    torch.manual_seed(2)
    if path.startswith("gpu"):  # the draws walked together with known ids (a step's targets), which keep log q-bar
        known = torch.arange(n).flip(0)  # (n,) every class, the empty buckets' neighbours included
        ids, drawn = tree.backend.sample_mixture(psi, 40_000, None, known)  # (40,000 + n,) each
        assert torch.equal(ids[40_000:], known)
        torch.testing.assert_close(drawn[40_000:], log_q.flip(0), rtol=0, atol=1e-5)
        ids, drawn = ids[:40_000], drawn[:40_000]
    else:
        ids, drawn = tree.sample_mixture(psi, 40_000)
    assert ids.shape == drawn.shape == (40_000,) and ids.min() >= 0 and ids.max() < n
    torch.testing.assert_close(drawn, log_q[ids], rtol=0, atol=1e-5)  # log q-bar of what was drawn
    assert_draws_follow(ids, log_q.exp())


@pytest.mark.parametrize("path", ["gather", "dense"])
def test_quadratic_mixture_equals_the_brute_force_mixture(path):
    n, d, count = 300, 6, 9
    weight = augmented(n, d, seed=4)
    tree = make_tree("quadratic", weight, path, leaf_size=7)
    query = queries(count, d, seed=5, scale=3.0)  # large logits: Z_i ~ 10^5, far above eps
    kernel = 100.0 * (query.double() @ weight.double().T) ** 2 + 1.0  # (N, n)
    brute = (kernel / kernel.sum(1, keepdim=True)).mean(0)  # (1/N) sum_i K(h_i, w_j) / sum_k K(h_i, w_k)
    psi = tree.mixture(query)
    torch.testing.assert_close(tree.log_q_all_mixture(psi).double().exp(), brute, rtol=1e-4, atol=1e-8)
    ids = torch.randint(0, n, (4, 11))
    torch.testing.assert_close(tree.log_q_mixture(psi, ids).double().exp(), brute[ids], rtol=1e-4, atol=1e-8)


def test_rff_q_bar_with_binding_clamps_is_a_distribution_that_draws_follow():
    """D = 2 frequencies: node and class estimates are often negative, so the eps clamps bind."""
    n, d = 60, 4
    tree = KernelTree(RandomFourierFeatures(D=2, nu=4.0, seed=0), leaf_size=4, eps=1e-3)
    tree.rebuild(augmented(n, d, seed=6))
    psi = tree.mixture(queries(5, d, seed=7))
    rows, valid = tree.store.members(torch.arange(tree.num_buckets))
    class_scores = tree.features.inner(psi, rows)[valid]  # (n,)
    node_scores = tree.nodes[1:] @ psi
    assert (class_scores < tree.store.eps).any() and (node_scores[tree.store.floor[1:] > 0] < tree.store.eps).any()
    log_q = tree.log_q_all_mixture(psi)
    torch.testing.assert_close(log_q.double().exp().sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.manual_seed(8)
    ids, drawn = tree.sample_mixture(psi, 40_000)
    torch.testing.assert_close(drawn, log_q[ids], rtol=0, atol=1e-5)
    assert_draws_follow(ids, log_q.exp())


def shared_layer(kind: str, n: int, d: int, m: int, **options) -> torch.nn.Module:
    options = {"num_samples": m, "shared_negatives": True, **options}
    if kind == "quadratic":
        return AbsoluteSampledSoftmax(n, d, QuadraticSampler(leaf_size=4), **options)
    return CosineSampledSoftmax(n, d, RFFSampler(D=32, seed=0, unigram_share=0.0), **options)


@pytest.mark.parametrize("remove_hits", [True, False])
@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_loss_equals_the_exact_estimator_with_proposal_q_bar(kind, remove_hits):
    torch.manual_seed(0)
    n, d, m, count = 40, 6, 12, 10
    layer = shared_layer(kind, n, d, m, remove_accidental_hits=remove_hits)
    if kind == "quadratic":
        layer.weight.data[:, -1].uniform_(-0.5, 0.5)
        layer.sampler.update(layer.weight.detach())
    assert layer.sampler.shared
    hidden, target = torch.randn(count, d), torch.randint(0, n, (count,))
    query = layer.query(hidden)
    torch.manual_seed(1)
    ids, log_q, _ = draw_negatives(layer, hidden)
    assert ids.shape == log_q.shape == (m,)  # one set of m for the batch
    log_q_bar = layer.sampler.tree.log_q_all_mixture(layer.sampler.tree.mixture(query))  # (n,)
    torch.testing.assert_close(log_q, log_q_bar[ids])
    target_log_q = layer.propose(query, None, target).draw(m).target_log_q
    torch.testing.assert_close(target_log_q, log_q_bar[target].unsqueeze(1))
    torch.manual_seed(1)
    loss = layer.loss(hidden, target)

    logits = layer.score(query, layer.weight).detach()  # (N, n)
    o_t, o_s = logits.gather(1, target[:, None]), logits[:, ids]  # (N, 1), (N, m)
    q_bar = log_q_bar.exp()
    hits = ids[None, :] == target[:, None]
    if remove_hits:
        kept = (m - hits.sum(1, keepdim=True)).clamp(min=1).float()
        o_s = (o_s - torch.log(kept * q_bar[ids] / (1 - q_bar[target])[:, None])).masked_fill(hits, -math.inf)
    else:
        o_s = o_s - torch.log(m * q_bar[ids])
    expected = (torch.logsumexp(torch.cat([o_t, o_s], 1), 1) - o_t[:, 0]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_a_shared_step_touches_targets_and_m_rows_and_the_tree_stays_current(kind):
    torch.manual_seed(2)
    n, d, m, count = 300, 8, 20, 16
    layer = shared_layer(kind, n, d, m)
    optimizer = build_optimizer("sgd", [], layer.sparse_parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        hidden, target = torch.randn(count, d, generator=gen), torch.randint(0, n, (count,), generator=gen)
        optimizer.zero_grad()
        state = torch.get_rng_state()
        ids, _, _ = draw_negatives(layer, hidden)
        torch.set_rng_state(state)  # the loss draws the same ids
        layer.loss(hidden, target).backward()
        touched = set(layer.weight.grad.coalesce().indices()[0].tolist())
        assert touched == set(target.tolist()) | set(ids.tolist())
        optimizer.step()
        layer.after_optimizer_step()
    assert_tree_matches_weights(layer)


def test_unique_draws_work_with_a_shared_kernel_proposal():
    torch.manual_seed(4)
    layer = shared_layer("quadratic", 50, 5, 10, unique=True)
    hidden = torch.randn(7, 5)
    ids, log_q, tries = draw_negatives(layer, hidden)
    assert ids.unique().numel() == 10 and tries >= 10
    log_q_bar = layer.sampler.tree.log_q_all_mixture(layer.sampler.tree.mixture(layer.query(hidden)))
    torch.testing.assert_close(log_q, log_q_bar[ids])
    assert torch.isfinite(layer.loss(hidden, torch.arange(7)))


@pytest.mark.parametrize("name", ["quadratic", "rff"])
def test_configs_default_to_per_position_and_switch_to_shared(name):
    counts = torch.arange(200, 0, -1)
    output = build_output(make_config(["~data", f"output={name}"]), 200, 8, counts)
    assert not output.sampler.shared and output.shared_negatives is False
    output = build_output(make_config(["~data", f"output={name}", "output.shared_negatives=true"]), 200, 8, counts)
    assert output.sampler.shared and output.shared_negatives is True
    ids, log_q, _ = draw_negatives(output, torch.randn(5, 8))
    assert ids.shape == log_q.shape == (output.num_samples,)


def test_one_proposal_per_step_holds_the_batch_mixture():
    sampler = RFFSampler(D=16, seed=0, unigram_share=0.0)
    sampler.share_negatives(True)
    weight = torch.randn(40, 5)
    sampler.update(weight)
    hidden = torch.randn(6, 5)
    proposal = sampler.propose(hidden)  # the step's proposal: its draws and its targets' log q-bar
    torch.testing.assert_close(proposal.psi, sampler.tree.mixture(hidden))
    ids, log_q, _, _ = proposal.draw(30)
    torch.testing.assert_close(log_q, proposal.log_q(ids))
    torch.testing.assert_close(proposal.log_q(ids), sampler.tree.log_q_mixture(proposal.psi, ids))
    weight[3] += 1.0
    sampler.update(weight, torch.tensor([3]))  # the tree changed: the next step's proposal follows it
    torch.testing.assert_close(sampler.propose(hidden).psi, sampler.tree.mixture(hidden))
