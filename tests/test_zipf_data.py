"""data=zipf: the large-vocabulary Markov source, its exact entropy rate, Zipf marginal, O(n) memory."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from scipy.stats import chi2

from lmtrain.config import CONF_DIR
from lmtrain.data import DataError, LMDataModule, ZipfDataModule, ZipfTopicSource, zipf_topic_corpus
from lmtrain.data.synthetic import zipf_probs
from lmtrain.data.zipf_topics import ZipfTopicOptions


def dense_transition(source: ZipfTopicSource) -> torch.Tensor:
    """P (n, n) straight from the definition, by interval arithmetic on the two layouts and the K topics."""
    n, k = source.num_classes, source.num_topics
    edges = torch.arange(k + 1, dtype=torch.float64) / k
    lo, hi = source.in_start, source.in_start + source.probs  # (n,) A_i
    in_topic = (torch.minimum(hi[:, None], edges[None, 1:]) - torch.maximum(lo[:, None], edges[None, :-1])).clamp(0)
    ends = source.piece_ends
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    overlap = (torch.minimum(ends[None], edges[1:, None]) - torch.maximum(starts[None], edges[:-1, None])).clamp(0)
    topic_rows = torch.zeros(k, n, dtype=torch.float64).index_add_(1, source.piece_token, overlap) * k  # (K, n)
    t = (in_topic / source.probs[:, None]) @ topic_rows  # (n, n)
    return source.mix * source.probs[None] + (1 - source.mix) * t


@pytest.mark.parametrize(
    ("n", "topic_size", "mix"), [(60, 4, 0.2), (80, 1, 0.05), (50, 50, 0.5), (40, 7, 1.0), (300, 10, 0.1)]
)
def test_sparse_table_equals_the_definition_and_the_entropy_rate_is_exact(n, topic_size, mix):
    source = ZipfTopicSource(n, zipf_s=1.1, topic_size=topic_size, mix=mix, seed=1)
    dense = dense_transition(source)
    pairs = (torch.arange(n).repeat_interleave(n), torch.arange(n).repeat(n))
    torch.testing.assert_close(source.log_prob(*pairs).exp().view(n, n), dense, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(dense.sum(1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    pi = source.probs
    assert torch.equal(pi, zipf_probs(n, 1.1))
    torch.testing.assert_close(pi @ dense, pi, rtol=0, atol=1e-14)  # the Zipf marginal is stationary
    exact = float((pi * -(dense * dense.log()).sum(1)).sum())  # sum_i pi_i H(P_i), dense
    assert math.isclose(source.entropy_rate, exact, rel_tol=1e-12)
    if mix == 1.0:
        assert math.isclose(source.entropy_rate, float(-(pi * pi.log()).sum()), rel_tol=1e-12)


def test_draws_follow_the_transition_matrix():
    """Anderson-Goodman test: given how often each token occurs, its successors are multinomial with P(. | i)."""
    n, length = 25, 300_000
    source = ZipfTopicSource(n, topic_size=3, mix=0.3, seed=2)
    x = source.sample(length, torch.Generator().manual_seed(3))
    observed = torch.bincount(x[:-1] * n + x[1:], minlength=n * n).double().view(n, n)
    expected = observed.sum(1, keepdim=True) * dense_transition(source)  # (n, n)
    statistic, cells = 0.0, 0
    for obs, exp in zip(observed, expected, strict=True):
        big = exp >= 5  # pool each row's rare successors into one cell
        obs, exp = torch.cat([obs[big], obs[~big].sum().view(1)]), torch.cat([exp[big], exp[~big].sum().view(1)])
        keep = exp > 0
        statistic += float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        cells += int(keep.sum()) - 1
    assert chi2.sf(statistic, cells) > 1e-4


def test_long_sample_nll_matches_the_entropy_rate_and_the_marginal_is_zipf():
    source = ZipfTopicSource(100_000, zipf_s=1.0, seed=4)  # the data=zipf defaults
    x = source.sample(1_000_000, torch.Generator().manual_seed(5))
    nll = -source.log_prob(x[:-1], x[1:])  # (T - 1,) surprisal under the true model
    means = nll[:999_900].view(100, -1).mean(1)  # batch means: consecutive surprisals are correlated
    stderr = float(means.std() / 10)
    assert stderr < 0.01 * source.entropy_rate
    assert abs(float(nll.mean()) - source.entropy_rate) < 4 * stderr
    freq = torch.bincount(x, minlength=100_000).double() / x.numel()
    assert float((freq[:50] - source.probs[:50]).abs().max()) < 0.002
    rank = torch.arange(1, 1001, dtype=torch.float64).log()
    slope = torch.linalg.lstsq(torch.stack([rank, torch.ones_like(rank)], 1), freq[:1000].log()[:, None]).solution
    assert abs(float(slope[0]) + 1.0) < 0.05  # log frequency falls with slope -s in log rank


def test_memory_is_linear_in_the_number_of_types():
    n = 300_000
    source = ZipfTopicSource(n, seed=6)
    held = sum(v.numel() for v in vars(source).values() if isinstance(v, torch.Tensor))
    assert held <= 8 * n  # probs, A layout (order, starts, ends), B layout (pieces <= 2n: ends, types)
    row_of, keys, values = source.transition_table()
    assert row_of.numel() == n and keys.numel() == values.numel() <= 6 * n


def test_corpus_is_deterministic_frequency_ordered_and_named():
    options = dict(vocab_size=5_000, train_tokens=30_000, valid_tokens=3_000, test_tokens=2_000)
    a, b = (
        zipf_topic_corpus(ZipfTopicOptions(**options, seed=7)),
        zipf_topic_corpus(ZipfTopicOptions(**options, seed=7)),
    )
    c = zipf_topic_corpus(ZipfTopicOptions(**options, seed=8))
    assert torch.equal(a.train, b.train) and torch.equal(a.valid, b.valid) and torch.equal(a.test, b.test)
    assert a.entropy_rate == b.entropy_rate != c.entropy_rate and not torch.equal(a.train, c.train)
    assert (len(a.train), len(a.valid), len(a.test), a.num_classes) == (30_000, 3_000, 2_000, 5_000)
    assert a.vocab[:2] == ["w0", "w1"] and torch.equal(a.counts, torch.bincount(a.train, minlength=5_000))
    assert bool((a.counts[:-1] >= a.counts[1:]).all())
    assert 0 < a.entropy_rate < float(-(zipf_probs(5_000, 1.0) * zipf_probs(5_000, 1.0).log()).sum())


def test_bad_settings_raise_data_errors():
    for options, message in (
        ({"vocab_size": 1}, "num_classes"),
        ({"zipf_s": 0.0}, "zipf_s"),
        ({"topic_size": 0.5}, "topic_size"),
        ({"mix": 0.0}, "mix"),
        ({"train_tokens": 1}, "train_tokens"),
    ):
        with pytest.raises(DataError, match=message):
            zipf_topic_corpus(ZipfTopicOptions(**{"vocab_size": 100, **options}))


def test_data_zipf_config_builds_the_datamodule():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        data = compose(overrides=["+data=zipf"]).data
        assert data.vocab_size == 100_000 and data.train_tokens == 1_000_000 and data.name == "zipf"
        small = ["+data=zipf", "data.vocab_size=3000", "data.train_tokens=20000", "data.valid_tokens=2000"]
        dm = instantiate(compose(overrides=[*small, "data.test_tokens=2000"]).data)
    assert isinstance(dm, ZipfDataModule) and isinstance(dm, LMDataModule)
    dm.setup()
    assert dm.num_classes == 3000 and dm.entropy_rate == ZipfTopicSource(3000).entropy_rate
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (20, 35) and torch.equal(x[:, 1:], y[:, :-1])


def test_data_md_quotes_the_default_sources_best_perplexity():
    """docs/data.md's table row for the default data=zipf source (its H and exp(H)) is what the source computes."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 10^5 (default) |"))
    h, ppl = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
    opts = ZipfTopicOptions()
    source = ZipfTopicSource(
        opts.vocab_size, zipf_s=opts.zipf_s, topic_size=opts.topic_size, mix=opts.mix, seed=opts.seed
    )
    assert (h, ppl) == (round(source.entropy_rate, 4), round(math.exp(source.entropy_rate), 2))
