"""``sampler=quartic`` and ``output=quartic`` (Blanc & Rendle 2018, the quartic kernel): q_i ∝ o_i^4 + 1 per position
from every class's score, against the kernel written out class by class, and draws that follow it."""

from __future__ import annotations

import pytest
import torch

from lmtrain.config import compose_config
from lmtrain.output.sampled import AbsoluteSampledSoftmax
from lmtrain.run.build import build_output
from lmtrain.sampler.quartic import QuarticSampler
from tests.power import ALPHA, chi_square_pvalue, draws_for

pytestmark = pytest.mark.usefixtures("one_thread")

N_CLASSES, DIM = 37, 4


def made(seed: int = 0) -> tuple[QuarticSampler, torch.Tensor, torch.Tensor]:
    """A sampler over random class vectors [w, b] (n, d + 1) and queries [h, 1] (3, d + 1)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(N_CLASSES, DIM + 1, generator=gen, dtype=torch.float64) * 0.6
    query = torch.cat([torch.randn(3, DIM, generator=gen, dtype=torch.float64), torch.ones(3, 1).double()], 1)
    sampler = QuarticSampler(N_CLASSES)
    sampler.update(weight)
    return sampler, weight, query


def written_q(weight: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """q[i, c] = (o^4 + 1) / sum_c' (o'^4 + 1), one class at a time."""
    rows = []
    for h in query:
        kernel = [float(h @ w) ** 4 + 1 for w in weight]
        rows.append([k / sum(kernel) for k in kernel])
    return torch.tensor(rows, dtype=torch.float64)


def test_log_q_of_draws_targets_and_any_ids_is_the_written_out_kernel():
    sampler, weight, query = made()
    expected = written_q(weight, query).log()  # (3, n)
    targets = torch.tensor([0, 17, 36])
    torch.manual_seed(0)
    proposal = sampler.propose(query, None, targets)
    ids, log_q, target_log_q, joint = proposal.draw(50)
    assert ids.shape == log_q.shape == (3, 50) and torch.equal(joint[:, 1:], ids)
    torch.testing.assert_close(log_q, expected.gather(1, ids))
    torch.testing.assert_close(target_log_q, expected.gather(1, targets.view(3, 1)))
    some = torch.tensor([[1, 2], [3, 4], [5, 6]])  # (N, k) per position
    torch.testing.assert_close(proposal.log_q(some), expected.gather(1, some))
    torch.testing.assert_close(proposal.log_q(torch.arange(N_CLASSES)), expected)  # the same ids at every position
    torch.testing.assert_close(proposal.log_q_all(N_CLASSES), expected)
    assert ((expected.exp() - 1 / N_CLASSES).abs() > 0.005).any()  # guard: q is far from uniform


@pytest.mark.parametrize("row", [0, 2])
def test_draws_follow_log_q(row):
    sampler, weight, query = made()
    q = written_q(weight, query)[row].numpy()
    sampler.update(weight.float())  # a training step's float32
    torch.manual_seed(1)
    ids = sampler.propose(query[row : row + 1].float(), None).draw(draws_for(N_CLASSES)).ids
    assert chi_square_pvalue(torch.bincount(ids.reshape(-1), minlength=N_CLASSES).numpy(), q) > ALPHA


def test_output_quartic_is_the_absolute_softmax_with_the_quartic_proposal():
    cfg = compose_config(["~data", "output=quartic", "output.num_samples=5"])
    layer = build_output(cfg, N_CLASSES, DIM, torch.ones(N_CLASSES))
    assert isinstance(layer, AbsoluteSampledSoftmax) and isinstance(layer.sampler, QuarticSampler)
    assert not layer.sampler.shared  # per position, whatever the output asks
    hidden, target = torch.randn(6, DIM), torch.randint(N_CLASSES, (6,))
    loss = layer.loss(hidden, target)
    loss.backward()
    assert torch.isfinite(loss) and layer.weight.grad is not None
    logits = (layer.query(hidden) @ layer.weight.detach().T).abs()  # (N, n) |o|, exp(|o|) normalized exactly
    torch.testing.assert_close(
        layer.log_prob(hidden, target), torch.log_softmax(logits, 1).gather(1, target[:, None])[:, 0]
    )
    with pytest.raises(ValueError, match="query vectors"):
        QuarticSampler(N_CLASSES).propose(None)
