"""Adaptive softmax: derived cutoffs, exact normalization, loss = mean NLL, gradients, config errors."""

from __future__ import annotations

import pytest
import torch

from lmtrain.config import ConfigError, compose_config
from lmtrain.output import AdaptiveSoftmax
from lmtrain.output.adaptive import derive_cutoffs, max_clusters
from lmtrain.run.build import build_output
from tests.conftest import make_config


@pytest.mark.parametrize("n", [2, 3, 5, 10, 37, 10_000, 33_278, 267_735, 10**6])
@pytest.mark.parametrize("clusters", [1, 2, 3])
def test_derived_cutoffs_are_valid_with_a_small_head(n, clusters):
    cutoffs = derive_cutoffs(n, clusters)
    assert cutoffs == sorted(set(cutoffs)) and cutoffs[0] >= 1 and cutoffs[-1] <= n - 1
    assert len(cutoffs) <= clusters and cutoffs[0] <= min(max(1, round(n / 5)), 2000)


def test_derived_cutoffs_for_ptb_are_the_classic_choice_and_follow_the_dimension():
    assert derive_cutoffs(10_000) == [2000, 6000]
    assert derive_cutoffs(10**6) == [2000, 20000, 200000]
    assert max_clusters(200, 4.0) == 3 and max_clusters(32, 4.0) == 2 and max_clusters(8, 4.0) == 1
    assert AdaptiveSoftmax(10**5, 32).cutoffs == [2000, 20000]  # 32 / 4^3 < 1: two tail clusters only
    with pytest.raises(ValueError, match="at least 2 classes"):
        derive_cutoffs(1)


@pytest.mark.parametrize("cutoffs", [[3], [2, 9, 20]])  # the derived ones: tests/test_output_contract.py
def test_probabilities_over_all_classes_sum_to_one(cutoffs):
    torch.manual_seed(0)
    output = AdaptiveSoftmax(37, 32, cutoffs=cutoffs, div_value=2.0).double()
    hidden = torch.randn(6, 32, dtype=torch.float64)
    target = torch.randint(37, (6,))
    with torch.no_grad():
        full = output.log_probs_all(hidden)  # (6, 37)
        torch.testing.assert_close(full.exp().sum(1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-12)
        assert full.std() > 0.05  # not a uniform distribution
        log_p = output.log_prob(hidden, target)
    torch.testing.assert_close(log_p, full.gather(1, target.unsqueeze(1))[:, 0])
    torch.testing.assert_close(output.loss(hidden, target), -log_p.mean())


def test_gradients_match_finite_differences():
    torch.manual_seed(1)
    output = AdaptiveSoftmax(12, 4, cutoffs=[3, 7], div_value=2.0).double()
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 2, 4, 8, 11])  # head and both tail clusters
    params = [hidden, *output.parameters()]
    assert torch.autograd.gradcheck(lambda *_: output.loss(hidden, target), params, eps=1e-6, atol=1e-7)


def test_config_derives_cutoffs_and_takes_overrides():
    counts = torch.arange(10_000, 0, -1)
    output = build_output(make_config(["~data", "output=adaptive"]), 10_000, 200, counts)
    assert isinstance(output, AdaptiveSoftmax) and output.cutoffs == [2000, 6000]
    assert output.sparse_parameters() == []
    cfg = make_config(["~data", "output=adaptive", "output.cutoffs=[100,500]", "output.div_value=2.0"])
    output = build_output(cfg, 1000, 16, counts[:1000])
    assert output.asm.cutoffs == [100, 500, 1000] and output.asm.tail[1][0].out_features == 4


@pytest.mark.parametrize(
    ("cutoffs", "div_value", "match"),
    [
        ([500, 100], 4.0, "strictly increasing"),
        ([100, 1000], 4.0, "strictly increasing"),
        ([0, 100], 4.0, "strictly increasing"),
        ([], 4.0, "strictly increasing"),
        ([100, 500], 64.0, "div_value"),
    ],
)
def test_bad_cutoffs_or_div_value_raise_one_clear_sentence(cutoffs, div_value, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveSoftmax(1000, 16, cutoffs=cutoffs, div_value=div_value)


def test_a_non_positive_div_value_is_refused_by_the_schema():
    with pytest.raises(ConfigError, match=r"output\.div_value must be > 0, got 0\.0"):
        compose_config(["output=adaptive", "output.div_value=0"])  # checked once, before anything is built
