"""``sampler=target`` (Jean et al. 2015): one set per batch holding every distinct target once, topped up with
uniformly drawn other classes to K = max(m, N), log q = -ln K; the loss is the softmax over the set, checked against
the loss written out position by position."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lab.launches import DispatchCounter

from lmtrain.config import compose_config
from lmtrain.output.sampled import SampledSoftmax
from lmtrain.run.build import build_output
from lmtrain.sampler.target import TargetSampler
from tests.power import ALPHA, chi_square_pvalue

pytestmark = pytest.mark.usefixtures("one_thread")

N_CLASSES, DIM = 12, 5


def drawn_set(targets: torch.Tensor, m: int, n: int = N_CLASSES):
    proposal = TargetSampler(n).propose(None, None, targets)
    return proposal, proposal.draw(m)


@pytest.mark.parametrize(
    ("targets", "m", "size"),
    [
        ([4, 4, 4, 4], 6, 6),  # one distinct target: five fillers
        ([0, 3, 0, 7, 11, 3], 6, 6),  # four distinct with repeats: two fillers
        ([0, 1, 2, 3, 4, 5, 6, 7], 5, 8),  # more distinct targets than m: the set grows to N
        ([9, 9, 2, 2, 2, 2, 2, 2], 5, 8),  # N > m with few distinct targets: the same size as the row above
        ([1, 5], 40, N_CLASSES),  # m beyond the vocabulary: every class
    ],
)
def test_the_set_holds_every_target_once_and_fillers_up_to_its_fixed_size(targets, m, size):
    targets = torch.tensor(targets)
    torch.manual_seed(0)
    proposal, (ids, log_q, target_log_q, joint) = drawn_set(targets, m)
    assert ids.shape == (size,) and log_q.shape == (size,) and joint is None
    assert sorted(ids.tolist()) == sorted(set(ids.tolist())), "every class at most once"
    assert set(targets.tolist()) <= set(ids.tolist()), "every distinct target"
    torch.testing.assert_close(log_q, torch.full((size,), -math.log(size)))
    torch.testing.assert_close(target_log_q, torch.full((targets.numel(), 1), -math.log(size)))
    outside = torch.tensor([c for c in range(N_CLASSES) if c not in ids.tolist()], dtype=torch.long)
    expected = torch.where(torch.isin(torch.arange(N_CLASSES), ids), -math.log(size), -math.inf)
    torch.testing.assert_close(proposal.log_q(torch.arange(N_CLASSES)), expected)
    assert torch.isneginf(proposal.log_q(outside)).all()
    torch.testing.assert_close(proposal.log_q_all(N_CLASSES).exp().sum(1), torch.ones(targets.numel()))


def test_the_draw_has_a_fixed_shape_and_no_host_sync():
    few, many = torch.zeros(20, dtype=torch.long), torch.arange(20) % N_CLASSES
    for targets in (few, many):
        proposal = TargetSampler(N_CLASSES).propose(None, None, targets)
        with DispatchCounter() as counter:
            ids = proposal.draw(6).ids
        assert ids.shape == (N_CLASSES,) and counter.counts.syncs == 0, dict(counter.counts.sync_ops)
    proposal = TargetSampler(100).propose(None, None, few)
    proposal.draw(30)  # the first draw makes the cached constant -ln K
    with DispatchCounter() as counter:
        assert proposal.draw(30).ids.shape == (30,)
    assert counter.counts.syncs == 0 and counter.counts.launches <= 3  # rand, index_fill, topk


def test_the_fillers_are_uniform_over_the_other_classes():
    """Targets {0, 3}, K = 5: each of the ten other classes fills one of the three places with probability 3/10.
    (Pearson's statistic over the filler counts is conservative here: a set draws without replacement.)"""
    targets = torch.tensor([0, 3, 3])
    torch.manual_seed(1)
    counts = np.zeros(N_CLASSES)
    sampler = TargetSampler(N_CLASSES)
    for _ in range(20_000):
        ids = sampler.propose(None, None, targets).draw(5).ids
        counts[ids.numpy()] += 1
    assert counts[0] == counts[3] == 20_000
    others = np.delete(counts, [0, 3])
    assert others.sum() == 3 * 20_000
    assert chi_square_pvalue(others, np.full(10, 0.1)) > ALPHA
    assert others.min() > 0.27 * 20_000 and others.max() < 0.33 * 20_000


@pytest.mark.parametrize("correction", ["exact", "classic"])
def test_the_loss_is_the_softmax_over_the_set(correction):
    """Every position's loss is -s_i(t_i) + log sum over the set of exp(s_i(j)), its own target counted once."""
    torch.manual_seed(0)
    layer = SampledSoftmax(N_CLASSES, DIM, TargetSampler(N_CLASSES), num_samples=7, correction=correction).double()
    hidden = torch.randn(6, DIM, dtype=torch.float64)
    target = torch.tensor([0, 3, 0, 5, 8, 3])
    torch.manual_seed(5)
    loss = layer.loss(hidden, target)
    torch.manual_seed(5)
    members = layer.sampler.propose(None, None, target).draw(7).ids.tolist()  # the same draw
    logits = layer.score(layer.query(hidden), layer.weight).double()  # (N, n)
    expected = [
        torch.logsumexp(torch.stack([logits[i, j] for j in members]), 0) - logits[i, t]
        for i, t in enumerate(target.tolist())
    ]
    torch.testing.assert_close(loss, torch.stack(expected).mean(), rtol=1e-6, atol=1e-8)


def config(*overrides: str):
    return compose_config(["~data", "output=sampled", "sampler=target", *overrides])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["output=negative"], "does not pass"),
        (["output.shared_negatives=true", "output.unique=true", "output.num_samples=5"], "output.unique=false"),
        (["output.remove_accidental_hits=false"], "output.remove_accidental_hits=true"),
    ],
)
def test_options_that_do_not_fit_are_refused_in_one_line(overrides, message):
    cfg = compose_config(["~data", "output=sampled", "sampler=target", *overrides])
    with pytest.raises(Exception) as caught:
        build_output(cfg, N_CLASSES, DIM, torch.ones(N_CLASSES))
    cause = caught.value.__cause__ or caught.value
    assert isinstance(cause, ValueError) and message in str(cause) and "\n" not in str(cause)


def test_the_targets_are_needed_and_the_mode_is_one_set():
    sampler = TargetSampler(N_CLASSES)
    sampler.share_negatives(False)  # an output asking for per-position negatives still gets one set
    assert sampler.shared
    with pytest.raises(ValueError, match="batch's targets"):
        sampler.propose(torch.randn(3, DIM))
    with pytest.raises(ValueError, match="draw first"):
        sampler.propose(None, None, torch.tensor([1])).log_q(torch.tensor([1]))


def test_it_is_an_option_of_the_config():
    cfg = config()
    assert cfg.sampler._target_ == "lmtrain.sampler.target.TargetSampler"
