"""Draws follow log q, tested with chi-square tests sized by power (issue 22, item 3; the calculation: tests/power.py).

Each test draws ``draws_for(n)`` ids (1.35 million for 37 classes, 1.26 million for 30) from one distribution and
requires Pearson's p-value > 1e-4 against exp(log q): a 5% error on any class or tree bucket holding >= 2% of the
mass would be caught with probability >= 0.9. A 5% error on a bin of mass P is caught with probability about
``power_of(N, n, P)``: 0.3 at P = 1%, > 0.999 at P = 5%; a 10% error at P = 1% with > 0.999. The smaller
multi-path tests in test_kernel_tree.py, test_kernel_shared.py and test_samplers.py check that every code path
draws from its log q; these check the distribution's details.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmtrain.sampler import BigramSampler, UnigramSampler
from tests.helpers import log_q_from, sample_from
from tests.power import ALPHA, P_MIN, POWER, REL_ERROR, chi_square_pvalue, draws_for, power_of
from tests.test_bigram import markov_stream
from tests.test_kernel_shared import queries
from tests.test_kernel_tree import augmented, make_tree

pytestmark = pytest.mark.usefixtures("one_thread")

N_CLASSES = 37


def counts_of(ids: torch.Tensor, n: int) -> np.ndarray:
    return torch.bincount(ids.reshape(-1), minlength=n).numpy()


def test_the_power_calculation_holds_by_simulation():
    """Multinomial counts of ``draws_for(37)`` draws from q' with a 5% error on one class of mass 2%, or on a bucket
    of three classes of mass 2% in all, are rejected in >= 88% of 300 simulated tests (the calculation with its
    10% margin says >= 90%, 93% measured over 1,000; 300 trials have a binomial standard error of 1.5%), and
    draws from q itself in at most 1 of 300 (the false-alarm rate 1e-4 expects 0.03)."""
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(N_CLASSES))
    q[:4] = [P_MIN, 0.008, 0.007, 0.005]  # one class of 2%, and a "bucket" (1..3) of 2%
    q[4:] *= (1 - q[:4].sum()) / q[4:].sum()
    draws = draws_for(N_CLASSES)
    assert 1.3e6 < draws < 1.4e6
    assert power_of(draws, N_CLASSES, P_MIN) > POWER

    def rejection_rate(bins: list[int], trials: int = 300) -> float:
        wrong = q.copy()
        mass = q[bins].sum()
        wrong[bins] *= 1 + REL_ERROR
        rest = [i for i in range(N_CLASSES) if i not in bins]
        wrong[rest] *= (1 - (1 + REL_ERROR) * mass) / (1 - mass)
        return np.mean([chi_square_pvalue(rng.multinomial(draws, wrong), q) < ALPHA for _ in range(trials)])

    assert rejection_rate([0]) >= 0.88
    assert rejection_rate([1, 2, 3]) >= 0.88
    false_alarms = sum(chi_square_pvalue(rng.multinomial(draws, q), q) < ALPHA for _ in range(300))
    assert false_alarms <= 1


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_kernel_walk_draws_follow_log_q(kind):
    """Per-example draws of one query walking the tree (37 classes in 13 buckets of 3)."""
    tree = make_tree(kind, augmented(N_CLASSES, 5, seed=0), "dense")
    query = queries(1, 5, seed=1)
    q = tree.log_q_all(query)[0].double().exp().numpy()
    torch.manual_seed(3)
    ids, _ = tree.sample(query, draws_for(N_CLASSES))
    assert chi_square_pvalue(counts_of(ids, N_CLASSES), q) > ALPHA


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_kernel_mixture_draws_follow_log_q_bar(kind):
    """Batch-shared draws of the mixture of six queries' proposals (one walk of the mixture query)."""
    tree = make_tree(kind, augmented(N_CLASSES, 5, seed=0), "dense")
    psi = tree.mixture(queries(6, 5, seed=1))
    q = tree.log_q_all_mixture(psi).double().exp().numpy()
    torch.manual_seed(4)
    ids, _ = tree.sample_mixture(psi, draws_for(N_CLASSES))
    assert chi_square_pvalue(counts_of(ids, N_CLASSES), q) > ALPHA


def test_unigram_alias_draws_follow_log_q():
    """The alias table of a Zipf unigram (power 0.75), where 8 classes hold >= 2% of the mass."""
    counts = (1000.0 / torch.arange(1, N_CLASSES + 1) ** 1.2).round().long()
    sampler = UnigramSampler(N_CLASSES, counts, power=0.75)
    q = log_q_from(sampler, None, torch.arange(N_CLASSES)).double().exp().numpy()
    torch.manual_seed(5)
    ids, _ = sample_from(sampler, None, draws_for(N_CLASSES))
    assert chi_square_pvalue(counts_of(ids, N_CLASSES), q) > ALPHA


@pytest.mark.parametrize("previous", [0, 3])
def test_bigram_draws_follow_log_q(previous):
    """q(. | previous word) of the bigram sampler: the bigram part and the unigram part together."""
    n = 30
    sampler = BigramSampler(n, markov_stream(), unigram_weight=0.25)
    inputs = torch.tensor([previous])
    q = log_q_from(sampler, None, torch.arange(n).view(1, n), inputs=inputs)[0].double().exp().numpy()
    torch.manual_seed(6)
    ids, _ = sample_from(sampler, None, draws_for(n), inputs=inputs)
    assert chi_square_pvalue(counts_of(ids, n), q) > ALPHA
