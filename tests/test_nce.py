"""NCE and negative sampling: losses against the direct formulas, exact evaluation, self-normalization."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from lmtrain.config import CONF_DIR
from lmtrain.output import NCE, NegativeSampling
from lmtrain.run.build import build_output
from lmtrain.sampler import SoftmaxSampler, UniformSampler, UnigramSampler
from tests.helpers import draw_negatives, log_q_from

N_CLASSES, DIM = 25, 6
COUNTS = torch.arange(N_CLASSES, 0, -1) ** 2


def scores(layer, hidden: torch.Tensor) -> torch.Tensor:
    return (layer.query(hidden) @ layer.weight.T).detach()  # (N, n) every class's score s


def batch(rows: int = 12, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, DIM, generator=gen), torch.randint(N_CLASSES, (rows,), generator=gen)


def make(cls, sampler, **kwargs):
    torch.manual_seed(0)
    layer = cls(N_CLASSES, DIM, sampler, init_range=0.5, bias_init="zero", **kwargs)  # the biases are set below
    with torch.no_grad():
        layer.weight[:, -1].uniform_(-1, 1)
    return layer


def draw_then_loss(layer, hidden, target, seed: int = 4):
    torch.manual_seed(seed)
    ids, log_q, _ = draw_negatives(layer, hidden)
    torch.manual_seed(seed)
    return ids, log_q, layer.loss(hidden, target)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("log_z", [None, 0.7])
def test_nce_loss_matches_the_formula(shared, log_z):
    sampler = UnigramSampler(N_CLASSES, COUNTS, power=0.75)
    layer = make(NCE, sampler, num_samples=15, shared_negatives=shared, learn_log_z=log_z is not None)
    if log_z is not None:
        with torch.no_grad():
            layer.log_z.fill_(log_z)
    hidden, target = batch()
    ids, _, loss = draw_then_loss(layer, hidden, target)
    s = scores(layer, hidden)
    log_q = log_q_from(sampler, None, torch.arange(N_CLASSES))
    ids = ids.expand(hidden.shape[0], -1) if ids.dim() == 1 else ids  # (N, k)
    k, ln_z = 15, log_z or 0.0
    delta_t = s.gather(1, target[:, None]) - math.log(k) - log_q[target][:, None] - ln_z
    delta_s = s.gather(1, ids) - math.log(k) - log_q[ids] - ln_z
    # -ln P(data | Δ_t) - Σ ln P(noise | Δ_s), with P(data) = σ(Δ)
    expected = (-F.logsigmoid(delta_t).sum(1) - F.logsigmoid(-delta_s).sum(1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    loss.backward()
    if log_z is not None:
        assert layer.log_z.grad is not None and layer.log_z.grad.abs() > 0


def test_nce_with_a_per_example_proposal_uses_its_log_q():
    layer = make(NCE, SoftmaxSampler(N_CLASSES), num_samples=8)
    hidden, target = batch()
    ids, log_q, loss = draw_then_loss(layer, hidden, target)
    assert ids.shape == log_q.shape == (hidden.shape[0], 8)
    s = scores(layer, hidden)
    log_p = torch.log_softmax(s, 1)  # the proposal is the model's own softmax
    delta_t = s.gather(1, target[:, None]) - math.log(8) - log_p.gather(1, target[:, None])
    delta_s = s.gather(1, ids) - math.log(8) - log_p.gather(1, ids)
    expected = (F.softplus(-delta_t).sum(1) + F.softplus(delta_s).sum(1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_negative_sampling_loss_matches_the_formula(shared):
    layer = make(
        NegativeSampling,
        UnigramSampler(N_CLASSES, COUNTS, power=0.75),
        num_samples=10,
        shared_negatives=shared,
    )
    hidden, target = batch()
    ids, _, loss = draw_then_loss(layer, hidden, target)
    s = scores(layer, hidden)
    ids = ids.expand(hidden.shape[0], -1) if ids.dim() == 1 else ids
    expected = (-F.logsigmoid(s.gather(1, target[:, None])).sum(1) - F.logsigmoid(-s.gather(1, ids)).sum(1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


def test_nce_reports_mean_log_normalizer():
    layer = make(NCE, UniformSampler(N_CLASSES), learn_log_z=True)
    hidden, _ = batch()
    metrics = layer.extra_metrics(hidden)
    torch.testing.assert_close(metrics["log_z"], torch.logsumexp(scores(layer, hidden), 1).mean())
    assert metrics["log_z_learned"].item() == 0.0


def nce_gradient(shift: float, batches: int = 40, rows: int = 400) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error of d loss / d s at s = ln p + shift, one context, targets drawn from p."""
    torch.manual_seed(0)
    n = 10
    p = torch.softmax(torch.randn(n), 0)
    layer = NCE(n, 1, UnigramSampler(n, torch.arange(n, 0, -1) * 10), num_samples=5, bias_init="zero")
    with torch.no_grad():
        layer.weight[:, -1] = p.log() + shift  # h = 0: the scores are the bias column
    grads = []
    for _ in range(batches):
        layer.weight.grad = None
        layer.loss(torch.zeros(rows, 1), torch.multinomial(p, rows, replacement=True)).backward()
        grads.append(layer.weight.grad.to_dense()[:, -1])
    grads = torch.stack(grads)  # (batches, n)
    return grads.mean(0), grads.std(0) / math.sqrt(batches)


def test_nce_is_stationary_at_the_self_normalized_model():
    """With ln Z = 0 the expected NCE gradient vanishes at s = ln p (any k), and not at ln p + 0.5."""
    mean, stderr = nce_gradient(0.0)
    assert ((mean.abs() / stderr) < 4.5).all(), mean.abs() / stderr
    mean, stderr = nce_gradient(0.5)
    assert (mean > 0).all() and (mean / stderr).min() > 5  # too large scores are pushed down


@pytest.mark.parametrize(
    ("overrides", "cls", "sampler_type", "power"),
    [
        (["output=nce"], NCE, UnigramSampler, 0.75),
        (["output=negative"], NegativeSampling, UnigramSampler, 0.75),
        (["output=nce", "sampler.power=0.5"], NCE, UnigramSampler, 0.5),
        (["output=nce", "sampler=uniform"], NCE, UniformSampler, None),
        (["output=nce", "output.learn_log_z=true"], NCE, UnigramSampler, 0.75),
    ],
)
def test_configs_build_nce_and_negative_sampling(overrides, cls, sampler_type, power):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["~data", *overrides])
    output = build_output(cfg, N_CLASSES, DIM, COUNTS)
    assert type(output) is cls and type(output.sampler) is sampler_type
    assert getattr(output.sampler, "power", None) == power
    hidden, target = batch()
    assert torch.isfinite(output.loss(hidden, target))


def test_log_unigram_bias_init_starts_nce_normalized_and_frequency_ordered():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["~data", "output=nce"])
    layer = build_output(cfg, N_CLASSES, DIM, COUNTS)
    bias = layer.weight[:, -1].detach()
    smoothed = COUNTS.double() + 1
    torch.testing.assert_close(bias.double(), (smoothed / smoothed.sum()).log(), rtol=0, atol=1e-6)
    hidden, _ = batch(rows=50)
    log_z = layer.log_normalizer(hidden)  # (N,): ln sum exp(s) of the model as built
    # weights in +-init_range perturb each score by |w.h| <~ 0.1 * |h|_1: near 0, far from ln n at zero biases
    assert log_z.abs().max() < 0.5 < math.log(N_CLASSES)


def test_bias_init_options_are_checked():
    from lmtrain.config import ConfigError, compose_config
    from lmtrain.output import AbsoluteSampledSoftmax, FullSoftmax

    full = FullSoftmax(N_CLASSES, DIM, bias_init="log_unigram", counts=COUNTS)
    assert torch.equal(full.bias.argsort(descending=True), COUNTS.argsort(descending=True))
    assert torch.logsumexp(full.bias, 0).abs() < 1e-5
    with pytest.raises(ValueError, match="needs the training counts"):
        FullSoftmax(N_CLASSES, DIM, bias_init="log_unigram")
    with pytest.raises(ConfigError, match=r"output\.bias_init must be one of 'zero', 'log_unigram', got 'ones'"):
        compose_config(["output=full", "output.bias_init=ones"])  # the schema's check, before anything is built
    with pytest.raises(ValueError, match=r"scores \|o\|"):
        AbsoluteSampledSoftmax(N_CLASSES, DIM, UniformSampler(N_CLASSES), bias_init="log_unigram", counts=COUNTS)
