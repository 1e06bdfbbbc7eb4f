"""sampler.unigram_share: kernel proposals mixed with the training unigram, q = (1 - s') q_kernel + s' u."""

from __future__ import annotations

import pytest
import torch

from lmtrain.sampler import QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel import sampler as kernel_sampler
from lmtrain.sampler.kernel import walk_backend
from tests.helpers import log_q_all_from, log_q_from, sample_from
from tests.test_kernel_shared import assert_draws_follow, queries
from tests.test_kernel_tree import augmented

pytestmark = pytest.mark.usefixtures("one_thread")

N_CLASSES, DIM = 120, 6


def make_sampler(kind: str, share: float, shared: bool = False) -> RFFSampler | QuadraticSampler:
    counts = torch.arange(N_CLASSES, 0, -1).double() ** 1.5  # a Zipf-like unigram, far from the kernel's q
    options = {"unigram_share": share, "num_classes": N_CLASSES, "counts": counts, "leaf_size": 4}
    sampler = RFFSampler(D=64, seed=3, **options) if kind == "rff" else QuadraticSampler(**options)
    sampler.share_negatives(shared)
    sampler.update(augmented(N_CLASSES, DIM, seed=1))
    return sampler


@pytest.mark.parametrize("walk", [False, True], ids=["dense", "walk"])
@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_per_example_draws_follow_the_mixture_and_log_q_matches(kind, walk, monkeypatch):
    if walk:  # force the tree walk (the unigram draws' kernel log q then comes from log_q_many)
        monkeypatch.setattr(kernel_sampler.KernelTree, "dense_draw_pays", lambda *args: False)
    sampler = make_sampler(kind, share=0.33)
    query = queries(2, DIM, seed=5)
    ids, log_q = sample_from(sampler, query, 20)
    assert ids.shape == log_q.shape == (2, 20)
    assert sampler.unigram.share == pytest.approx(7 / 20)  # round(0.33 * 20) of the 20 draws come from u
    torch.testing.assert_close(log_q, log_q_from(sampler, query, ids), rtol=1e-4, atol=1e-5)
    everything = log_q_all_from(sampler, query, N_CLASSES).double().exp()  # (2, n)
    torch.testing.assert_close(everything.sum(1), torch.ones(2, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    kernel = log_q_all_from(make_sampler(kind, share=0.0), query, N_CLASSES).double().exp()  # the same kernel, no share
    counts = torch.arange(N_CLASSES, 0, -1).double() ** 1.5 + 1  # the training counts, smoothed
    torch.testing.assert_close(everything, 0.65 * kernel + 0.35 * counts / counts.sum(), rtol=0, atol=1e-6)
    draws = torch.cat([sample_from(sampler, query[:1], 20)[0].reshape(-1) for _ in range(1500)])  # stratified batches
    assert_draws_follow(draws, everything[0])


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_batch_shared_draws_follow_the_mixture(kind):
    sampler = make_sampler(kind, share=0.25, shared=True)
    query = queries(3, DIM, seed=7)
    ids, log_q = sample_from(sampler, query, 40)
    assert ids.shape == log_q.shape == (40,)
    torch.testing.assert_close(log_q, log_q_from(sampler, query, ids), rtol=1e-4, atol=1e-5)
    q = log_q_all_from(sampler, query, N_CLASSES)[0].double().exp()
    draws = torch.cat([sample_from(sampler, query, 40)[0] for _ in range(800)])
    assert_draws_follow(draws, q)


def test_kernel_log_q_through_bucket_reach_equals_the_path_reads(monkeypatch):
    monkeypatch.setattr(walk_backend, "GATHER_COST", 1e9)  # always through walk.log_reach
    sampler = make_sampler("rff", share=0.25)
    query = queries(2, DIM, seed=5)
    some = torch.tensor([[0, 5, 5, 77, N_CLASSES - 1], [3, 3, 64, 65, 119]])
    torch.testing.assert_close(sampler.tree.log_q_many(query, some), sampler.tree.log_q(query, some))


def test_unigram_share_zero_is_the_plain_kernel_and_bad_values_are_refused():
    assert make_sampler("rff", share=0.0).unigram is None
    with pytest.raises(ValueError, match="unigram_share must be < 1"):
        make_sampler("rff", share=1.0)
    with pytest.raises(ValueError, match="training-split counts"):
        RFFSampler(D=8, unigram_share=0.5)


def test_too_few_samples_for_a_unigram_draw_use_the_kernel_alone():
    sampler = make_sampler("rff", share=0.25)
    query = queries(3, DIM, seed=2)
    ids, log_q = sample_from(sampler, query, 1)  # round(0.25 * 1) = 0 unigram draws
    assert ids.shape == (3, 1) and sampler.unigram.share == 0.0
    torch.testing.assert_close(log_q, sampler.tree.log_q(query, ids), rtol=1e-4, atol=1e-5)
