"""lmtrain's sampled losses and gradients against the independent NumPy reference (issue 22, item 5).

The draws are forced: a ``ForcedDraws`` sampler returns given ids with log q from a given proposal q, so the loss
of one step is a deterministic function of the scores, and lmtrain's loss (mean over positions) and its gradients
with respect to the hidden states and the class matrix [W, b] must equal ``tests/reference_np.py`` in float64 to
1e-10 (relative). The forced ids include accidental hits: one position whose every draw is its target (k_t = 0),
one with two hits, one with a single kept draw (k_t = 1), and the rest random; negatives are forced per position
(N, m) or shared by the batch (m,).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from lmtrain.output import NCE, AbsoluteSampledSoftmax, CosineSampledSoftmax, NegativeSampling, SampledSoftmax
from lmtrain.output.sampled import SampledOutput
from lmtrain.sampler import Sampler
from lmtrain.sampler.proposal import Draws, Proposal, TableProposal, positions_of
from tests import reference_np as ref
from tests.helpers import draw_negatives

N_CLASSES, DIM, ROWS, M = 12, 4, 6, 5
TOL = {"rtol": 1e-10, "atol": 1e-12}


class ForcedDraws(Sampler):
    """A proposal ``q`` (n,) whose draws are fixed in advance: ``ids`` (N, m) per position or (m,) for the batch."""

    def __init__(self, q: Tensor, ids: Tensor) -> None:
        super().__init__()
        self.q, self.ids = q, ids
        self.shared = ids.dim() == 1

    def share_negatives(self, shared: bool) -> None:
        """The forced ids fix the mode."""

    def propose(self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None) -> Proposal:
        return ForcedProposal(self, targets)


class ForcedProposal(Proposal):
    """``ForcedDraws``' proposal of one step."""

    def __init__(self, sampler: ForcedDraws, targets: Tensor | None) -> None:
        self.sampler, self.targets, self.shared = sampler, targets, sampler.shared

    def draw(self, num_samples: int) -> Draws:
        ids = self.sampler.ids
        assert num_samples == ids.shape[-1]
        target_log_q = None if self.targets is None else self.log_q(self.targets.view(-1, 1))
        return Draws(ids.clone(), self.log_q(ids), target_log_q)

    def log_q(self, ids: Tensor) -> Tensor:
        return self.sampler.q.log()[ids]


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
    ids[2, :-1] = target[2]  # one draw kept: k_t = 1
    ids[2, -1] = (target[2] + 1) % N_CLASSES
    return q, hidden, target, ids


def build(cls: type[SampledOutput], sampler: Sampler, shared: bool, **options: object) -> SampledOutput:
    torch.manual_seed(1)
    options.update(num_samples=M, shared_negatives=shared, sparse=False, init_range=0.8)
    if "bias_init" in cls.Options.__dataclass_fields__:
        options["bias_init"] = "zero"  # no counts here; the biases are set below
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
    assert (layer.log_z is None) == (log_z is None)  # ln Z is a parameter only when it is learned
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


class ForcedStream(Sampler):
    """A batch-shared proposal ``q`` (n,) whose successive draws are the given ``stream``, ``num_samples`` at a
    time (for ``unique``: draws until m distinct ids are seen)."""

    def __init__(self, q: Tensor, stream: list[int]) -> None:
        super().__init__()
        self.q, self.stream, self.at = q, stream, 0

    def next_ids(self, num_samples: int) -> Tensor:
        ids = torch.tensor(self.stream[self.at : self.at + num_samples])
        self.at += num_samples
        return ids

    def propose(self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None) -> Proposal:
        return TableProposal(self.next_ids, self.q.log(), positions_of(query, inputs, targets), True, targets)


def test_unique_negatives_match_the_reference():
    """``unique``: the first m distinct ids of the stream in draw order, T = the draws it took to see them, and
    o'_j = o_j - ln(1 - (1 - q_j)^T) with hits removed (docs/strategies.md)."""
    q, hidden, target, _ = inputs(shared=True, seed=4)
    stream = [3, 3, 7, 3, 1, 7, 9, 1, 0, 5, 2, 2, 4, 6, 8]  # 5 distinct ids (3, 7, 1, 9, 0) after 9 draws
    layer = build(SampledSoftmax, ForcedStream(q, stream), True, unique=True)
    ids, log_q, tries = draw_negatives(layer, hidden)
    assert ids.tolist() == [3, 7, 1, 9, 0] and float(tries) == 9
    torch.testing.assert_close(log_q, q.log()[ids])
    layer.sampler.at = 0
    qn = q.numpy()

    def position(s: np.ndarray, t: int, j: np.ndarray) -> tuple[float, np.ndarray]:
        entries = [(t, float(s[t]))] + [(int(c), float(s[c]) - np.log(1 - (1 - qn[c]) ** 9)) for c in j if c != t]
        logits = np.array([v for _, v in entries])
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        grad = np.zeros_like(s)
        for (cls, _), w in zip(entries, weights, strict=True):
            grad[cls] += w
        grad[t] -= 1.0
        return float(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - s[t]), grad

    expected = reference_step(layer, hidden, target, ids, position)
    assert_matches(lmtrain_step(layer, hidden, target), expected)


class NeedsInputs(ForcedDraws):
    """``ForcedDraws`` that, like the bigram proposal, needs the input tokens and checks they are the batch's."""

    def __init__(self, q: Tensor, ids: Tensor, expected_inputs: Tensor) -> None:
        super().__init__(q, ids)
        self.expected_inputs = expected_inputs

    def propose(self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None) -> Proposal:
        assert inputs is not None and torch.equal(inputs, self.expected_inputs)
        return super().propose(query, inputs, targets)


@pytest.mark.parametrize("cls", [SampledSoftmax, NCE, NegativeSampling])
def test_every_loss_hands_the_input_tokens_to_the_sampler(cls):
    q, hidden, target, ids = inputs(shared=False, seed=5)
    tokens = torch.arange(ROWS) % N_CLASSES
    layer = build(cls, NeedsInputs(q, ids, tokens), False)
    assert torch.isfinite(layer.loss(hidden, target, tokens))


@pytest.mark.parametrize("norm_eps", [0.0, 2.0])
def test_cosine_and_absolute_scores_are_the_documented_logits(norm_eps):
    """``output=rff``: tau * <h / sqrt(|h|^2 + eps^2), w / |w|> (eps = 0: h / |h|); ``output=quadratic``:
    |[h, 1] . [w, b]|; checked through the exact distribution both evaluate, log_probs_all, against NumPy."""
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(ROWS, DIM, generator=gen, dtype=torch.float64)
    q = torch.full((N_CLASSES,), 1.0 / N_CLASSES, dtype=torch.float64)
    ids = torch.zeros(ROWS, M, dtype=torch.long)
    cosine = build(CosineSampledSoftmax, ForcedDraws(q, ids), False, tau=7.0, norm_eps=norm_eps)
    h, w = hidden.numpy(), cosine.weight.detach().numpy()
    unit_h = h / np.sqrt((h**2).sum(1, keepdims=True) + norm_eps**2)
    logits = 7.0 * unit_h @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    expected = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    torch.testing.assert_close(cosine.log_probs_all(hidden).detach(), torch.from_numpy(expected), **TOL)
    absolute = build(AbsoluteSampledSoftmax, ForcedDraws(q, ids), False)
    w = absolute.weight.detach().numpy()
    logits = np.abs(np.concatenate([h, np.ones((ROWS, 1))], axis=1) @ w.T)
    expected = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    torch.testing.assert_close(absolute.log_probs_all(hidden).detach(), torch.from_numpy(expected), **TOL)
