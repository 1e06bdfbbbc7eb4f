"""The contract every `output=` choice keeps, checked on each one as the config builds it.

log_prob is a normalized distribution over the classes; the training loss is finite and differentiable; the
sparse parameters get sparse row gradients and only for rows the step touched; the after-step hook runs after
an optimizer step; and a state_dict round trip into a fresh instance gives the same log-probabilities.
"""

from __future__ import annotations

import pytest
import torch

from lmtrain.config import choices, compose_config
from lmtrain.run.build import build_output, step_forms

NUM_CLASSES, DIM, N = 60, 8, 12


def build(output: str, seed: int = 0, device: str = "cpu"):
    """The layer of ``output=``, in the step forms of the ``device`` it will run on (a CPU's by default, on any
    machine)."""
    cfg = compose_config(
        [f"output={output}", "output.num_samples=5"] if output_has_samples(output) else [f"output={output}"]
    )
    torch.manual_seed(seed)
    counts = torch.arange(NUM_CLASSES, 0, -1).float() * 10  # frequency-ordered, as the vocabularies are
    train_ids = torch.multinomial(counts / counts.sum(), 2_000, replacement=True)
    return build_output(cfg, NUM_CLASSES, DIM, counts, train_ids, forms=step_forms(cfg, device))


def output_has_samples(output: str) -> bool:
    return "num_samples" in compose_config([f"output={output}"]).output


OUTPUTS = choices("output")


@pytest.mark.parametrize("output", OUTPUTS)
def test_log_prob_is_a_normalized_distribution(output):
    layer = build(output)
    hidden = torch.randn(N, DIM)
    with torch.no_grad():
        every = torch.stack([layer.log_prob(hidden, torch.full((N,), c)) for c in range(NUM_CLASSES)], 1)  # (N, n)
        torch.testing.assert_close(every.exp().sum(1), torch.ones(N), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(layer.log_probs_all(hidden), every, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("output", OUTPUTS)
def test_loss_is_finite_differentiable_and_sparse_where_declared(output):
    layer = build(output)
    hidden = torch.randn(N, DIM, requires_grad=True)
    target, inputs = torch.randint(NUM_CLASSES, (N,)), torch.randint(NUM_CLASSES, (N,))
    loss = layer.loss(hidden, target, inputs=inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all() and hidden.grad.abs().sum() > 0
    for param in layer.sparse_parameters():
        assert param.grad is not None and param.grad.is_sparse, f"{output}: sparse parameter got a dense gradient"
        touched = param.grad.coalesce().indices()[0]
        assert 0 < touched.numel() < param.shape[0] or param.shape[0] <= N, f"{output}: every row got a gradient"


@pytest.mark.parametrize("output", OUTPUTS)
def test_after_step_hook_and_checkpoint_round_trip(output):
    layer = build(output, seed=1)
    hidden, target = torch.randn(N, DIM), torch.randint(NUM_CLASSES, (N,))
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer.loss(hidden, target, inputs=torch.randint(NUM_CLASSES, (N,))).backward()
    optimizer.step()
    layer.after_optimizer_step()  # e.g. a kernel tree refreshed from the changed rows
    with torch.no_grad():
        before = layer.log_probs_all(hidden)
        fresh = build(output, seed=2)  # other initial weights
        fresh.load_state_dict(layer.state_dict())  # derived state (trees) is rebuilt from the loaded weights
        torch.testing.assert_close(fresh.log_probs_all(hidden), before, rtol=1e-5, atol=1e-5)
