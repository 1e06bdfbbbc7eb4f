"""Samplers: exact log q (sums to 1), draws that follow it (chi-square), alias tables, options and errors."""

from __future__ import annotations

import math

import pytest
import torch

from lmtrain.config import ConfigError, compose_config
from lmtrain.sampler import SoftmaxSampler, UniformSampler, UnigramSampler
from lmtrain.sampler.unigram import alias_table
from tests.helpers import log_q_all_from, log_q_from, sample_from

N_CLASSES = 40


def zipf_counts(n: int, zeros: int = 5) -> torch.Tensor:
    counts = (1000.0 / torch.arange(1, n + 1)).long()
    counts[-zeros:] = 0  # classes never seen in training
    return counts


def context_free() -> dict[str, object]:
    counts = zipf_counts(N_CLASSES)
    return {
        "uniform": UniformSampler(N_CLASSES),
        "unigram": UnigramSampler(N_CLASSES, counts),
        "unigram^0.75": UnigramSampler(N_CLASSES, counts, power=0.75),
        "log_uniform": UnigramSampler(N_CLASSES, distribution="log_uniform"),
    }


def softmax_sampler(dim: int = 6, rows: int = 3) -> tuple[SoftmaxSampler, torch.Tensor]:
    torch.manual_seed(3)
    sampler = SoftmaxSampler(N_CLASSES)
    sampler.update(torch.randn(N_CLASSES, dim))
    return sampler, torch.randn(rows, dim)


def chi_square_critical(df: int, z: float = 4.0) -> float:
    """Upper chi-square quantile (Wilson-Hilferty), z = 4 standard deviations: a false alarm is ~3e-5."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(ids: torch.Tensor, log_q: torch.Tensor) -> float:
    observed = torch.bincount(ids, minlength=log_q.numel()).double()
    expected = log_q.double().exp() * ids.numel()
    return float(((observed - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("name", list(context_free()))
def test_context_free_log_q_sums_to_one_and_matches_draws(name):
    sampler = context_free()[name]
    all_ids = torch.arange(N_CLASSES)
    log_q = log_q_from(sampler, None, all_ids)
    assert torch.isfinite(log_q).all()
    assert log_q.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)
    torch.manual_seed(0)
    ids, drawn_log_q = sample_from(sampler, None, 200_000)
    assert ids.shape == drawn_log_q.shape == (200_000,) and ids.dtype == torch.long
    torch.testing.assert_close(drawn_log_q, log_q[ids])  # the returned log q is the one of each id
    assert chi_square(ids, log_q) < chi_square_critical(N_CLASSES - 1)


def test_softmax_sampler_log_q_sums_to_one_and_matches_draws():
    sampler, hidden = softmax_sampler()
    all_ids = torch.arange(N_CLASSES).expand(hidden.shape[0], -1)
    log_q = log_q_from(sampler, hidden, all_ids)  # (rows, n)
    torch.testing.assert_close(log_q.double().exp().sum(1), torch.ones(hidden.shape[0], dtype=torch.float64))
    torch.testing.assert_close(log_q, torch.log_softmax(hidden @ sampler._weight.T, dim=1))
    torch.manual_seed(1)
    ids, drawn_log_q = sample_from(sampler, hidden, 100_000)
    assert ids.shape == (hidden.shape[0], 100_000)
    torch.testing.assert_close(drawn_log_q, log_q.gather(1, ids))
    for row in range(hidden.shape[0]):  # each example draws from its own softmax
        assert chi_square(ids[row], log_q[row]) < chi_square_critical(N_CLASSES - 1)


def test_chi_square_detects_a_wrong_distribution():
    """Guard for the test above: draws from unigram are rejected as uniform."""
    torch.manual_seed(0)
    ids, _ = sample_from(context_free()["unigram"], None, 200_000)
    uniform = log_q_from(UniformSampler(N_CLASSES), None, torch.arange(N_CLASSES))
    assert chi_square(ids, uniform) > chi_square_critical(N_CLASSES - 1)


def test_unigram_formula_power_and_zero_count_floor():
    counts = zipf_counts(N_CLASSES)
    log_q = log_q_from(UnigramSampler(N_CLASSES, counts, power=0.75, smoothing=1.0), None, torch.arange(N_CLASSES))
    expected = torch.log_softmax(0.75 * torch.log(counts.double() + 1.0), dim=0)
    torch.testing.assert_close(log_q.double(), expected, atol=1e-6, rtol=0)
    assert (log_q[-5:] > -math.inf).all()  # unseen classes keep q > 0


def test_log_uniform_is_zipf():
    n = 1000
    log_q = log_q_from(UnigramSampler(n, distribution="log_uniform"), None, torch.arange(n)).double()
    k = torch.arange(n, dtype=torch.float64)
    expected = torch.log(torch.log((k + 2) / (k + 1)) / math.log(n + 1))
    torch.testing.assert_close(log_q, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["zipf", "random", "uniform", "one_heavy"])
def test_alias_table_reproduces_the_weights(kind):
    torch.manual_seed(2)
    n = 5000
    weights = {
        "zipf": 1.0 / torch.arange(1, n + 1, dtype=torch.float64),
        "random": torch.rand(n, dtype=torch.float64) + 0.01,
        "uniform": torch.ones(n, dtype=torch.float64),
        "one_heavy": torch.ones(n, dtype=torch.float64).index_fill_(0, torch.tensor([77]), 1e4),
    }[kind]
    threshold, alias = alias_table(weights)
    assert ((threshold >= 0) & (threshold <= 2**32)).all() and ((alias >= 0) & (alias < n)).all()
    mass = threshold.clone().scatter_add_(0, alias, 2**32 - threshold).double() / (n * 2.0**32)
    torch.testing.assert_close(mass, weights / weights.sum(), rtol=1e-6, atol=0)


def test_unigram_at_a_million_classes_is_exact():
    counts = (1e7 / torch.arange(1, 1_000_001, dtype=torch.float64)).long()
    sampler = UnigramSampler(1_000_000, counts, power=0.75)
    assert sampler.log_probs.double().exp().sum().item() == pytest.approx(1.0, abs=1e-4)
    expected = torch.log_softmax(0.75 * torch.log(counts.double() + 1.0), dim=0)
    torch.testing.assert_close(sampler.log_probs[:1000].double(), expected[:1000], atol=1e-5, rtol=0)
    ids, log_q = sample_from(sampler, None, 1000)
    assert ids.max() < 1_000_000 and torch.isfinite(log_q).all()


def test_softmax_sampler_follows_the_live_weights():
    sampler, hidden = softmax_sampler()
    weight = torch.randn(N_CLASSES, hidden.shape[1])
    sampler.update(weight)
    before = log_q_from(sampler, hidden, torch.zeros(hidden.shape[0], 1, dtype=torch.long))
    weight[0] += 5.0  # an in-place optimizer step: no update() call needed
    after = log_q_from(sampler, hidden, torch.zeros(hidden.shape[0], 1, dtype=torch.long))
    assert not torch.allclose(before, after)


def test_uniform_log_q():
    log_q = log_q_from(UniformSampler(7), None, torch.tensor([[0, 6], [3, 3]]))
    torch.testing.assert_close(log_q, torch.full((2, 2), -math.log(7)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"counts": None}, "needs the training-split counts"),
        ({"counts": torch.ones(3, dtype=torch.long)}, "counts has 3 entries"),
        ({"smoothing": 0.0}, "smoothing must be > 0"),
    ],
)
def test_unigram_bad_options_raise_value_error(kwargs, message):
    options = {"counts": zipf_counts(N_CLASSES), **kwargs}
    with pytest.raises(ValueError, match=message):
        UnigramSampler(N_CLASSES, **options)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sampler.distribution=zipf", r"sampler\.distribution must be one of 'unigram', 'log_uniform', got 'zipf'"),
        ("sampler.power=-1", r"sampler\.power must be >= 0, got -1\.0"),
    ],
)
def test_unigram_out_of_range_options_are_refused_by_the_schema(override, message):
    with pytest.raises(ConfigError, match=message):  # checked once, by the schema, before anything is built
        compose_config(["output=unigram", override])


def test_softmax_sampler_without_weights_raises():
    with pytest.raises(ValueError, match="call update"):
        sample_from(SoftmaxSampler(5), torch.randn(2, 3), 4)


def test_log_q_all_is_every_class_for_every_position():
    """``Sampler.log_q_all`` (diagnostics): (N, n), row i the log q of every class for position i's query and input."""
    n, rows = N_CLASSES, 4
    hidden = torch.randn(rows, 6)
    for name, sampler in context_free().items():
        every = log_q_from(sampler, None, torch.arange(n))
        torch.testing.assert_close(log_q_all_from(sampler, hidden, n), every.expand(rows, n), msg=name)
    softmax, queries = softmax_sampler(rows=rows)
    torch.testing.assert_close(
        log_q_all_from(softmax, queries, n), log_q_from(softmax, queries, torch.arange(n).expand(rows, n))
    )


def test_uniform_sampler_needs_two_classes_and_keeps_no_state():
    assert log_q_from(UniformSampler(2), None, torch.arange(2)).exp().tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="at least 2 classes"):
        UniformSampler(1)
    assert list(UniformSampler(5).state_dict()) == []  # nothing to checkpoint
