"""The seeded Zipf-Markov source: exact entropy rate, deterministic frequency-ordered corpus, its data module."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from lmtrain.data import (
    DataError,
    SyntheticDataModule,
    ZipfMarkovSource,
    synthetic_corpus,
)
from lmtrain.data.synthetic import SyntheticOptions, zipf_probs


def test_synthetic_entropy_rate_matches_long_sample() -> None:
    source = ZipfMarkovSource(100, zipf_s=1.0, mix=0.3, seed=3)
    p, pi = source.transition, source.stationary
    assert torch.allclose(p.sum(1), torch.ones(100, dtype=torch.float64))
    assert torch.allclose(pi @ p, pi, atol=1e-12) and abs(float(pi.sum()) - 1) < 1e-12
    x = source.sample(1_000_000, torch.Generator().manual_seed(7))
    nll = -p[x[:-1], x[1:]].log()  # (N-1,) true conditional surprisal
    assert abs(float(nll.mean()) - source.entropy_rate) < 0.01
    pairs = torch.bincount(x[:-1] * 100 + x[1:], minlength=100 * 100).view(100, 100).double()
    cond = pairs / pairs.sum(1, keepdim=True).clamp_min(1)
    plug_in = float(-(pairs * cond.clamp_min(1e-300).log()).sum() / pairs.sum())
    assert source.entropy_rate - 0.03 < plug_in < source.entropy_rate + 0.005  # plug-in is biased low
    freq = torch.bincount(x, minlength=100).double() / len(x)
    assert float((freq - pi).abs().max()) < 0.003


def test_synthetic_entropy_rate_exact_case() -> None:
    # mix = 1: every row is the global Zipf, so H is the Zipf entropy and pi is the Zipf itself
    source = ZipfMarkovSource(50, zipf_s=1.3, mix=1.0, seed=0)
    z = zipf_probs(50, 1.3)
    assert math.isclose(source.entropy_rate, float(-(z * z.log()).sum()), rel_tol=1e-12)
    assert torch.allclose(source.stationary, z, atol=1e-12)


def test_synthetic_corpus_deterministic_and_frequency_ordered() -> None:
    a = synthetic_corpus(
        SyntheticOptions(vocab_size=60, train_tokens=20_000, valid_tokens=3_000, test_tokens=2_000, seed=5)
    )
    b = synthetic_corpus(
        SyntheticOptions(vocab_size=60, train_tokens=20_000, valid_tokens=3_000, test_tokens=2_000, seed=5)
    )
    c = synthetic_corpus(
        SyntheticOptions(vocab_size=60, train_tokens=20_000, valid_tokens=3_000, test_tokens=2_000, seed=6)
    )
    assert torch.equal(a.train, b.train) and torch.equal(a.valid, b.valid) and torch.equal(a.test, b.test)
    assert a.entropy_rate == b.entropy_rate and not torch.equal(a.train, c.train)
    assert (len(a.train), len(a.valid), len(a.test)) == (20_000, 3_000, 2_000)
    assert a.vocab[:3] == ["w0", "w1", "w2"] and "<eos>" not in a.vocab
    assert torch.equal(a.counts, torch.bincount(a.train, minlength=60))
    assert bool((a.counts[:-1] >= a.counts[1:]).all())
    assert 0 < a.entropy_rate < math.log(60)
    with pytest.raises(DataError, match="vocab_size"):
        synthetic_corpus(SyntheticOptions(vocab_size=1))


def test_synthetic_datamodule() -> None:
    dm = SyntheticDataModule(vocab_size=50, train_tokens=5_000, valid_tokens=1_000, test_tokens=1_000)
    dm.setup()
    assert dm.num_classes == 50 and dm.entropy_rate is not None and dm.entropy_rate > 0
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (10, 35) and torch.equal(x[:, 1:], y[:, :-1])


def test_data_md_quotes_the_default_synthetic_sources_best_perplexity() -> None:
    """docs/data.md's "(X at the defaults)" for data=synthetic is exp(entropy rate) of the default source."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    quoted = float(re.search(r"\((\d+\.\d) at the defaults\)", text).group(1))
    opts = SyntheticOptions()
    source = ZipfMarkovSource(opts.vocab_size, zipf_s=opts.zipf_s, mix=opts.mix, seed=opts.seed)
    assert quoted == round(math.exp(source.entropy_rate), 1)
