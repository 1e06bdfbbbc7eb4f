"""lmtrain's sampled losses and gradients against the independent NumPy reference (issue 22, item 5).

The draws are forced: a ``ForcedDraws`` sampler returns given ids with log q from a given proposal q, so the loss
of one step is a deterministic function of the scores, and lmtrain's loss (mean over positions) and its gradients
with respect to the hidden states and the class matrix [W, b] must equal ``tests/reference_np.py`` in float64 to
1e-10 (relative). The forced ids include accidental hits: one position whose every draw is its target (k_t = 0),
one with two hits, and the rest random; negatives are forced per position (N, m) or shared by the batch (m,).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from lmtrain.output import NCE, NegativeSampling, SampledSoftmax
from lmtrain.output.sampled import SampledOutput
from lmtrain.sampler import Sampler
from tests import reference_np as ref

N_CLASSES, DIM, ROWS, M = 12, 4, 6, 5
TOL = {"rtol": 1e-10, "atol": 1e-12}


class ForcedDraws(Sampler):
    """A proposal ``q`` (n,) whose draws are fixed in advance: ``ids`` (N, m) per position or (m,) for the batch."""

    def __init__(self, q: Tensor, ids: Tensor) -> None:
        super().__init__()
        self.q, self.ids = q, ids
        self.per_example = ids.dim() == 2

    def sample(self, hidden: Tensor | None, num_samples: int, inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
        assert num_samples == self.ids.shape[-1]
        return self.ids.clone(), self.q.log()[self.ids]

    def log_q(self, hidden: Tensor | None, ids: Tensor, inputs: Tensor | None = None) -> Tensor:
        return self.q.log()[ids]


def inputs(shared: bool, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q (n,), hidden (N, d), targets (N,), forced ids (N, m) or (m,), float64."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(N_CLASSES, generator=gen, dtype=torch.float64) + 0.05
    q = q / q.sum()
    hidden = torch.randn(ROWS, DIM, generator=gen, dtype=torch.float64)
    target = torch.randint(N_CLASSES, (ROWS,), generator=gen)
    if shared:
        ids = torch.randint(N_CLASSES, (M,), generator=gen)
        ids[1] = ids[3] = target[2]  # position 2 has two hits among the shared negatives
        return q, hidden, target, ids
    ids = torch.randint(N_CLASSES, (ROWS, M), generator=gen)
    ids[0] = target[0]  # every draw a hit: k_t = 0
    ids[1, [0, 3]] = target[1]  # two hits
    return q, hidden, target, ids


def build(cls: type[SampledOutput], sampler: Sampler, shared: bool, **options: object) -> SampledOutput:
    torch.manual_seed(1)
    options.update(num_samples=M, shared_negatives=shared, sparse=False, init_range=0.8)
    layer = cls(N_CLASSES, DIM, sampler, **options).double()
    with torch.no_grad():
        layer.weight[:, -1].uniform_(-1.5, 1.5)
    return layer


def lmtrain_step(layer: SampledOutput, hidden: Tensor, target: Tensor) -> tuple[float, Tensor, Tensor]:
    """lmtrain's loss, and the gradients of the summed per-position losses (mean x N) w.r.t. hidden and [W, b]."""
    hidden = hidden.clone().requires_grad_(True)
    loss = layer.loss(hidden, target)
    (loss * ROWS).backward()
    return loss.item(), hidden.grad, layer.weight.grad


def reference_step(layer: SampledOutput, hidden: Tensor, target: Tensor, ids: Tensor, position_loss) -> tuple:
    """The reference's mean loss and summed gradients; ``position_loss(s, t, ids)`` -> (loss, d loss / d s)."""
    weight = layer.weight.detach().numpy()
    h = hidden.numpy()
    scores = np.concatenate([h, np.ones((ROWS, 1))], axis=1) @ weight.T  # (N, n), computed here
    per_row = ids.expand(ROWS, -1) if ids.dim() == 1 else ids
    losses, grads = [], []
    for i in range(ROWS):
        loss, grad = position_loss(scores[i], int(target[i]), per_row[i].numpy())[:2]
        losses.append(loss)
        grads.append(grad)
    grad_hidden, grad_weight = ref.chain(h, weight, np.stack(grads))
    return float(np.mean(losses)), torch.from_numpy(grad_hidden), torch.from_numpy(grad_weight)


def assert_matches(ours: tuple, theirs: tuple) -> None:
    assert ours[0] == pytest.approx(theirs[0], rel=1e-10)
    torch.testing.assert_close(ours[1], theirs[1], **TOL)
    torch.testing.assert_close(ours[2], theirs[2], **TOL)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("remove_hits", [True, False])
@pytest.mark.parametrize("correction", ["exact", "classic"])
def test_sampled_softmax_matches_the_reference(correction, remove_hits, shared):
    q, hidden, target, ids = inputs(shared)
    sampler = ForcedDraws(q, ids)
    layer = build(SampledSoftmax, sampler, shared, correction=correction, remove_accidental_hits=remove_hits)
    qn = q.numpy()
    expected = reference_step(
        layer, hidden, target, ids, lambda s, t, j: ref.sampled_softmax(s, t, j, qn, correction, remove_hits)
    )
    assert_matches(lmtrain_step(layer, hidden, target), expected)


def test_the_reference_tells_the_corrections_apart():
    """Guard: on these draws the exact and classic corrections, and hit removal, give different losses, so the
    matches above pin each option down."""
    q, hidden, target, ids = inputs(shared=False)
    layer = build(SampledSoftmax, ForcedDraws(q, ids), False)
    qn = q.numpy()
    losses = {}
    for c in ("exact", "classic"):
        for r in (True, False):
            position = lambda s, t, j, c=c, r=r: ref.sampled_softmax(s, t, j, qn, c, r)  # noqa: E731
            losses[c, r] = reference_step(layer, hidden, target, ids, position)[0]
    assert len({round(v, 6) for v in losses.values()}) == 3  # exact and classic coincide only without hit removal
    assert losses["exact", False] == pytest.approx(losses["classic", False], rel=1e-12)


def test_classic_differs_from_the_frameworks_only_by_the_true_class_correction():
    """The frameworks subtract ln(m q_t) from the true class's logit too; lmtrain's classic correction (its spec:
    Bengio & Senécal, Blanc & Rendle eq. 2) leaves o_t as it is. With hits removed, that is the only difference:
    lmtrain equals the frameworks' loss computed with q_t replaced by 1 / m (ln(m q_t) = 0), and differs from it
    with the real q_t."""
    q, hidden, target, ids = inputs(shared=False, seed=3)
    layer = build(SampledSoftmax, ForcedDraws(q, ids), False, correction="classic")
    ours = lmtrain_step(layer, hidden, target)

    def framework(s: np.ndarray, t: int, j: np.ndarray, uncorrected_target: bool):
        qn = q.numpy().copy()
        if uncorrected_target:
            qn[t] = 1.0 / M
        return ref.framework_sampled_softmax(s, t, j, qn)

    assert_matches(ours, reference_step(layer, hidden, target, ids, lambda s, t, j: framework(s, t, j, True)))
    theirs = reference_step(layer, hidden, target, ids, lambda s, t, j: framework(s, t, j, False))
    assert abs(ours[0] - theirs[0]) > 0.1


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("log_z", [None, 0.7])
def test_nce_matches_the_reference(shared, log_z):
    q, hidden, target, ids = inputs(shared, seed=1)
    layer = build(NCE, ForcedDraws(q, ids), shared, learn_log_z=log_z is not None)
    if log_z is not None:
        with torch.no_grad():
            layer.log_z.fill_(log_z)
    qn = q.numpy()
    rows = ids.expand(ROWS, -1) if ids.dim() == 1 else ids
    expected = reference_step(layer, hidden, target, ids, lambda s, t, j: ref.nce(s, t, j, qn, log_z or 0.0))
    assert_matches(lmtrain_step(layer, hidden, target), expected)
    if log_z is not None:
        scores = (torch.cat([hidden, torch.ones(ROWS, 1, dtype=hidden.dtype)], 1) @ layer.weight.detach().T).numpy()
        d_log_z = sum(ref.nce(scores[i], int(target[i]), rows[i].numpy(), qn, log_z)[2] for i in range(ROWS))
        assert layer.log_z.grad.item() == pytest.approx(d_log_z, rel=1e-10)


@pytest.mark.parametrize("shared", [False, True])
def test_negative_sampling_matches_the_reference(shared):
    q, hidden, target, ids = inputs(shared, seed=2)
    layer = build(NegativeSampling, ForcedDraws(q, ids), shared)
    expected = reference_step(layer, hidden, target, ids, lambda s, t, j: ref.negative_sampling(s, t, j))
    assert_matches(lmtrain_step(layer, hidden, target), expected)
