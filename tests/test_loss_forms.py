"""The one form of the sampled losses: the targets' log q looked up with the negatives', the repeated rows of a
sparse gradient merged, and every accidental hit removed, even where all negatives are hits."""

from __future__ import annotations

import pytest
import torch
from lab.launches import DispatchCounter, synthetic_counts

from lmtrain.output.sampled.estimators import accidental_hits, exact_offsets, joint_softmax_nll
from lmtrain.run.build import build_output
from lmtrain.training.optim import merge_repeats
from tests.conftest import make_config

pytestmark = pytest.mark.usefixtures("one_thread")

N, DIM, CLASSES = 48, 12, 300

# the lookups of a proposal whose log q is a lookup, in one forward pass: the targets' log q is looked up with the
# negatives' (``Proposal.draw``), one fewer than a lookup each
LOOKUPS = {"unigram": ("index", 3), "exp": ("gather", 1), "bigram": ("cat", 2), "nce": ("index", 3)}


@pytest.mark.parametrize(("output", "lookup"), LOOKUPS.items())
def test_the_targets_log_q_is_looked_up_with_the_negatives(output, lookup):
    module, hidden, target, inputs = built([f"output={output}"])
    with DispatchCounter() as counter:
        module.loss(hidden, target, inputs)
    op, expected = lookup
    assert counter.counts.by_op[op] == expected, dict(counter.counts.by_op)


def built(overrides: list[str]):
    """A float64 output layer of ``CLASSES`` classes with random weights, and a batch: hidden, target, inputs."""
    counts = synthetic_counts(CLASSES)
    stream = torch.multinomial(counts.double(), 5000, replacement=True, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    output = build_output(make_config(["~data", *overrides]), CLASSES, DIM, counts, stream).double()
    with torch.no_grad():  # biases away from 0, so the [h, 1] column matters
        for p in output.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hidden = torch.randn(N, DIM, dtype=torch.float64)
    target = torch.multinomial(counts.double(), N, replacement=True)
    inputs = torch.multinomial(counts.double(), N, replacement=True)
    return output, hidden, target, inputs


def test_merged_repeats_put_each_rows_sum_at_its_first_sorted_entry():
    rows = torch.tensor([4, 1, 4, 0, 1, 4])
    values = torch.arange(12.0).view(6, 2)
    merged = merge_repeats(torch.sparse_coo_tensor(rows.unsqueeze(0), values, (6, 2)))
    assert merged._indices()[0].tolist() == [0, 1, 1, 4, 4, 4]
    expected = [[6, 7], [2 + 8, 3 + 9], [0, 0], [0 + 4 + 10, 1 + 5 + 11], [0, 0], [0, 0]]
    assert merged._values().tolist() == expected


def test_the_sampled_softmax_removes_every_hit_even_when_all_negatives_are_hits():
    """The offsets (+inf on the hits) and a cross entropy with class 0 against the written-out estimator (corrected
    logits, -inf on the hits): equal where some negatives are hits, and where all are (k_t = 0, which the offsets
    take no floor for) the row's loss is 0 and its gradient 0, not NaN."""
    torch.manual_seed(3)
    n, m = 5, 4
    scores = torch.randn(n, 1 + m, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 1, 2, 3, 4])
    ids = torch.tensor([[0, 0, 0, 0], [1, 5, 1, 6], [7, 8, 9, 5], [3, 3, 3, 3], [4, 6, 7, 8]])
    log_q, log_q_target = torch.full((n, m), -2.0, dtype=torch.float64), torch.full((n,), -2.0, dtype=torch.float64)
    hits = accidental_hits(ids, target)
    joint = joint_softmax_nll(scores, exact_offsets(log_q, log_q_target, hits, m))
    kept = (m - hits.sum(1)).clamp(min=1).double()  # k_t
    rest = 1 - log_q_target.exp()  # 1 - q_t
    corrected = scores[:, 1:] - torch.log(kept / rest).unsqueeze(1) - log_q  # o_j - ln(k_t q_j / (1 - q_t))
    logits = torch.cat([scores[:, :1], corrected.masked_fill(hits, float("-inf"))], 1)
    written_out = torch.logsumexp(logits, 1) - scores[:, 0]
    torch.testing.assert_close(joint, written_out, rtol=1e-12, atol=1e-12)
    assert joint[0] == 0 and joint[3] == 0 and bool((joint[[1, 2, 4]] > 0).all())
    mean = joint_softmax_nll(scores, exact_offsets(log_q, log_q_target, hits, m), mean=True)
    torch.testing.assert_close(mean, written_out.mean(), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(mean, scores)
    assert bool(grad.isfinite().all()) and bool((grad[[0, 3]] == 0).all())
