"""Constants as views (``lmtrain.common.constants``): [x, 1] in one operator, a uniform log q in none."""

from __future__ import annotations

import math

import torch
from lab.launches import DispatchCounter

from lmtrain.common import constants
from lmtrain.common.constants import with_ones_column
from tests.helpers import log_q_from


def test_the_column_is_ones_in_the_input_dtype_and_the_join_one_operator():
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    with_ones_column(x)  # the ones are made on the first call
    with DispatchCounter() as counter:
        joined = with_ones_column(x)
    assert counter.counts.launches == 1, counter.counts.by_op  # a fresh column of ones would be a fill and a join
    assert joined.dtype == torch.float64 and joined.shape == (4, 3, 6)
    assert torch.equal(joined, torch.cat([x, torch.ones(4, 3, 1, dtype=torch.float64)], dim=-1))
    assert with_ones_column(torch.randn(2, 3, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_ones_first_made_during_evaluation_serve_training():
    """Lightning evaluates under inference mode (its sanity check comes first); ones made there must not be an
    inference tensor, which autograd refuses wherever an operator saves it for the backward pass."""
    constants._CONSTANTS.pop((1.0, torch.device("cpu"), torch.float16), None)  # made here first whatever ran before
    with torch.inference_mode():
        with_ones_column(torch.randn(2, 3, dtype=torch.float16))
    assert not constants._CONSTANTS[(1.0, torch.device("cpu"), torch.float16)].is_inference()
    x = torch.randn(2, 3, dtype=torch.float16, requires_grad=True)
    (with_ones_column(x) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2))


def test_a_uniform_log_q_launches_nothing_and_is_exact_in_its_dtype():
    """-ln n as a view of one cached value: no fill per call, and in float64 the float64 value (not float32's
    rounding of it), so that q sums to 1 to the dtype's precision."""
    from lmtrain.sampler.uniform import UniformSampler

    sampler = UniformSampler(1000).double()
    ids = torch.randint(1000, (7, 5))
    log_q_from(sampler, None, ids)
    with DispatchCounter() as counter:
        log_q = log_q_from(sampler, None, ids)
    assert counter.counts.launches == 0 and log_q.shape == (7, 5) and log_q.dtype == torch.float64
    assert torch.equal(log_q, torch.full((7, 5), -math.log(1000), dtype=torch.float64))


def test_the_first_class_is_made_once_contiguous_and_ordinary():
    """The cross entropy's class-0 targets: contiguous int64 zeros, the same tensor on every call of one size (no
    launch), an ordinary tensor even when first made under inference mode (Lightning's sanity check)."""
    with torch.inference_mode():
        first = constants.first_class(7, torch.device("cpu"))
    assert not first.is_inference() and first.is_contiguous() and first.dtype == torch.long
    assert first.tolist() == [0] * 7
    with DispatchCounter() as counter:
        again = constants.first_class(7, torch.device("cpu"))
    assert again is first and counter.counts.launches == 0
    assert constants.first_class(3, torch.device("cpu")).shape == (3,)
