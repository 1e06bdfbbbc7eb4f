"""No state carried between calls: every ``output=`` choice's ``loss`` can be called again on the same tensor.

A custom loop, gradient accumulation over one batch or an evaluation that scores and then updates calls ``loss``
more than once on one hidden tensor (a leaf). Each call must build its own graph: a value reused from the previous
call by tensor identity (a cached unit query, say) makes the second backward fail ("Trying to backward through the
graph a second time"), or, detached, gives it a wrong gradient. With the same random state, every call
gives the first call's loss and gradients.
"""

from __future__ import annotations

import pytest
import torch

from lmtrain.config import choices, compose_config
from tests.test_output_contract import DIM, NUM_CLASSES, N, build


def with_shared_negatives() -> list[str]:
    """The choices whose negatives can be shared by the batch, as ``NAME:shared`` (targets and negatives scored
    apart, so a query transform is used twice in one call)."""
    return [
        f"{name}:shared"
        for name in choices("output")
        if "shared_negatives" in compose_config([f"output={name}"]).output
    ]


CASES = [*choices("output"), *with_shared_negatives()]


@pytest.mark.parametrize("case", CASES)
def test_loss_called_repeatedly_on_one_leaf_gives_the_same_loss_and_gradients(case):
    name, _, mode = case.partition(":")
    layer = build(name)
    if mode == "shared":
        layer.options.shared_negatives = True
        layer.attach(layer.sampler)  # the one place that sets the sampler's mode
    hidden = torch.randn(N, DIM, requires_grad=True)  # a leaf, as in a custom loop
    target, inputs = torch.randint(NUM_CLASSES, (N,)), torch.randint(NUM_CLASSES, (N,))
    params = [p for p in layer.parameters() if p.requires_grad]
    losses, grads = [], []
    for _ in range(3):
        torch.manual_seed(7)  # the same negatives each call
        hidden.grad = None
        layer.zero_grad(set_to_none=True)
        loss = layer.loss(hidden, target, inputs=inputs)
        loss.backward()  # the second call's backward failed where the first call's graph was reused
        losses.append(loss.detach())
        grads.append([hidden.grad.clone()] + [dense(p.grad) for p in params])
    for loss, grad in zip(losses[1:], grads[1:], strict=True):
        torch.testing.assert_close(loss, losses[0], rtol=0, atol=0)
        for got, first in zip(grad, grads[0], strict=True):
            torch.testing.assert_close(got, first, rtol=1e-6, atol=1e-7)


def dense(grad: torch.Tensor | None) -> torch.Tensor:
    if grad is None:
        return torch.zeros(())
    return grad.to_dense() if grad.is_sparse else grad.clone()


def test_evaluation_then_training_on_one_leaf_backpropagates_both():
    """log_prob (an evaluation that keeps the graph) then loss on the same leaf: both backward passes run."""
    layer = build("rff")
    hidden = torch.randn(N, DIM, requires_grad=True)
    target = torch.randint(NUM_CLASSES, (N,))
    (-layer.log_prob(hidden, target).mean()).backward()
    first = hidden.grad.clone()
    layer.loss(hidden, target).backward()
    assert torch.isfinite(hidden.grad).all() and not torch.equal(hidden.grad, first)
