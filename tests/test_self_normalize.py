"""Self-normalization (``output.self_normalize``), infrequent normalization (``output.normalize_fraction``) and the
unnormalized score (``lmtrain.score normalized=false``): each against a written-out reference on a tiny case."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf

import tests.test_resume_strategies as resume_strategies
from lmtrain.config import compose_config
from lmtrain.config.validate import ConfigError, check_config
from lmtrain.output import infrequent_normalization
from lmtrain.output.chunked_softmax import chunked_softmax_nll
from lmtrain.output.full import FullSoftmax
from lmtrain.output.infrequent_normalization import normalized_count
from lmtrain.run.run import train
from lmtrain.tools.score import main as score_main
from lmtrain.tools.score import score
from lmtrain.tools.trained import load_trained
from tests.conftest import TINY, make_config
from tests.helpers import SimulatedCrash

NUM_CLASSES, DIM, N = 23, 5, 17
CHUNKS = [0, 6]  # dense logits, and vocabulary chunks of 6 classes (chunked_softmax_nll)


def layer(train_chunk: int = 0, **options: float) -> FullSoftmax:
    torch.manual_seed(0)
    built = FullSoftmax(NUM_CLASSES, DIM, train_chunk=train_chunk, init_range=0.5, **options).double()
    with torch.no_grad():
        built.bias.uniform_(-1, 1)  # ln Z away from ln n, scores of both signs
    return built


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(N, DIM, generator=gen, dtype=torch.float64)  # (N, d)
    return hidden, torch.randint(NUM_CLASSES, (N,), generator=gen)


def by_hand(out: FullSoftmax, hidden: torch.Tensor, target: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position i's target score s_t and ln Z, written out: a loop over the classes, logsumexp by hand."""
    scores = [hidden[i] @ out.weight[c] + out.bias[c] for c in range(NUM_CLASSES)]
    top = max(float(s) for s in scores)
    log_z = top + torch.log(sum(torch.exp(s - top) for s in scores))
    return scores[int(target[i])], log_z


def gradients(loss: torch.Tensor, out: FullSoftmax, hidden: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, [hidden, out.weight, out.bias]))


@pytest.mark.parametrize("train_chunk", CHUNKS)
def test_penalty_is_alpha_log_z_squared_per_position(train_chunk):
    alpha = 0.7
    out = layer(train_chunk, self_normalize=alpha)
    hidden, target = inputs()
    hidden.requires_grad_()
    loss = out.loss(hidden, target)
    terms = []
    for i in range(N):
        score, log_z = by_hand(out, hidden, target, i)
        terms.append((log_z - score) + alpha * log_z**2)  # -ln p + α (ln Z)²
    reference = sum(terms) / N
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for got, want in zip(gradients(loss, out, hidden), gradients(reference, out, hidden), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert not out.loss_is_nll and layer(train_chunk).loss_is_nll  # train/ppl only for the plain NLL


@pytest.mark.parametrize("train_chunk", CHUNKS)
def test_alpha_zero_is_the_plain_loss_bit_for_bit_through_the_same_code(train_chunk, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("self_normalize=0 reached the self-normalized loss")

    monkeypatch.setattr(FullSoftmax, "self_normalized_loss", refuse)
    out = layer(train_chunk, self_normalize=0.0)
    hidden, target = inputs()
    hidden.requires_grad_()
    loss = out.loss(hidden, target)
    if train_chunk:
        plain = chunked_softmax_nll(hidden, out.weight, out.bias, target, train_chunk).mean()
    else:
        plain = F.cross_entropy(F.linear(hidden, out.weight, out.bias), target)
    assert torch.equal(loss, plain)
    for got, want in zip(gradients(loss, out, hidden), gradients(plain, out, hidden), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("train_chunk", CHUNKS)
@pytest.mark.parametrize("fraction", [0.3, 0.5])
def test_infrequent_loss_is_the_formula_at_the_drawn_positions(train_chunk, fraction, monkeypatch):
    alpha = 0.4
    out = layer(train_chunk, self_normalize=alpha, normalize_fraction=fraction)
    hidden, target = inputs()
    hidden.requires_grad_()
    rows = []
    original = FullSoftmax.position_nll
    monkeypatch.setattr(FullSoftmax, "position_nll", lambda self, h, t: rows.append(h.shape[0]) or original(self, h, t))
    torch.manual_seed(5)
    loss = out.loss(hidden, target)
    count = max(1, round(fraction * N))
    assert rows == [count]  # only the drawn positions compute Z
    torch.manual_seed(5)
    picked = torch.randperm(N)[:count].tolist()  # the same draw, again
    assert len(set(picked)) == count
    scores = [by_hand(out, hidden, target, i)[0] for i in range(N)]
    penalty = sum(by_hand(out, hidden, target, i)[1] ** 2 for i in picked)
    reference = (-sum(scores) + (alpha / fraction) * penalty) / N
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for got, want in zip(gradients(loss, out, hidden), gradients(reference, out, hidden), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # another draw is another loss: the positions matter
    other = sorted(set(range(N)) - set(picked))[:count]
    elsewhere = (-sum(scores) + (alpha / fraction) * sum(by_hand(out, hidden, target, i)[1] ** 2 for i in other)) / N
    assert not torch.isclose(loss, elsewhere, rtol=1e-6)


def test_the_draw_has_a_fixed_count_and_changes_between_steps(monkeypatch):
    assert [normalized_count(700, g) for g in (1.0, 0.5, 0.1, 0.001)] == [700, 350, 70, 1]
    drawn = []
    original = infrequent_normalization.draw_positions
    monkeypatch.setattr(infrequent_normalization, "draw_positions", lambda *a: drawn.append(original(*a)) or drawn[-1])
    out = layer(self_normalize=0.2, normalize_fraction=0.25)
    hidden, target = inputs()
    for _ in range(4):  # steps
        out.loss(hidden, target).backward()
    assert [d.numel() for d in drawn] == [round(0.25 * N)] * 4
    assert all(d.unique().numel() == d.numel() and int(d.max()) < N for d in drawn)  # distinct positions
    assert len({tuple(d.sort().values.tolist()) for d in drawn}) > 1  # drawn afresh


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["output.normalize_fraction=0.5"], "output.normalize_fraction=0.5 samples the self-normalization penalty"),
        (["output.self_normalize=-0.1"], "output.self_normalize must be >= 0"),
        (["output.self_normalize=1", "output.normalize_fraction=1.5"], "output.normalize_fraction must be <= 1"),
    ],
)
def test_bad_options_are_refused_in_one_line(overrides, expected):
    with pytest.raises(ConfigError) as refused:
        check_config(compose_config(["output=full", *overrides]))
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="self-normalization penalty, which is off"):
        FullSoftmax(NUM_CLASSES, DIM, normalize_fraction=0.5)  # built in Python: the same rule


def log_z_over(run, split_ids: torch.Tensor) -> torch.Tensor:
    """ln Z at every position of ``split_ids`` read as one stream by the run's last weights, by hand: (L - 1,)."""
    trained = load_trained(str(run / "checkpoints" / "last.ckpt"), [], "cpu")
    with torch.no_grad():
        hidden, _ = trained.module.encoder(split_ids[None, :-1], None)  # (1, L - 1, d)
        out = trained.module.output
        return torch.logsumexp(hidden[0].double() @ out.weight.double().T + out.bias.double(), dim=1)


RECIPE = [*TINY, "trainer.max_steps=200", "optim=adam", "optim.lr=0.01", "loss_reduction=mean",
          "test_after_fit=false", "data.eval_batch_size=1", "output=full"]  # fmt: skip


@pytest.mark.usefixtures("one_thread")
def test_a_self_normalized_model_has_log_z_nearer_zero_and_logs_it(tmp_path):
    """200 Adam steps from zero biases (ln Z starts at ln 100): the penalty brings ln Z to about 0, the plain
    softmax leaves it near ln n (its loss does not see a shift of every score)."""
    plain = train(make_config([*RECIPE, f"run_dir={tmp_path / 'plain'}"]))
    penalized = train(make_config([*RECIPE, "output.self_normalize=0.1", f"run_dir={tmp_path / 'normalized'}"]))
    assert "val/log_z_mean" not in plain  # only with the penalty
    data = instantiate(OmegaConf.load(tmp_path / "plain" / "config.yaml").data)
    data.setup()
    valid = data.valid_ids.flatten()
    plain_z, penalized_z = log_z_over(tmp_path / "plain", valid), log_z_over(tmp_path / "normalized", valid)
    assert penalized_z.abs().mean() < 0.25 * plain_z.abs().mean(), (penalized_z.mean(), plain_z.mean())
    # the logged validation statistics are those of the last weights, over the same stream
    assert penalized["val/log_z_mean"] == pytest.approx(float(penalized_z.mean()), abs=1e-4)
    assert penalized["val/log_z_sd"] == pytest.approx(float(penalized_z.std(correction=0)), rel=1e-3, abs=1e-5)
    unnormalized = math.exp(penalized["val/loss"] - float(penalized_z.mean()))  # exp(mean -s) = ppl / exp(mean ln Z)
    assert penalized["val/ppl_unnormalized"] == pytest.approx(unnormalized, rel=1e-4)


@pytest.mark.usefixtures("one_thread")
def test_infrequent_normalization_settles_at_mean_log_z_one_over_two_alpha(tmp_path):
    """With γ < 1 the likelihood term is unnormalized: shifting every score by c changes the objective by
    c (-1 + 2α mean ln Z) to first order (the α / γ scale makes the drawn positions stand for all), so training
    settles where mean ln Z = 1 / (2α), here 1 (from ln 100 at the start). α in place of α / γ would stop at
    1 / (2αγ) = 3.3, a normalized likelihood term at 0."""
    alpha = 0.5
    run = [*RECIPE, f"output.self_normalize={alpha}", "output.normalize_fraction=0.3", f"run_dir={tmp_path / 'run'}"]
    metrics = train(make_config(run))
    assert metrics["val/log_z_mean"] == pytest.approx(1 / (2 * alpha), abs=0.1)
    assert metrics["val/log_z_sd"] < 0.1


def test_unnormalized_score_is_exp_of_minus_the_mean_target_score(trained_run, tmp_path, capsys):
    run, _ = trained_run("full")
    text = tmp_path / "text.txt"
    words = [f"w{i}" for i in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3)]
    text.write_text(" ".join(words * 12) + "\n")  # 300 words: more than one window of the tool
    result = score([f"ckpt_path={run}", f"file={text}", "device=cpu", "normalized=false"])
    trained = load_trained(str(run), [], "cpu")
    ids = torch.tensor([trained.vocab.index[w] for w in words * 12])
    with torch.no_grad():
        hidden, _ = trained.module.encoder(ids[None, :-1], None)  # (1, L - 1, d): one pass, no windows
        out, hidden = trained.module.output, hidden[0].double()
        targets = ids[1:].tolist()
        scores = torch.stack([hidden[i] @ out.weight[t].double() + out.bias[t].double() for i, t in enumerate(targets)])
        log_z = torch.logsumexp(hidden @ out.weight.double().T + out.bias.double(), dim=1)  # (L - 1,)
    unnormalized = result.unnormalized
    assert unnormalized is not None and unnormalized.tokens == len(targets)
    assert unnormalized.ppl == pytest.approx(math.exp(-float(scores.mean())), rel=1e-5)
    assert result.ppl == pytest.approx(math.exp(float((log_z - scores).mean())), rel=1e-5)  # the exact pass
    assert unnormalized.log_z_mean == pytest.approx(float(log_z.mean()), rel=1e-5)
    assert unnormalized.log_z_sd == pytest.approx(float(log_z.std(correction=0)), rel=1e-3, abs=1e-6)
    assert unnormalized.seconds > 0 and unnormalized.exact_seconds > 0
    assert score_main([f"ckpt_path={run}", f"file={text}", "device=cpu", "normalized=false"]) == 0
    printed = capsys.readouterr().out
    assert f"unnormalized (Z = 1): perplexity {unnormalized.ppl:.3f}" in printed and "seconds: unnormalized" in printed


def test_unnormalized_pass_reads_only_target_rows(trained_run, tmp_path, monkeypatch):
    run, _ = trained_run("full")
    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3 w4 w5\n")
    trained = load_trained(str(run), [], "cpu")
    from lmtrain.tools.unnormalized_score import stream_scores

    def refuse(*args, **kwargs):
        raise AssertionError("the unnormalized pass normalized")

    for name in ("log_prob", "log_probs_all", "logits"):
        monkeypatch.setattr(FullSoftmax, name, refuse)
    scores = stream_scores(trained.module, torch.tensor([1, 2, 3, 4, 5]), torch.device("cpu"), 2)
    assert scores.shape == (4,) and scores.dtype == torch.float64


def test_an_output_without_unnormalized_score_is_refused_in_one_line(trained_run, tmp_path, capsys):
    run, _ = trained_run("hsm")
    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3\n")
    with pytest.raises(SystemExit) as exit_info:
        score_main([f"ckpt_path={run}", f"file={text}", "normalized=false"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "output=hsm has no unnormalized score" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        score_main([f"ckpt_path={run}", f"file={text}", "normalized=maybe"])
    assert "normalized must be true or false" in capsys.readouterr().err


RUNS = ("straight", "split")


@pytest.mark.usefixtures("one_thread")
def test_resume_mid_epoch_draws_the_same_positions(tiny_config, tmp_path):
    """A crash after a periodic checkpoint, resumed in process: the same weights as one straight run (the draws of
    the normalized positions come from the checkpointed generator)."""
    common = ["trainer.max_steps=20", "model.dropout=0.3", "checkpoint_every_n_steps=4", "test_after_fit=false",
              "output=full", "output.self_normalize=0.5", "output.normalize_fraction=0.3"]  # fmt: skip
    expected = train(tiny_config(*common, run_dir=tmp_path / "straight"))
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=10"]
    with pytest.raises(SimulatedCrash):
        train(tiny_config(*common, *crash, run_dir=tmp_path / "split"))
    resumed = train(tiny_config(*common, "ckpt_path=last", run_dir=tmp_path / "split"))
    a, b = (torch.load(tmp_path / r / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for r in RUNS)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)
    for key in ("val/ppl", "val/log_z_mean", "val/log_z_sd", "val/ppl_unnormalized"):
        assert resumed[key] == pytest.approx(expected[key], rel=1e-6), key


@pytest.mark.slow  # three CLI runs, ~30 s
def test_sigkill_then_resume_ends_as_the_uninterrupted_run(tmp_path, monkeypatch):
    case = ["output=full", "output.self_normalize=0.5", "output.normalize_fraction=0.3"]
    monkeypatch.setitem(resume_strategies.STRATEGIES, "full-infrequent", case)
    resume_strategies.test_sigkill_after_a_checkpoint_then_resume_ends_as_the_uninterrupted_run(
        tmp_path, "full-infrequent"
    )
