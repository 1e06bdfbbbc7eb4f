"""``sampler=inbatch``: the batch's targets as the shared negatives, corrected with the unigram's log q (the in-batch
softmax with the log-Q correction), against the loss written out position by position."""

from __future__ import annotations

import math

import pytest
import torch

from lmtrain.output.sampled import SampledSoftmax
from lmtrain.sampler.inbatch import InBatchSampler
from tests.conftest import make_config

N_CLASSES, DIM = 9, 5


def written_out(layer: SampledSoftmax, hidden: torch.Tensor, target: torch.Tensor, exact: bool) -> torch.Tensor:
    """Mean over positions i of -log softmax over {s_i(t_i)} and every batch target t_j != t_i, each corrected:
    exact, s_i(t_j) - ln(k_i q(t_j) / (1 - q(t_i))) with k_i the targets kept; classic, s_i(t_j) - ln(N q(t_j))."""
    counts = layer.sampler.unigram.log_probs.double().exp()  # q, the smoothed unigram
    logits = layer.score(layer.query(hidden), layer.weight).double()  # (N, n)
    losses = []
    for i in range(len(target)):
        kept = [j for j in range(len(target)) if target[j] != target[i]]
        terms = [logits[i, target[i]]]
        for j in kept:
            q = counts[target[j]]
            correction = math.log(len(kept) * q / (1 - counts[target[i]])) if exact else math.log(len(target) * q)
            terms.append(logits[i, target[j]] - correction)
        losses.append(torch.logsumexp(torch.stack(terms), 0) - logits[i, target[i]])
    return torch.stack(losses).mean()


@pytest.mark.parametrize("correction", ["exact", "classic"])
def test_the_loss_is_the_written_out_in_batch_softmax(correction):
    torch.manual_seed(0)
    counts = torch.tensor([50, 30, 20, 10, 8, 5, 3, 2, 1])
    sampler = InBatchSampler(N_CLASSES, counts, power=0.5)
    layer = SampledSoftmax(N_CLASSES, DIM, sampler, num_samples=100, correction=correction).double()
    hidden = torch.randn(7, DIM, dtype=torch.float64)
    target = torch.tensor([0, 3, 0, 5, 8, 3, 1])  # repeats: hits beyond each position's own target
    expected = written_out(layer, hidden, target, correction == "exact")
    torch.testing.assert_close(layer.loss(hidden, target), expected, rtol=1e-10, atol=1e-12)


def test_the_batch_fixes_m_and_the_mode_and_the_targets_are_needed():
    sampler = InBatchSampler(N_CLASSES, torch.ones(N_CLASSES, dtype=torch.long))
    sampler.share_negatives(False)  # an output asking for per-position negatives gets the batch's targets still
    target = torch.tensor([4, 2, 4])
    ids, log_q, target_log_q, _ = sampler.propose(torch.randn(3, DIM), None, target).draw(100)
    assert sampler.shared and torch.equal(ids, target) and ids.shape == (3,)
    torch.testing.assert_close(log_q, torch.full((3,), -math.log(N_CLASSES)))
    torch.testing.assert_close(target_log_q, log_q.unsqueeze(1))
    with pytest.raises(ValueError, match="batch's targets"):
        sampler.propose(torch.randn(3, DIM))


def test_it_is_an_option_of_the_config():
    cfg = make_config(["~data", "output=sampled", "sampler=inbatch", "sampler.power=0.75"])
    assert cfg.sampler._target_ == "lmtrain.sampler.inbatch.InBatchSampler" and cfg.sampler.power == 0.75
