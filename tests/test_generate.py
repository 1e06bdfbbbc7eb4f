"""python -m lmtrain.generate: seeded sampling from every strategy's exact distribution (OutputLayer.log_probs_all)."""

from __future__ import annotations

import pytest
import torch

from lmtrain.data.vocab import Vocabulary
from lmtrain.output import (
    NCE,
    AbsoluteSampledSoftmax,
    AdaptiveSoftmax,
    CosineSampledSoftmax,
    FullSoftmax,
    HierarchicalSoftmax,
    NegativeSampling,
    OutputLayer,
    SampledSoftmax,
)
from lmtrain.sampler import UniformSampler, UnigramSampler
from lmtrain.tools.generate import Sampling, context_ids, generate, pick, render
from lmtrain.tools.generate import main as generate_main
from lmtrain.tools.trained import load_trained

STRATEGIES = ["full", "unigram", "rff", "nce", "hsm", "adaptive"]
N, D = 37, 16
COUNTS = torch.arange(N, 0, -1) ** 2  # frequency-ordered training counts
LAYERS = {
    "full": lambda: FullSoftmax(N, D),
    "sampled": lambda: SampledSoftmax(N, D, UniformSampler(N)),
    "quadratic": lambda: AbsoluteSampledSoftmax(N, D, UniformSampler(N)),
    "rff": lambda: CosineSampledSoftmax(N, D, UniformSampler(N)),
    "negative": lambda: NegativeSampling(N, D, UnigramSampler(N, COUNTS), counts=COUNTS),
    "nce": lambda: NCE(N, D, UnigramSampler(N, COUNTS), counts=COUNTS, learn_log_z=True),
    "hsm_huffman": lambda: HierarchicalSoftmax(N, D, COUNTS),
    "hsm_balanced": lambda: HierarchicalSoftmax(N, D, COUNTS, tree="balanced"),
    "hsm_two_level": lambda: HierarchicalSoftmax(N, D, COUNTS, tree="two_level"),
    "adaptive": lambda: AdaptiveSoftmax(N, D, cutoffs=[5, 20]),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_log_probs_all_is_log_prob_of_every_class(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_()
    hidden = torch.randn(5, D)
    log_p = layer.log_probs_all(hidden)  # (5, N)
    assert log_p.shape == (5, N)
    torch.testing.assert_close(log_p.logsumexp(1), torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(log_p, OutputLayer.log_probs_all(layer, hidden), atol=1e-5, rtol=1e-5)  # the default


def args(run, *extra):
    return [f"ckpt_path={run}", "prompt=w1 w2", "num_tokens=30", "device=cpu", *extra]


@pytest.mark.parametrize("output", STRATEGIES)
def test_generation_is_seeded_and_uses_the_vocabulary(trained_run, output):
    run, _ = trained_run(output)
    vocab = Vocabulary.read(run)
    first, again, other = (generate(args(run, f"seed={seed}")) for seed in (1, 1, 2))
    assert first == again  # same seed, same text
    assert first.ids != other.ids
    assert len(first.ids) == 30 and set(first.words) <= set(vocab.words)
    assert first.text == " ".join(["w1", "w2", *first.words])
    greedy = [generate(args(run, "top_k=1", f"seed={seed}", "temperature=3")) for seed in (1, 2)]
    assert greedy[0] == greedy[1]  # top_k=1 is the argmax whatever the seed and temperature
    trained = load_trained(str(run), [], "cpu")
    with torch.no_grad():
        hidden, _ = trained.module.encoder(torch.tensor([[vocab.index["w1"], vocab.index["w2"]]]))
        log_p = trained.module.output.log_probs_all(hidden[:, -1])[0]
    assert greedy[0].ids[0] == int(log_p.argmax())


@pytest.mark.parametrize(
    ("temperature", "top_k", "expected"),
    [
        (1.0, 0, [0.6, 0.25, 0.1, 0.05]),  # the distribution itself
        (1.0, 2, [0.6 / 0.85, 0.25 / 0.85, 0.0, 0.0]),  # the top 2, renormalized
        (2.0, 0, [0.6**0.5, 0.25**0.5, 0.1**0.5, 0.05**0.5]),  # p^(1/T), normalized below
        (100.0, 0, [0.6**0.01, 0.25**0.01, 0.1**0.01, 0.05**0.01]),  # high temperature: near uniform
    ],
)
def test_pick_draws_from_the_tempered_top_k_distribution(temperature, top_k, expected):
    """10,000 draws: every class's frequency within 4.5 binomial standard errors of p^(1/T) / sum (over the top k):
    for p = 0.05 that is +-0.0098 (the test used to allow +-0.03), and a class outside the top k is never drawn."""
    log_p = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()
    target = torch.tensor(expected, dtype=torch.float64)
    target = target / target.sum()
    gen = torch.Generator().manual_seed(0)
    draws = 10_000
    ids = torch.tensor([pick(log_p, Sampling(1, temperature, top_k, 0), gen) for _ in range(draws)])
    freq = torch.bincount(ids, minlength=4).double() / draws
    se = (target * (1 - target) / draws).sqrt()
    assert ((freq - target).abs() <= 4.5 * se).all(), (freq, target)


def test_text_run_starts_after_eos_and_breaks_lines(trained_run, capsys):
    run, _ = trained_run("full", "text")
    vocab = Vocabulary.read(run)
    eos, unk = vocab.index["<eos>"], vocab.index["<unk>"]
    assert context_ids(vocab, "") == ([eos], 0)  # an empty prompt starts after <eos>
    assert context_ids(vocab, "w1 qqq\nw2") == ([eos, vocab.index["w1"], unk, eos, vocab.index["w2"]], 1)
    generated = generate([f"ckpt_path={run}", "num_tokens=200", "seed=3"])
    assert "<eos>" in generated.words  # lines are ~6 words long
    assert generated.text.count("\n") == generated.words.count("<eos>") and "<eos>" not in generated.text
    assert render(["a", "b", "<eos>", "<eos>", "c"]) == "a b\n\nc"
    capsys.readouterr()  # drop what training the fixture's run printed, when this test trained it
    assert generate_main([f"ckpt_path={run}", "prompt=w1 qqq", "num_tokens=3", "seed=3"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("w1 qqq") and "1 prompt word(s) not in the vocabulary" in out.err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["ckpt_path=nowhere"], "nowhere does not exist"),
        (["temperature=0"], "temperature=0 must be a positive number"),
        (["temperature=-1"], "must be a positive number"),
        (["temperature=hot"], "temperature='hot' is not a number"),
        (["top_k=-1"], "must be >= 0"),
        (["num_tokens=many"], "num_tokens='many' is not an integer"),
        (["prompt="], "has no <eos> to start from"),  # a synthetic run's vocabulary
        (["prompt=w1 qqq"], "'qqq' is not in the run's vocabulary"),
        (["device=toaster"], "device='toaster' is not a device"),
        (["colour=red"], "unknown argument 'colour'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(trained_run, capsys, extra, expected):
    run, _ = trained_run("full")
    with pytest.raises(SystemExit) as exit_info:
        generate_main([f"ckpt_path={run}", "prompt=w1", *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
