"""FeatureCache: phi(w) of every class beside the kernel tree; the same proposal, cheaper updates and scores."""

from __future__ import annotations

import pytest
import torch

from lmtrain.sampler import RFFSampler
from lmtrain.sampler.kernel import QuadraticFeatures, RandomFourierFeatures, cache
from lmtrain.sampler.kernel.cache import FeatureCache
from lmtrain.sampler.options import KernelOptions
from tests.test_kernel_shared import queries
from tests.test_kernel_tree import augmented, make_tree

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_cache_changes_nothing_but_the_cost():
    """With and without a full-precision cache: the same tree and the same per-example and shared log q, after
    the same updates; the cache holds phi of the current weights and replaces the copy of the old rows."""
    n, d = 101, 6
    weight = augmented(n, d, seed=0)
    cached, plain = make_tree("rff", weight.clone(), leaf_size=4), make_tree("rff_nocache", weight.clone(), leaf_size=4)
    assert (
        cached.store.cache.active
        and cached.store.cache.table.dtype == torch.float32
        and cached.store.previous.numel() == 0
    )
    assert not plain.store.cache.active and plain.store.previous.shape == weight.shape
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        rows = torch.randint(0, n, (int(torch.randint(1, 20, (1,), generator=gen)),), generator=gen)
        weight[rows] += 0.05 * torch.randn(rows.numel(), d + 1, generator=gen)
        for tree in (cached, plain):
            tree.weight[rows] = weight[rows]
            tree.update(tree.weight, rows)
    torch.testing.assert_close(cached.nodes, plain.nodes, rtol=0, atol=1e-5)
    torch.testing.assert_close(cached.store.cache.table[:n], cached.features(weight), rtol=0, atol=1e-6)
    assert cached.store.cache.table[n:].eq(0).all()  # padding rows of the last bucket
    query = queries(5, d, seed=2)
    every = torch.arange(n).expand(5, n)
    torch.testing.assert_close(cached.log_q(query, every), plain.log_q(query, every), rtol=0, atol=1e-4)
    psi = cached.mixture(query)
    torch.testing.assert_close(cached.log_q_all_mixture(psi), plain.log_q_all_mixture(psi), rtol=0, atol=1e-4)


def test_auto_takes_full_precision_then_bfloat16_then_none_and_only_where_it_pays(monkeypatch):
    rff, quadratic = RandomFourierFeatures(D=8), QuadraticFeatures()
    auto = FeatureCache("auto")
    monkeypatch.setattr(cache, "AUTO_BYTES", 1000 * 16 * 4)  # room for 1,000 rows of 16 float32 features
    assert auto.dtype_for(rff, 1000, 16, torch.float32) == torch.float32
    assert auto.dtype_for(rff, 2000, 16, torch.float32) == torch.bfloat16
    assert auto.dtype_for(rff, 2001, 16, torch.float32) is None
    assert auto.dtype_for(quadratic, 10, 16, torch.float32) is None  # d x d products beat reading F features
    assert FeatureCache("full").dtype_for(quadratic, 10**9, 16, torch.float64) == torch.float64  # asked for: given
    assert FeatureCache(False).mode == FeatureCache("off").mode == "off"  # YAML reads `off` as false
    with pytest.raises(ValueError, match="feature_cache must be one of 'auto', 'full', 'bfloat16', 'off'"):
        KernelOptions(feature_cache="float16")


def test_the_sampler_config_reaches_the_cache():
    sampler = RFFSampler(D=16, feature_cache="bfloat16", unigram_share=0.0)
    sampler.update(augmented(50, 4, seed=3))
    assert sampler.tree.store.cache.table.dtype == torch.bfloat16 and sampler.tree.store.cache.table.shape[1] == 32
    assert RFFSampler(D=16, feature_cache="off", unigram_share=0.0).tree.store.cache.mode == "off"
    state = sampler.state_dict()
    assert not any("table" in key for key in state)  # derived state: checkpoints do not carry it
