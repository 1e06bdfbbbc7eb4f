"""Bias diagnostics: KL(p || q) and the relative sampled-softmax gradient bias, against closed forms."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmtrain.output import SampledSoftmax
from lmtrain.run.run import train
from lmtrain.sampler import SoftmaxSampler, UniformSampler
from lmtrain.tools.diagnose import main as diagnose_main
from lmtrain.tools.estimator_bias import all_logits, gradient_bias, hidden_spread, proposal_kl
from tests.helpers import log_q_all_from


def peaked_model(sampler_cls: type, n: int = 40, d: int = 8, positions: int = 30) -> tuple[SampledSoftmax, ...]:
    """A sampled softmax whose targets get large probabilities (0.3-0.95), so that biases are large."""
    torch.manual_seed(0)
    output = SampledSoftmax(n, d, sampler=sampler_cls(n), num_samples=2)
    with torch.no_grad():
        output.weight.normal_(0, 1.0)
    output.sampler.update(output.weight.detach())
    hidden = torch.randn(positions, d) * 2.0
    target = all_logits(output, hidden).argmax(1)  # the most likely class: p_t is large
    return output, hidden, target


def test_softmax_proposal_bias_is_the_all_hits_probability():
    # With q = p the exact correction makes every draw's loss the full loss; the logit gradient equals
    # p - e_t unless all m draws hit the target (then it is 0), so E[g'] = (1 - p_t^m) g: relative bias p_t^m,
    # whose root mean square over positions the estimator reports.
    output, hidden, target = peaked_model(SoftmaxSampler)
    probs = torch.softmax(all_logits(output, hidden), 1).detach()
    p_t = probs.gather(1, target[:, None]).squeeze(1)
    for m in (1, 3):
        output.num_samples = m
        expected = float((p_t.double() ** (2 * m)).mean().sqrt())
        g_sq = (1 - p_t.double()) ** 2 + (probs.double() ** 2).sum(1) - p_t.double() ** 2  # || p - e_t ||^2
        pooled = float(((p_t.double() ** (2 * m)) * g_sq).sum().div(g_sq.sum()).sqrt())
        estimate = gradient_bias(output, hidden, target, draws=600, groups=10)
        assert expected > 0.05 and pooled > 0.02
        assert abs(estimate.bias - expected) < 4 * estimate.standard_error + 0.01, (m, estimate, expected)
        assert abs(estimate.pooled_bias - pooled) < 4 * estimate.pooled_standard_error + 0.01, (m, estimate, pooled)
        assert 0 < estimate.standard_error < 0.05


def test_uniform_bias_is_large_and_falls_with_m():
    output, hidden, target = peaked_model(UniformSampler)
    small = gradient_bias(output, hidden, target, draws=200, groups=10)
    output.num_samples = 64
    large = gradient_bias(output, hidden, target, draws=200, groups=10)
    assert small.bias > 0.1
    assert large.bias < small.bias - 4 * (small.standard_error + large.standard_error)


def test_noise_does_not_masquerade_as_bias():
    # An unbiased estimator (q = p, m large enough that all-hit draws are negligible) reads near zero although
    # a single draw's gradient is noisy: the tr Cov / R term is removed, not reported as bias.
    output, hidden, target = peaked_model(SoftmaxSampler)
    keep = torch.softmax(all_logits(output, hidden), 1).gather(1, target[:, None]).squeeze(1) < 0.6
    output.num_samples = 30
    estimate = gradient_bias(output, hidden[keep], target[keep], draws=100, groups=10)
    assert estimate.noise > 0.01
    assert estimate.bias < 0.25 * estimate.noise


def test_proposal_kl_closed_forms():
    output, hidden, target = peaked_model(UniformSampler)
    log_p = torch.log_softmax(all_logits(output, hidden).detach(), 1)
    query = output.query(hidden)
    uniform = proposal_kl(log_p, log_q_all_from(output.sampler, query, 40))
    entropy = -(log_p.exp() * log_p).sum(1)
    torch.testing.assert_close(uniform, math.log(40) - entropy)
    softmax = SoftmaxSampler(40)
    softmax.update(output.weight.detach())
    assert proposal_kl(log_p, log_q_all_from(softmax, query, 40)).abs().max() < 1e-5


def test_diagnose_command_writes_table_json_and_plot(tiny_config, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config("output=full", "trainer.max_steps=20", "test_after_fit=false", run_dir=run))
    out = tmp_path / "diag"
    args = [f"ckpt_path={run}", "sampler=uniform,bigram,rff", "output.num_samples=2,8", "sampler.D=64"]
    assert diagnose_main([*args, "draws=20", "groups=4", "positions=16", "windows=3", f"out={out}"]) == 0
    report = json.loads((out / "diagnose.json").read_text())
    assert [(r["sampler"], r["num_samples"]) for r in report["rows"]] == [
        ("uniform", 2),
        ("uniform", 8),
        ("bigram", 2),  # conditioned on the held-out positions' input tokens
        ("bigram", 8),
        ("rff", 2),
        ("rff", 8),
    ]
    assert all(r["kl"] > 0 and r["bias"] >= 0 and r["standard_error"] > 0 for r in report["rows"])
    assert (out / "bias_vs_samples.png").stat().st_size > 10_000
    assert "| uniform | 2 |" in (out / "diagnose.md").read_text()
    assert -1 <= report["hidden"]["mean_pairwise_cosine"] < 1 and report["hidden"]["unit_std"] > 0


def test_hidden_spread_tells_a_saturated_lstm_from_a_working_one():
    gen = torch.Generator().manual_seed(0)
    varied = torch.randn(50, 16, generator=gen)
    spread = hidden_spread(varied)
    assert abs(spread["mean_pairwise_cosine"]) < 0.1 and spread["unit_std"] > 0.5
    saturated = torch.full((50, 16), 0.7) + 1e-5 * torch.randn(50, 16, generator=gen)  # one state everywhere
    spread = hidden_spread(saturated)
    assert spread["mean_pairwise_cosine"] > 0.9999 and spread["unit_std"] < 1e-4


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["ckpt_path=nowhere.ckpt"], "nowhere.ckpt does not exist"),
        (["ckpt_path=x.ckpt", "sampler=bogus"], "unknown sampler 'bogus'"),
        (["ckpt_path=x.ckpt", "draws"], "arguments are key=value"),
        (["colour=red"], "unknown argument 'colour'"),
    ],
)
def test_diagnose_bad_input_is_one_line(args, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        diagnose_main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
