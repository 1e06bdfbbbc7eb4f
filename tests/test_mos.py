"""The mixture of softmaxes (``output=mos``): exact log-probabilities against a written-out mixture, the training loss
as their mean, its chunked form, the latent dropout, gradients, tying, the refusals and the AWD-LSTM-MoS preset."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmtrain.config import ConfigError, compose_config
from lmtrain.output.mos import MixtureOfSoftmaxes, MoSOptions
from lmtrain.run.build import build_module
from tests.conftest import make_config

pytestmark = pytest.mark.usefixtures("one_thread")
N, D, K, E = 7, 6, 3, 5  # positions, hidden width, components, component width
CLASSES = 11


def layer(num_classes: int = CLASSES, dim: int = D, **options) -> MixtureOfSoftmaxes:
    """A float64 layer with spread weights and nonzero biases everywhere, so that a dropped term shows."""
    torch.manual_seed(0)
    out = MixtureOfSoftmaxes(num_classes, dim, **{"components": K, "component_dim": E, "init_range": 0.8, **options})
    with torch.no_grad():
        out.bias.normal_(std=1.0)
        out.latent_bias.normal_(std=0.5)
    return out.double()


def written_out_log_prob(out: MixtureOfSoftmaxes, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """log sum_k pi_k(h) exp(o_k[t]) / sum_w exp(o_k[w]), o_k = W tanh(P_k h + c_k) + b, pi = exp(U h) / sum exp(U h):
    a loop over positions and components with explicit exp and sum (differentiable in the layer's parameters)."""
    k, e = out.components, out.component_dim
    rows = []
    for i in range(hidden.shape[0]):
        h = hidden[i]
        prior_scores = torch.stack([(out.prior_weight[c] * h).sum() for c in range(k)])  # (K,)
        prior = prior_scores.exp() / prior_scores.exp().sum()
        p = 0.0
        for c in range(k):
            p_c, c_c = out.latent_weight[c * e : (c + 1) * e], out.latent_bias[c * e : (c + 1) * e]  # (E, d), (E,)
            context = torch.tanh((p_c * h).sum(1) + c_c)  # (E,)
            logits = (out.weight * context).sum(1) + out.bias  # (n,)
            p = p + prior[c] * logits[target[i]].exp() / logits.exp().sum()
        rows.append(torch.log(p))
    return torch.stack(rows)


def inputs(num_classes: int = CLASSES, dim: int = D, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, dim, generator=gen, dtype=torch.float64) * 2
    return hidden, torch.randint(0, num_classes, (N,), generator=gen)


@pytest.mark.parametrize("eval_chunk", [65536, 4])  # dense, and 3 vocabulary chunks (the last one partial)
def test_log_prob_equals_the_written_out_mixture(eval_chunk):
    out = layer(eval_chunk=eval_chunk)
    hidden, target = inputs()
    with torch.no_grad():
        expected = written_out_log_prob(out, hidden, target)
        torch.testing.assert_close(out.log_prob(hidden, target), expected, rtol=1e-12, atol=1e-12)


def test_log_probs_all_is_a_distribution_and_matches_log_prob():
    out = layer()
    hidden, _ = inputs()
    with torch.no_grad():
        every = out.log_probs_all(hidden)  # (N, n)
        torch.testing.assert_close(every.exp().sum(1), torch.ones(N, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        for c in range(CLASSES):
            torch.testing.assert_close(every[:, c], out.log_prob(hidden, torch.full((N,), c)), rtol=1e-12, atol=1e-12)


# dense; the hand-written chunks over the (N K) component rows; torch's row chunks (the 11 x 5 weight fits 500 bytes,
# the 21 x 11 logits do not)
@pytest.mark.parametrize("options", [{"train_chunk": 0}, {"train_chunk": 4}, {"logits_mib": 500 / 2**20}])
def test_loss_and_gradients_are_the_written_out_mean_nll(options):
    """The training loss is mean -log p, and its gradients are the written-out model's in every parameter (the
    prior's U, the projections P and c, the class vectors W and biases b) and in the hidden states."""
    out = layer(**options)
    hidden, target = inputs()
    hidden.requires_grad_(True)
    loss = out.loss(hidden, target)
    got = torch.autograd.grad(loss, [hidden, *out.parameters()])
    reference = -written_out_log_prob(out, hidden, target).mean()
    want = torch.autograd.grad(reference, [hidden, *out.parameters()])
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    names = ["hidden", *(name for name, _ in out.named_parameters())]
    assert {"prior_weight", "latent_weight", "latent_bias", "weight", "bias"} <= set(names)
    for name, g, w in zip(names, got, want, strict=True):
        assert w.abs().sum() > 0, name  # every parameter has a gradient to match
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)


def test_one_component_with_an_identity_projection_is_a_softmax_over_tanh_h():
    out = layer(components=1, component_dim=D)
    with torch.no_grad():
        out.latent_weight.copy_(torch.eye(D))
        out.latent_bias.zero_()
    hidden, target = inputs()
    softmax = torch.log_softmax(torch.tanh(hidden) @ out.weight.T + out.bias, dim=1)  # (N, n)
    with torch.no_grad():
        torch.testing.assert_close(out.log_probs_all(hidden), softmax, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.loss(hidden, target), F.nll_loss(softmax, target), rtol=1e-12, atol=1e-12)


def test_latent_dropout_drops_the_context_vectors_in_the_training_loss_only():
    """In training the loss is the written-out mixture with the context vectors tanh(P h + c) masked (the mask
    that the same draw gives); in eval mode, and in log_prob in any mode, nothing is dropped."""
    out = layer(latent_dropout=0.5)
    hidden, target = inputs()
    torch.manual_seed(5)
    dropped = out.loss(hidden, target)
    torch.manual_seed(5)
    mask = F.dropout(torch.ones(N, K * E, dtype=torch.float64), 0.5)  # (N, K E): the same draw
    context = torch.tanh(hidden @ out.latent_weight.T + out.latent_bias) * mask  # (N, K E)
    log_p = torch.log_softmax(context.view(N * K, E) @ out.weight.T + out.bias, dim=1).view(N, K, CLASSES)
    mixed = torch.logsumexp(torch.log_softmax(hidden @ out.prior_weight.T, 1)[:, :, None] + log_p, dim=1)  # (N, n)
    torch.testing.assert_close(dropped, -mixed.gather(1, target[:, None]).mean(), rtol=1e-12, atol=1e-12)
    exact = written_out_log_prob(out, hidden, target)
    assert not torch.allclose(dropped, -exact.mean())
    torch.testing.assert_close(out.log_prob(hidden, target), exact, rtol=1e-12, atol=1e-12)  # training mode
    out.eval()
    torch.testing.assert_close(out.loss(hidden, target), -exact.mean(), rtol=1e-12, atol=1e-12)


def tied_module(*overrides: str):
    cfg = compose_config(
        ["data=synthetic", "model.emb_dim=6", "model.hidden_dim=10", "model.num_layers=2", "model.tie_weights=true"]
        + ["model.init_range=0.5", "output=mos", "output.components=3", *overrides]
    )
    torch.manual_seed(0)
    return build_module(cfg, 40, torch.arange(40, 0, -1), None).double()


def test_tied_weights_share_the_class_vectors_and_both_sides_gradients_add_up():
    module = tied_module()
    enc, out = module.encoder, module.output
    assert enc.embedding is None and out.weight.shape == (40, 6) and out.component_dim == 6
    assert sum(p is out.weight for p in module.parameters()) == 1
    with torch.no_grad():
        out.weight[5] = 7.0  # in place: the encoder reads the same storage
    assert torch.equal(enc.tied(torch.tensor([[5]]))[0, 0], torch.full((6,), 7.0, dtype=torch.float64))
    x, y = torch.randint(0, 40, (3, 4)), torch.randint(0, 40, (3, 4))

    def loss() -> torch.Tensor:
        return out.loss(enc(x)[0].reshape(-1, 6), y.reshape(-1))

    loss().backward()
    tied_grad, out.weight.grad = out.weight.grad.clone(), None
    own = out.weight.detach().clone().requires_grad_()  # the same step untied: a copy as the input embedding
    enc.tied = lambda tokens: F.embedding(tokens, own)
    loss().backward()
    assert own.grad.abs().max() > 1e-4 * out.weight.grad.abs().max()  # the input side's share is not lost in rounding
    torch.testing.assert_close(tied_grad, out.weight.grad + own.grad, rtol=1e-10, atol=1e-14)


def test_a_tied_component_width_other_than_emb_dim_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"output.component_dim equal to model.emb_dim \(6\), got 4") as err:
        tied_module("output.component_dim=4")
    assert len(str(err.value).splitlines()) == 1
    tied_module("output.component_dim=6")  # the same width is fine
    out = MixtureOfSoftmaxes(20, 6, component_dim=4)  # built in Python, then tied: refused at the first lookup
    with pytest.raises(ValueError, match="a tied output=mos needs output.component_dim equal to model.emb_dim") as e:
        out.embed(torch.tensor([1]))
    assert len(str(e.value).splitlines()) == 1


def test_an_untied_component_width_may_differ_from_the_hidden_width():
    out = MixtureOfSoftmaxes(20, 6, components=2, component_dim=9)
    assert out.weight.shape == (20, 9) and out.latent_weight.shape == (18, 6) and out.prior_weight.shape == (2, 6)
    hidden = torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(out.log_probs_all(hidden).exp().sum(1), torch.ones(4))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"components": 0}, "components must be >= 1, got 0"),
        ({"component_dim": 0}, "component_dim must be >= 1, got 0"),
        ({"latent_dropout": 1.0}, "latent_dropout must be < 1, got 1.0"),
        ({"latent_dropout": -0.1}, "latent_dropout must be >= 0, got -0.1"),
        ({"init_range": 0.0}, "init_range must be > 0, got 0.0"),
        ({"bias_init": "ones"}, "bias_init must be one of 'zero', 'log_unigram', got 'ones'"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as err:
        MoSOptions(**options)
    assert len(str(err.value).splitlines()) == 1
    key, value = next(iter(options.items()))
    with pytest.raises(ConfigError, match=f"output.{message}"):
        compose_config(["data=synthetic", "output=mos", f"output.{key}={value}"])


# the mixture's own operators on top of the full softmax's step: the prior's and the projections' products and
# their gradients, tanh, the prior's log-softmax, the log-sum-exp over the components and the targets laid out K times
MIXTURE_OPERATORS = 23


@pytest.mark.parametrize("chunk", [0, 500])  # dense, and chunked (4 vocabulary chunks)
def test_a_step_launches_the_same_operators_for_any_number_of_components(chunk):
    """The K softmaxes are one (N K, d_e) x (d_e, n) product, so a step's operators do not grow with K: full's plus
    a fixed set, with one host sync (the loss read), as on a GPU."""
    from lab.launches import count_train_step

    small = ["model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1", "step_forms=gpu"]
    full = count_train_step([*small, "output=full", f"output.train_chunk={chunk}"], 2000)
    steps = [count_train_step([*small, "output=mos", "output.components=2", f"output.train_chunk={chunk}"], 2000)]
    steps += [count_train_step([*small, "output=mos", "output.components=15", f"output.train_chunk={chunk}"], 2000)]
    assert steps[0].launches == steps[1].launches <= full.launches + MIXTURE_OPERATORS, (steps, full)
    assert all(step.syncs <= 1 for step in steps), [dict(step.sync_ops) for step in steps]


def test_the_awd_lstm_mos_preset_has_the_papers_ptb_settings():
    cfg = make_config(["experiment=awd_lstm_mos_ptb", "run_dir=/tmp/unused"])
    m, o, d = cfg.model, cfg.output, cfg.data
    assert cfg.output._target_ == "lmtrain.output.mos.MixtureOfSoftmaxes" and cfg.data.name == "ptb"
    assert (m.num_layers, m.emb_dim, m.hidden_dim, m.tie_weights, o.components, o.component_dim) == (
        3, 280, 960, True, 15, None
    )  # fmt: skip
    rates = (m.dropout_input, m.dropout_between, m.dropout_output, m.word_dropout, m.weight_drop, o.latent_dropout)
    assert rates == (0.4, 0.225, 0.4, 0.1, 0.5, 0.29) and m.locked_dropout
    assert (d.batch_size, d.bptt, d.variable_bptt, cfg.optim.lr, cfg.optim.clip) == (12, 70, True, 20.0, 0.25)
    assert (cfg.optim.average, cfg.trainer.max_epochs, cfg.loss_reduction) == ("nonmono", 1000, "mean")
    assert math.isclose(cfg.optim.weight_decay, 1.2e-6)
    assert (m.activation_reg, m.temporal_activation_reg) == (2.0, 1.0)
