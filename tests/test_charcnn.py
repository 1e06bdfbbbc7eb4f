"""output=charcnn, the CNN softmax: class vectors against a written-out character CNN, exact evaluation against a
dense softmax over them, the sampled loss against a written-out sampled softmax, special tokens' own characters,
the evaluation cache, the refusals, and a trained run loaded back by the tools."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from lmtrain.cli.failures import root_cause
from lmtrain.config import ConfigError, choices, compose_config
from lmtrain.output.charcnn import BEGIN, END, PAD, CharCNNSoftmax, spellings
from lmtrain.run.build import build_output
from lmtrain.sampler import Sampler, UniformSampler, UnigramSampler
from lmtrain.sampler.proposal import Draws
from tests.cli_runs import TINY, run_cli
from tests.test_score import module_ppl

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["ab", "b", "<unk>", "unk", "abcde", "<eos>", "ba"]
TINY_CNN = {"char_dim": 3, "kernel_widths": [2, 1, 5], "filters": [2, 3, 1], "max_word_length": 3}


def layer(words: list[str] = WORDS, dim: int = 4, sampler: Sampler | None = None, **options: Any) -> CharCNNSoftmax:
    """A float64 layer over ``words`` with every weight uniform in +-1 (the convolution's taps beyond a filter's
    width too: the layer must not read them)."""
    torch.manual_seed(0)
    n = len(words)
    sampler = sampler or UnigramSampler(n, torch.arange(n, 0, -1).double())
    out = CharCNNSoftmax(n, dim, sampler, words=words, **{**TINY_CNN, **options}).double()
    with torch.no_grad():
        for p in out.parameters():
            p.uniform_(-1.0, 1.0)
        out.chars.weight[PAD] = 0.0
    return out


def written_out_vectors(out: CharCNNSoftmax) -> torch.Tensor:
    """Every class vector by a loop over words, windows and filters: embedding, each convolution, max over time,
    tanh, the highway layers, the projection, plus P c_i."""
    opts, vectors = out.options, []
    widths = [w for w, count in zip(opts.kernel_widths, opts.filters, strict=True) for _ in range(count)]
    for i in range(out.num_classes):
        emb = out.chars.weight[out.spellings[i, : opts.max_word_length + 2]]  # (L, c) the spelled word
        features = []
        for f, width in enumerate(widths):  # filter f: its first `width` taps of the convolution
            windows = [
                sum(float(emb[t + k] @ out.conv_weight[f, :, k]) for k in range(width)) + float(out.conv_bias[f])
                for t in range(emb.shape[0] - width + 1)
            ]
            features.append(math.tanh(max(windows)))
        y = torch.tensor(features, dtype=torch.float64)
        for highway in out.highways:
            size = y.numel()
            gate = torch.sigmoid(highway.weight[:size] @ y + highway.bias[:size])
            value = torch.relu(highway.weight[size:] @ y + highway.bias[size:])
            y = gate * value + (1 - gate) * y
        project, correct = out.project.weight.split([y.numel(), opts.correction_dim], 1)  # (d, F), P (d, r)
        vectors.append(project @ y + correct @ out.table[i, :-1])
    return torch.stack(vectors).detach()  # (n, d)


@pytest.mark.parametrize("options", [{}, {"correction_dim": 0, "highway_layers": 2}])
def test_class_vectors_are_the_written_out_character_cnn(options):
    out = layer(**{"correction_dim": 2, **options})
    expected = written_out_vectors(out)
    torch.testing.assert_close(out.all_vectors()[0].detach(), expected)
    ids = torch.tensor([3, 0, 3, 6])
    got = out.vectors(out.spellings[ids], out.table[ids, :-1]).detach()  # the training path: only these words
    torch.testing.assert_close(got, expected[ids])


def test_special_tokens_have_their_own_characters_and_long_words_are_cut():
    table, num_chars = spellings(WORDS, 3)  # cut to 3 characters: a spelling is 5 long
    # reserved 0-2, then the special tokens <eos> 3, <unk> 4, then the letters a 5, b 6, c 7, k 8, n 9, u 10
    expected = [
        [BEGIN, 5, 6, END, PAD],  # ab
        [BEGIN, 6, END, PAD, PAD],  # b
        [BEGIN, 4, END, PAD, PAD],  # <unk>: one character of its own
        [BEGIN, 10, 9, 8, END],  # unk
        [BEGIN, 5, 6, 7, END],  # abcde cut to 3 characters
        [BEGIN, 3, END, PAD, PAD],  # <eos>
        [BEGIN, 6, 5, END, PAD],  # ba
    ]
    assert table.tolist() == expected and num_chars == 11
    assert not torch.equal(table[2], table[3])  # <unk> is not the word unk
    assert not torch.equal(table[2], table[5])  # nor another special token


@pytest.mark.parametrize("eval_chunk", [65536, 3])  # one logits matrix / 3 vocabulary chunks and a row gather
def test_exact_log_prob_is_a_dense_softmax_over_the_class_vectors(eval_chunk):
    out = layer(correction_dim=2, eval_chunk=eval_chunk)
    vectors, bias = written_out_vectors(out), out.table[:, -1].detach()
    hidden = torch.randn(5, 4, dtype=torch.float64)
    target = torch.tensor([0, 2, 3, 6, 2])
    expected = torch.log_softmax(hidden @ vectors.T + bias, dim=1)  # (N, n)
    for mode in (True, False):  # training mode computes afresh, eval mode through the cache
        out.train(mode)
        with torch.no_grad():
            torch.testing.assert_close(out.log_prob(hidden, target), expected.gather(1, target[:, None])[:, 0])
            torch.testing.assert_close(out.log_probs_all(hidden), expected)
    out.train()
    exact = layer(correction_dim=2, exact_training=True)
    loss = exact.loss(hidden, target)
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ vectors.T + bias, target))
    assert exact.loss_is_nll and not exact.sparse_parameters()


def test_the_sampled_loss_is_a_written_out_sampled_softmax_over_the_steps_words():
    out = layer(correction_dim=2, num_samples=4)
    hidden = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 2, 6])
    forced = torch.tensor([2, 5, 2, 1])  # 2 is position 1's target: an accidental hit, dropped there
    log_q = out.sampler.log_probs.double()  # (n,) the unigram's exact log q
    out.draw = lambda proposal: Draws(forced, proposal.log_q(forced), proposal.log_q(target)[:, None])
    spelled = []
    spell = out.spell
    out.spell = lambda chars: spelled.append(chars.shape[0]) or spell(chars)
    loss = out.loss(hidden, target)
    assert spelled == [3 + 4]  # the CNN ran for the N targets and the m negatives only
    vectors, bias = written_out_vectors(out), out.table[:, -1].detach()
    expected = []
    for i, t in enumerate(target.tolist()):

        def score(c: int, i: int = i) -> float:
            return float(hidden[i].detach() @ vectors[c] + bias[c])

        kept = [j for j in forced.tolist() if j != t]
        q_t = math.exp(log_q[t])
        corrected = [score(j) - math.log(len(kept) * math.exp(log_q[j]) / (1 - q_t)) for j in kept]
        expected.append(-score(t) + math.log(math.exp(score(t)) + sum(math.exp(s) for s in corrected)))
    assert float(loss) == pytest.approx(sum(expected) / 3, rel=1e-10)
    loss.backward()
    assert out.table.grad.is_sparse and set(out.table.grad.coalesce().indices()[0].tolist()) == {0, 1, 2, 5, 6}


def test_the_evaluation_computes_every_vector_once_and_again_after_a_step():
    out = layer(correction_dim=2, num_samples=2)
    calls = []
    spell = out.spell
    out.spell = lambda chars: calls.append(chars.shape[0]) or spell(chars)
    hidden, target = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4, 4])
    out.eval()
    with torch.no_grad():
        first = [out.log_prob(hidden, target), out.log_probs_all(hidden), out.log_prob(hidden, target)]
    assert calls == [len(WORDS)]  # one CNN pass over the vocabulary for the whole evaluation
    out.train()
    optimizer = torch.optim.SGD(out.parameters(), lr=0.5)
    out.loss(hidden, target).backward()
    optimizer.step()
    out.after_optimizer_step()
    out.eval()
    with torch.no_grad():
        again = out.log_prob(hidden, target)
        assert not torch.allclose(again, first[0])  # the step's weights, not the cached vectors
        out.log_prob(hidden, target)
        assert calls == [len(WORDS), 6 + 2, len(WORDS)]  # the step's N + m words, then the vocabulary once more
        out.project.weight.mul_(2.0)  # a weight changed in eval mode (no hook called): its version tells
        expected = torch.log_softmax(hidden @ written_out_vectors(out).T + out.table[:, -1], dim=1)
        torch.testing.assert_close(out.log_probs_all(hidden), expected)
    assert calls == [len(WORDS), 6 + 2, len(WORDS), len(WORDS)]


def test_a_runs_evaluations_each_spell_the_vocabulary_once(tiny_config, monkeypatch):
    from lmtrain.run.run import train

    counts = []
    spell = CharCNNSoftmax.spell
    monkeypatch.setattr(
        CharCNNSoftmax, "spell", lambda self, chars: counts.append(chars.shape[0]) or spell(self, chars)
    )
    cfg = tiny_config("output=charcnn", "trainer.max_steps=3", "data.eval_batch_size=1", "data.valid_tokens=2000")
    train(cfg)
    full = [c for c in counts if c == 100]  # the synthetic vocabulary's 100 classes
    assert len(full) <= 3  # sanity check, validation and test, whatever their ~100 batches each
    assert len(counts) - len(full) == 3  # one (N + m)-word pass per training step


def test_tying_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="tie_weights=true cannot apply to output=charcnn: .*character CNN") as err:
        compose_config(["data=synthetic", "output=charcnn", "model.tie_weights=true"])
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["output.kernel_widths=[1,2]", "output.filters=[3]"], "need one entry per convolution, got [1, 2] and [3]"),
        (["output.filters=[3,0,1,1,1,1]"], "must hold numbers >= 1"),
        (["output.max_word_length=3"], "has width 6, over a spelled word (output.max_word_length + 2 = 5)"),
    ],
)
def test_the_config_check_refuses_convolutions_that_do_not_fit_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        compose_config(["data=synthetic", "output=charcnn", *overrides])
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("sampler", choices("sampler"))
def test_only_context_free_samplers_are_taken(sampler):
    cfg = compose_config(["data=synthetic", "output=charcnn", f"sampler={sampler}"])
    counts = torch.arange(60, 0, -1).float()
    stream = torch.multinomial(counts, 2_000, replacement=True)
    if get_class(str(cfg.sampler._target_)).context_free:
        out = build_output(cfg, 60, 8, counts, stream)
        loss = out.loss(torch.randn(12, 8), torch.randint(60, (12,)))
        assert torch.isfinite(loss)
        return
    with pytest.raises(Exception) as err:  # noqa: PT011 (Hydra wraps it; the command line prints its cause)
        build_output(cfg, 60, 8, counts, stream)
    cause = root_cause(err.value)
    assert isinstance(cause, ValueError) and "needs a context-free sampler (uniform, unigram" in str(cause)
    assert f"; sampler={sampler} reads" in str(cause) and len(str(cause).splitlines()) == 1


@pytest.mark.parametrize("sampler", [UniformSampler(30), UnigramSampler(30, torch.arange(30.0))])
def test_a_context_free_samplers_q_ignores_the_context(sampler):
    """What ``context_free`` promises: the same log q whatever the queries and input tokens."""
    ids = torch.randint(30, (6,))
    one = sampler.propose(torch.randn(4, 5), torch.randint(30, (4,))).log_q(ids)
    torch.testing.assert_close(sampler.propose(torch.randn(4, 5), None).log_q(ids), one)


def test_the_command_line_refuses_a_kernel_sampler_in_one_line(tmp_path):
    result = run_cli([*TINY, "output=charcnn", "sampler=quadratic"], tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("lmtrain: error: output=charcnn computes class vectors only for the step's")


def test_a_trained_run_loads_back_with_its_words(trained_run, tmp_path):
    """Text corpus: <eos> and <unk> in the vocabulary. The tools rebuild the spelling from vocab.tsv; the loaded
    model's test perplexity is the run's, and it scores and generates."""
    from lmtrain.tools.generate import generate
    from lmtrain.tools.score import score
    from lmtrain.tools.trained import load_trained

    run, metrics = trained_run("charcnn", "text")
    datamodule = instantiate(OmegaConf.load(run / "config.yaml").data)
    datamodule.setup()
    trained = load_trained(str(run), [], "cpu")
    assert torch.equal(trained.module.output.spellings[:, :22], spellings(datamodule.vocab, 20)[0])  # + padding
    assert module_ppl(trained.module, datamodule.test_ids) == pytest.approx(metrics["test/ppl"], rel=1e-5)
    text = tmp_path / "mine.txt"
    text.write_text("w1 w2 w3\nw0 qqq w1\n")
    result = score([f"ckpt_path={run}", f"file={text}", "device=cpu"])
    assert result.tokens == 8 and math.isfinite(result.ppl)
    generated = generate([f"ckpt_path={run}", "prompt=w1", "num_tokens=5", "device=cpu", "seed=1"])
    assert len(generated.ids) == 5 and set(generated.words) <= set(datamodule.vocab)
