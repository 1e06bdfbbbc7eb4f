"""Sampled softmax: exactness with the model's own softmax, (un)biased gradients, the formula, options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from lmtrain.config import CONF_DIR, ConfigError, compose_config
from lmtrain.output import SampledSoftmax
from lmtrain.run.build import build_output
from lmtrain.sampler import Sampler, SoftmaxSampler, UniformSampler, UnigramSampler
from tests.helpers import draw_negatives, log_q_all_from, log_q_from

N_CLASSES, DIM = 30, 8


def full_logits(layer: SampledSoftmax, hidden: torch.Tensor) -> torch.Tensor:
    return layer.query(hidden) @ layer.weight.T  # (N, n)


def make_layer(sampler: Sampler, seed: int = 0, **kwargs) -> SampledSoftmax:
    torch.manual_seed(seed)
    layer = SampledSoftmax(N_CLASSES, DIM, sampler, init_range=0.5, **kwargs)
    with torch.no_grad():
        layer.weight[:, -1].uniform_(-1, 1)  # nonzero biases, so the bias column is exercised too
    return layer


def batch(rows: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, DIM, generator=gen), torch.randint(N_CLASSES, (rows,), generator=gen)


@pytest.mark.parametrize("bias", [True, False])
def test_softmax_proposal_gives_the_full_softmax_loss_on_every_draw(bias):
    layer = make_layer(SoftmaxSampler(N_CLASSES), num_samples=10, bias=bias)
    hidden, target = batch()
    full = F.cross_entropy(full_logits(layer, hidden), target)
    for seed in range(20):
        torch.manual_seed(seed)
        torch.testing.assert_close(layer.loss(hidden, target), full, rtol=1e-5, atol=1e-5)


def monte_carlo_logit_gradient(sampler: Sampler, num_samples: int, batches: int = 40, rows: int = 400):
    """Mean and standard error of d loss / d logits over batches of draws, and the full-softmax gradient.

    With h = 0 the query is [0, ..., 0, 1], so the logits are the bias column and its gradient is the
    gradient w.r.t. the logits. Each batch averages ``rows`` independent draws for the same position.
    """
    torch.manual_seed(1)
    layer = SampledSoftmax(20, 4, sampler, num_samples=num_samples)
    logits = 2.0 * torch.randn(20)
    with torch.no_grad():
        layer.weight[:, -1] = logits
    target = int(logits.argmin())  # a small q_t: k_t = 0 (every draw a hit) practically never happens
    hidden, targets = torch.zeros(rows, 4), torch.full((rows,), target)
    grads = []
    for _ in range(batches):
        layer.weight.grad = None
        layer.loss(hidden, targets).backward()
        grads.append(layer.weight.grad.to_dense()[:, -1])
    grads = torch.stack(grads)  # (batches, n)
    full = torch.softmax(logits, 0) - F.one_hot(torch.tensor(target), 20)
    return grads.mean(0), grads.std(0) / math.sqrt(batches), full


def test_softmax_proposal_gradient_is_unbiased():
    mean, stderr, full = monte_carlo_logit_gradient(SoftmaxSampler(20), num_samples=5)
    assert ((mean - full).abs() <= 4.5 * stderr + 1e-5).all(), ((mean - full).abs() / stderr).max()


def test_uniform_proposal_gradient_is_biased_at_small_m():
    mean, stderr, full = monte_carlo_logit_gradient(UniformSampler(20), num_samples=2)
    assert ((mean - full).abs() / stderr).max() > 10
    assert (mean - full).abs().max() > 0.05


def reference_loss(layer, hidden, target, ids, log_q_all, exact: bool, remove_hits: bool) -> torch.Tensor:
    """The exact correction (docs/strategies.md) on the full logit matrix, for given negatives and a context-free q."""
    logits = full_logits(layer, hidden).detach()  # (N, n)
    ids = ids.expand(hidden.shape[0], -1) if ids.dim() == 1 else ids  # (N, m)
    m = ids.shape[1]
    o_t = logits.gather(1, target[:, None])  # (N, 1)
    o_s = logits.gather(1, ids)
    hits = ids == target[:, None]
    if exact and remove_hits:
        kept = (m - hits.sum(1, keepdim=True)).clamp(min=1).float()
        rest = 1 - log_q_all[target].exp()[:, None]  # 1 - q_t
        o_s = o_s - torch.log(kept * log_q_all[ids].exp() / rest)
    else:
        o_s = o_s - torch.log(m * log_q_all[ids].exp())
    if remove_hits:
        o_s = o_s.masked_fill(hits, -math.inf)
    return (torch.logsumexp(torch.cat([o_t, o_s], 1), 1) - o_t[:, 0]).mean()


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("correction", ["exact", "classic"])
@pytest.mark.parametrize("remove_hits", [True, False])
@pytest.mark.parametrize("kind", ["uniform", "unigram"])
def test_loss_matches_the_direct_formula(shared, correction, remove_hits, kind):
    counts = torch.arange(N_CLASSES, 0, -1) ** 2
    sampler = UniformSampler(N_CLASSES) if kind == "uniform" else UnigramSampler(N_CLASSES, counts)
    layer = make_layer(
        sampler,
        num_samples=12,
        correction=correction,
        remove_accidental_hits=remove_hits,
        shared_negatives=shared,
    )
    hidden, target = batch()
    torch.manual_seed(5)
    ids, _, _ = draw_negatives(layer, hidden)
    assert ids.shape == ((12,) if shared else (16, 12))
    torch.manual_seed(5)
    loss = layer.loss(hidden, target)
    log_q_all = log_q_from(sampler, None, torch.arange(N_CLASSES))
    expected = reference_loss(layer, hidden, target, ids, log_q_all, correction == "exact", remove_hits)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


def test_unique_draws_distinct_negatives_with_expected_count_correction():
    counts = torch.arange(N_CLASSES, 0, -1) ** 2
    sampler = UnigramSampler(N_CLASSES, counts)
    layer = make_layer(sampler, num_samples=10, unique=True, shared_negatives=True)
    hidden, target = batch()
    torch.manual_seed(7)
    ids, log_q, tries = draw_negatives(layer, hidden)
    assert ids.unique().numel() == 10 and tries >= 10
    torch.manual_seed(7)
    loss = layer.loss(hidden, target)
    logits = full_logits(layer, hidden).detach()
    expected_count = 1 - (1 - log_q.exp()) ** tries  # (m,)
    o_s = (logits[:, ids] - expected_count.log()).masked_fill(ids[None] == target[:, None], -math.inf)
    o_t = logits.gather(1, target[:, None])
    expected = (torch.logsumexp(torch.cat([o_t, o_s], 1), 1) - o_t[:, 0]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eval_chunk", [7, 65536])  # several vocabulary chunks / one logits matrix
@pytest.mark.parametrize("bias", [True, False])
def test_log_prob_is_the_exact_full_softmax(bias, eval_chunk):
    layer = make_layer(UniformSampler(N_CLASSES), bias=bias, eval_chunk=eval_chunk)
    hidden, target = batch()
    expected = torch.log_softmax(full_logits(layer, hidden), 1).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(layer.log_prob(hidden, target), expected, rtol=1e-5, atol=1e-5)


def test_training_gradient_touches_only_the_target_and_sampled_rows():
    layer = make_layer(UniformSampler(N_CLASSES), num_samples=5, shared_negatives=True)
    hidden, target = batch(rows=4)
    torch.manual_seed(3)
    ids, _, _ = draw_negatives(layer, hidden)
    torch.manual_seed(3)
    layer.loss(hidden, target).backward()
    grad = layer.weight.grad
    assert grad.is_sparse
    touched = set(grad.coalesce().indices()[0].tolist())
    assert touched == set(ids.tolist()) | set(target.tolist())


def test_state_dict_load_points_the_softmax_sampler_at_the_loaded_weights():
    source = make_layer(SoftmaxSampler(N_CLASSES), seed=1)
    layer = make_layer(SoftmaxSampler(N_CLASSES), seed=2)
    layer.load_state_dict(source.state_dict())
    hidden, target = batch()
    torch.testing.assert_close(
        log_q_from(layer.sampler, layer.query(hidden), target[:, None]),
        torch.log_softmax(full_logits(source, hidden), 1).gather(1, target[:, None]),
    )
    assert layer.sampler._weight.data_ptr() == layer.weight.data_ptr()


@pytest.mark.parametrize(
    ("sampler", "kwargs", "message"),
    [
        (SoftmaxSampler(N_CLASSES), {"unique": True}, "unique=true needs shared negatives"),
        (UniformSampler(N_CLASSES), {"unique": True, "shared_negatives": False}, "unique=true needs shared"),
        (
            UniformSampler(N_CLASSES),
            {"unique": True, "shared_negatives": True, "num_samples": N_CLASSES},
            "num_samples < num_classes",
        ),
    ],
)
def test_bad_options_raise_value_error(sampler, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampledSoftmax(N_CLASSES, DIM, sampler, **kwargs)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("output.num_samples=0", r"output\.num_samples must be >= 1, got 0"),
        ("output.correction=bogus", r"output\.correction must be one of 'exact', 'classic', got 'bogus'"),
    ],
)
def test_out_of_range_options_are_refused_by_the_schema(override, message):
    with pytest.raises(ConfigError, match=message):  # checked once, before anything is built
        compose_config(["output=sampled", override])


@pytest.mark.parametrize(
    ("overrides", "sampler_type"),
    [
        (["output=uniform"], UniformSampler),
        (["output=unigram"], UnigramSampler),
        (["output=exp"], SoftmaxSampler),
        (["output=sampled", "sampler=unigram", "sampler.distribution=log_uniform"], UnigramSampler),
    ],
)
def test_configs_build_the_strategies(overrides, sampler_type):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["~data", *overrides])
    output = build_output(cfg, N_CLASSES, DIM, torch.arange(N_CLASSES, 0, -1))
    assert isinstance(output, SampledSoftmax) and isinstance(output.sampler, sampler_type)
    assert output.num_samples == 100 and output.weight.shape == (N_CLASSES, DIM + 1)
    if overrides == ["output=unigram"]:
        assert output.sampler.power == 1.0 and output.sampler.distribution == "unigram"
    hidden, target = batch()
    assert torch.isfinite(output.loss(hidden, target))


@pytest.mark.parametrize("layer_cls", ["CosineSampledSoftmax", "AbsoluteSampledSoftmax"])
def test_softmax_proposal_is_the_models_own_softmax_for_every_logit_kind(layer_cls):
    """output=rff / quadratic with sampler=softmax: q is softmax(tau cos) / softmax(|o|), so every draw's sampled
    loss equals the exact NLL (the exp baseline for those models), and q = p exactly."""
    import lmtrain.output as outputs

    torch.manual_seed(0)
    layer = getattr(outputs, layer_cls)(N_CLASSES, 6, SoftmaxSampler(N_CLASSES), num_samples=7)
    hidden, target = torch.randn(9, 6), torch.randint(N_CLASSES, (9,))
    exact = -layer.log_prob(hidden, target).mean()
    for _ in range(5):
        torch.testing.assert_close(layer.loss(hidden, target), exact)
    log_p = torch.log_softmax(layer.score(layer.query(hidden), layer.weight), 1)
    torch.testing.assert_close(log_q_all_from(layer.sampler, layer.query(hidden), N_CLASSES), log_p)


def test_repeated_per_example_ids_score_as_a_gather_with_a_sparse_row_gradient():
    """Per-example ids that repeat classes: values and row gradients match a plain gather, the gradient sparse."""
    torch.manual_seed(5)
    output = SampledSoftmax(12, 4, UniformSampler(12), num_samples=30)
    query = output.query(torch.randn(6, 4))
    ids = torch.randint(12, (6, 30))  # 180 draws over at most 12 classes
    upstream = torch.randn(6, 30)
    scores = output.query_scores(query, ids)
    (scores * upstream).sum().backward()
    assert output.weight.grad.is_sparse
    plain = (query.unsqueeze(1) * output.weight[ids]).sum(2)  # (6, 30) by an explicit gather
    torch.testing.assert_close(scores, plain)
    expected = torch.autograd.grad((plain * upstream).sum(), output.weight)[0]
    torch.testing.assert_close(output.weight.grad.to_dense(), expected)


def test_softmax_proposal_follows_the_weight_when_the_layer_moves():
    """model.to("cuda") replaces each parameter's tensor; a proposal that kept the old one (output=exp) scored the
    GPU queries against the CPU weight and crashed at the first step. A dtype move replaces the tensor the same
    way, so this catches it without a GPU."""
    layer = make_layer(SoftmaxSampler(N_CLASSES), num_samples=5).double()
    hidden, target = batch()
    loss = layer.loss(hidden.double(), target)  # raised "expected ... Double but found Float" before the fix
    assert loss.dtype == torch.float64 and torch.isfinite(loss)
