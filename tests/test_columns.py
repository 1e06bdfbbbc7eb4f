"""``with_ones_column``: [x, 1] in one operator, from ones cached per device and dtype."""

from __future__ import annotations

import torch

from lmtrain.common import columns
from lmtrain.common.columns import with_ones_column
from lmtrain.tools.launches import DispatchCounter


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
    columns._CONSTANTS.pop((1.0, torch.device("cpu"), torch.float16), None)  # made here first whatever ran before
    with torch.inference_mode():
        with_ones_column(torch.randn(2, 3, dtype=torch.float16))
    assert not columns._CONSTANTS[(1.0, torch.device("cpu"), torch.float16)].is_inference()
    x = torch.randn(2, 3, dtype=torch.float16, requires_grad=True)
    (with_ones_column(x) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2))
