"""KernelTree: exact log q, draws that follow it, sparse updates equal to a rebuild (docs/strategies.md)."""

from __future__ import annotations

import pytest
import scipy.stats
import torch
from scipy.stats import chisquare

from lmtrain.sampler.kernel import (
    FeatureMap,
    KernelTree,
    QuadraticFeatures,
    QuadraticSampler,
    RandomFourierFeatures,
)
from tests.helpers import sample_from

pytestmark = pytest.mark.usefixtures("one_thread")


# dense_factor 0 forces per-walker gathers everywhere, a huge one forces one GEMM per level; "gpu" takes the GPU
# backend (a GPU's: FixedWalk with its top levels scored whole, FixedUpdate), with the top of a small tree
# scored whole and its last levels drawn in gathered stages (two levels: one stage; three: one stage of three; four:
# two stages of two); "gpu_whole" with the defaults, which score a small tree whole (per position the last levels a
# stage read from the product, one query draws its buckets from the reach)
PATHS = {"gather": 0, "dense": 10**9, "auto": 64, "gpu": 0, "gpu_three": 0, "gpu_deep": 0, "gpu_whole": 0}
GPU_WALKED_LEVELS = {"gpu": 2, "gpu_three": 3, "gpu_deep": 4}  # of the tests' trees of 3-6 levels; the rest scored


# the feature cache of each kind of tree (default auto: full precision for rff, none for quadratic)
CACHE = {"rff_nocache": "off", "rff_bf16cache": "bfloat16", "quadratic_cache": "full"}


def make_features(kind: str) -> FeatureMap:
    if kind.startswith("quadratic"):
        return QuadraticFeatures(alpha=100.0)
    projection = "bfloat16" if kind == "rff_bf16" else "float32"  # Omega u from bfloat16 inputs
    return RandomFourierFeatures(D=64, nu=4.0, seed=3, projection=projection)


def make_tree(
    kind: str, weight: torch.Tensor, path: str = "auto", leaf_size: int = 3, chunk: int = 40, **kw
) -> KernelTree:
    """A tree whose small ``chunk`` makes sampling and building run in several memory blocks."""
    kw.setdefault("feature_cache", CACHE.get(kind, "auto"))
    kw.setdefault("backend", "fixed" if path.startswith("gpu") else "walk")
    tree = KernelTree(make_features(kind), leaf_size=leaf_size, dense_factor=PATHS[path], chunk_elements=chunk, **kw)
    if path.startswith("gpu") and path != "gpu_whole":  # one query (a mixture's psi) walks too: no tree scored whole
        walked = GPU_WALKED_LEVELS[path]
        tree.backend.walk.walked, tree.backend.walk.scored, tree.backend.walk.single_reads = walked, 0, 0
    tree.rebuild(weight)
    return tree


def rebuilt(tree: KernelTree, kind: str, weight: torch.Tensor) -> KernelTree:
    """A fresh tree over ``weight`` like ``tree``. A cache's features must equal those a rebuild computes, to
    float32 rounding; a bfloat16 cache may round an entry the other way (one ulp), so the fresh tree is then
    summed from ``tree``'s own cached features."""
    fresh = make_tree(kind, weight, leaf_size=tree.store.leaf_size, chunk=tree.store.chunk_elements)
    if tree.store.cache.active:
        table = tree.store.cache.table
        one_ulp = 2**-8 * table.abs().max().float() if table.dtype == torch.bfloat16 else 1e-6
        assert (table.float() - fresh.store.cache.table.float()).abs().max() <= one_ulp
    if tree.store.cache.active and table.dtype == torch.bfloat16:
        fresh.store.cache.table.copy_(table)
        fresh.store.set_leaves(torch.arange(fresh.num_buckets))
        fresh.store.resum_levels(fresh.nodes)
    return fresh


def augmented(n: int, d: int, seed: int) -> torch.Tensor:
    """Class vectors [w, b] with a non-zero bias column, as the quadratic output stores them."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([0.3 * torch.randn(n, d, generator=gen), 0.5 * torch.randn(n, 1, generator=gen)], 1)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", ["quadratic", "rff", "rff_bf16", "rff_nocache", "rff_bf16cache"])
def test_log_q_is_a_distribution_and_draws_follow_it(kind, path):
    n, d = 37, 5  # leaf_size 3 -> 16 buckets of 3, the last 3 empty
    weight = augmented(n, d, seed=0)
    tree = make_tree(kind, weight, path)
    assert tree.num_buckets == 16 and (tree.store.floor[-3:] == 0).all()
    gen = torch.Generator().manual_seed(1)
    query = torch.cat([torch.randn(3, d, generator=gen), torch.ones(3, 1)], 1)  # [h, 1]
    every = torch.arange(n).expand(3, n)
    q = tree.log_q(query, every).exp()  # (3, n)
    torch.testing.assert_close(q.sum(1), torch.ones(3), rtol=0, atol=1e-5)
    # every class at once (diagnostics): the same distribution, including the empty trailing buckets
    torch.testing.assert_close(tree.log_q_all(query).exp(), q, rtol=0, atol=1e-6)

    torch.manual_seed(2)
    draws = 30_000
    if path.startswith("gpu"):  # the draws walked together with known ids (a step's targets), which keep log q
        known = every[:, ::4]  # (3, 10), every bucket's classes among them
        ids, log_q = tree.backend.sample(query, tree.features(query), draws, None, known)  # (3, draws + 10) each
        assert torch.equal(ids[:, draws:], known)
        torch.testing.assert_close(log_q[:, draws:], tree.log_q(query, known), rtol=1e-6, atol=1e-5)
        ids, log_q = ids[:, :draws], log_q[:, :draws]
    else:
        ids, log_q = tree.sample(query, draws)
    assert ids.shape == log_q.shape == (3, draws) and ids.min() >= 0 and ids.max() < n
    torch.testing.assert_close(log_q, tree.log_q(query, ids), rtol=0, atol=1e-5)  # log q of what was drawn
    for row in range(3):
        observed = torch.bincount(ids[row], minlength=n).double()
        expected = q[row].double() * draws
        big = expected >= 5  # pool the rare classes so the chi-square approximation holds
        obs, exp = observed[big], expected[big]
        if not big.all():
            obs = torch.cat([obs, observed[~big].sum().view(1)])
            exp = torch.cat([exp, expected[~big].sum().view(1)])
        exp = exp * obs.sum() / exp.sum()
        assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-4


@pytest.mark.parametrize("path", ["gather", "dense"])
def test_quadratic_proposal_equals_brute_force_kernel(path):
    n, d = 50, 6
    weight = augmented(n, d, seed=4)
    tree = make_tree("quadratic", weight, path, leaf_size=4)
    gen = torch.Generator().manual_seed(5)
    query = torch.cat([torch.randn(4, d, generator=gen), torch.ones(4, 1)], 1)
    kernel = 100.0 * (query @ weight.T) ** 2 + 1.0  # (4, n)
    brute = kernel / kernel.sum(1, keepdim=True)
    torch.testing.assert_close(tree.log_q(query, torch.arange(n).expand(4, n)).exp(), brute, rtol=1e-4, atol=1e-7)


def test_rff_kernel_estimate_converges_like_one_over_d():
    gen = torch.Generator().manual_seed(6)
    x = torch.nn.functional.normalize(torch.randn(2000, 16, generator=gen), dim=1)
    y = torch.nn.functional.normalize(x + 0.8 * torch.randn(2000, 16, generator=gen), dim=1)  # spread of cosines
    mse = []
    for D in (32, 128, 512, 2048):
        errors = []
        for seed in range(3):
            rff = RandomFourierFeatures(D=D, nu=4.0, seed=seed)
            estimate = (rff(x) * rff(y)).sum(1)
            exact = rff.kernel(x, y)
            torch.testing.assert_close(exact, torch.exp(4.0 * ((x * y).sum(1) - 1)))  # ∝ exp(nu cos)
            errors.append((estimate - exact).pow(2).mean())
        mse.append(torch.stack(errors).mean().item())
    assert all(a > b for a, b in zip(mse, mse[1:], strict=False)), mse
    ratio = mse[0] / mse[-1]  # D grew 64x
    assert 64 / 3 < ratio < 64 * 3, mse


@pytest.mark.parametrize("kind", ["quadratic", "quadratic_cache", "rff", "rff_nocache", "rff_bf16cache"])
def test_sparse_updates_match_a_rebuild_without_drift(kind):
    n, d = 203, 7
    weight = augmented(n, d, seed=7)
    tree = make_tree(kind, weight, leaf_size=4, chunk=1 << 22)
    gen = torch.Generator().manual_seed(8)
    scale = tree.nodes.abs().max()
    errors = []
    for round_ in range(100):
        rows = torch.randint(0, n, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen)
        before = tree.nodes.clone()
        weight[rows] += 0.05 * torch.randn(rows.numel(), d + 1, generator=gen)  # in place, like SGD
        tree.update(weight, rows)
        heap = torch.unique(rows // tree.bucket_size) + tree.num_buckets - 1
        touched = {int(i) for i in heap}
        for i in heap.tolist():
            while i > 0:
                i = (i - 1) // 2
                touched.add(i)
        untouched = torch.tensor(sorted(set(range(tree.nodes.shape[0])) - touched))
        assert torch.equal(tree.nodes[untouched], before[untouched])  # only changed buckets and ancestors
        if round_ in (9, 99):
            fresh = rebuilt(tree, kind, weight)
            errors.append((tree.nodes - fresh.nodes).abs().max() / scale)
    assert errors[0] < 1e-5 and errors[1] < 1e-5  # float rounding only
    assert errors[1] <= max(4 * errors[0], 1e-6)  # and no growth with the number of updates


def test_sampler_logs_once_when_a_dense_optimizer_forces_rebuilds(caplog):
    sampler = QuadraticSampler(leaf_size=4)
    weight = augmented(40, 3, seed=9)
    query = torch.cat([torch.randn(2, 3), torch.ones(2, 1)], 1)
    with caplog.at_level("INFO", logger="lmtrain"):
        sampler.update(weight)  # the initial build
        sampler.update(weight)  # e.g. after a checkpoint load: nothing drawn since, not a dense step
        assert not caplog.records
        for _ in range(3):
            sample_from(sampler, query, 5)
            weight += 0.01
            sampler.update(weight)  # dense optimizer: rows=None every step
    assert len(caplog.records) == 1 and "rebuilt after every step" in caplog.records[0].getMessage()
    fresh = make_tree("quadratic", weight, leaf_size=4)
    torch.testing.assert_close(sampler.tree.nodes, fresh.nodes)


def test_sampler_does_not_blame_the_optimizer_for_a_load_after_sparse_steps(caplog):
    # a training run's sparse steps, then the best checkpoint loaded for the test: one rebuild, no dense optimizer
    sampler = QuadraticSampler(leaf_size=4)
    weight = augmented(40, 3, seed=9)
    query = torch.cat([torch.randn(2, 3), torch.ones(2, 1)], 1)
    with caplog.at_level("INFO", logger="lmtrain"):
        sampler.update(weight)
        for _ in range(3):
            ids, _ = sample_from(sampler, query, 5)
            weight[ids.reshape(-1)] += 0.01
            sampler.update(weight, ids.reshape(-1))  # sparse optimizer: the changed rows
        sampler.update(weight)  # the load
    assert not caplog.records


def test_bad_settings_raise_value_errors():
    with pytest.raises(ValueError, match="leaf_size"):
        KernelTree(QuadraticFeatures(), leaf_size=0)
    with pytest.raises(ValueError, match="eps"):
        KernelTree(QuadraticFeatures(), eps=0.0)
    with pytest.raises(ValueError, match="alpha"):
        QuadraticFeatures(alpha=-1.0)
    with pytest.raises(ValueError, match="D must be >= 1"):
        RandomFourierFeatures(D=0)
    with pytest.raises(ValueError, match="temperature"):
        RandomFourierFeatures(temperature=0.0)
    assert RandomFourierFeatures(nu=9.0, temperature=0.5).nu == pytest.approx(4.0)


@pytest.mark.parametrize("kind", ["quadratic", "rff"])
def test_dense_draws_follow_the_same_q_as_the_walk(kind):
    """sample_dense draws from exp(log_q_all), the walk's own q, and returns log q equal to the walk's log_q."""
    torch.manual_seed(11)
    features = QuadraticFeatures() if kind == "quadratic" else RandomFourierFeatures(D=32, seed=0)
    tree = KernelTree(features, leaf_size=4)
    tree.rebuild(torch.randn(37, 5) * 0.5)
    query = torch.randn(2, 5)
    ids, log_q = tree.sample_dense(query, 20_000)
    torch.testing.assert_close(log_q, tree.log_q(query, ids), rtol=1e-4, atol=1e-4)
    expected = tree.log_q_all(query).exp().double()  # (2, 37)
    for row in range(2):
        counts = torch.bincount(ids[row], minlength=37).double()
        keep = expected[row] * 20_000 >= 5
        observed = torch.cat([counts[keep], counts[~keep].sum().view(1)])
        wanted = torch.cat([expected[row][keep], expected[row][~keep].sum().view(1)]) * 20_000
        statistic = ((observed - wanted) ** 2 / wanted.clamp_min(1e-9)).sum().item()
        assert scipy.stats.chi2.sf(statistic, observed.numel() - 1) > 1e-4
    assert tree.dense_draw_pays(400, 1000) and not tree.dense_draw_pays(10**7, 1000)  # memory-bounded


@pytest.mark.slow  # ~50 s in all; test_sparse_updates_match_a_rebuild_without_drift is the fast 100-round check
@pytest.mark.parametrize(
    ("kind", "refresh"),
    [(k, 10**9) for k in ("quadratic", "rff", "rff_nocache", "rff_bf16", "rff_bf16cache")]
    + [("rff", 8), ("rff_nocache", 8)],
)
def test_delta_updates_equal_a_rebuild_after_ten_thousand_rounds(kind, refresh):
    """Changed rows enter their bucket as phi(new) - phi(old) (refresh 10**9: never recomputed, the worst case
    for float32 drift; old from the feature cache, or node sums of the old rows): after 10^4 rounds the tree
    equals a rebuild."""
    n, d = 96, 5
    weight = augmented(n, d, seed=12)
    tree = make_tree(kind, weight, leaf_size=8, chunk=1 << 22, refresh=refresh)
    gen = torch.Generator().manual_seed(13)
    scale, by_delta = tree.nodes.abs().max(), 0
    for _ in range(10_000):
        rows = torch.randint(0, n, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen)
        weight[rows] += 0.02 * torch.randn(rows.numel(), d + 1, generator=gen)
        before = tree.store.deltas.clone()
        tree.update(weight, rows)
        by_delta += int((tree.store.deltas > before).sum())
    fresh = rebuilt(tree, kind, weight)
    if tree.store.cache.active:  # the leaves hold the sums of the cached features
        leaves = tree.store.cache.table.view(tree.num_buckets, tree.bucket_size, -1).float().sum(1)
        assert ((tree.nodes[tree.num_buckets - 1 :] - leaves).abs().max() / scale).item() < 1e-5
    error = ((tree.nodes - fresh.nodes).abs().max() / scale).item()
    assert error < 1e-5, error  # float rounding only, after 10^4 rounds
    assert by_delta > 10_000  # the delta path was taken (most bucket changes are single rows)
    assert int(tree.store.deltas.max()) <= refresh  # a bucket is recomputed once it has taken `refresh` deltas


def test_bfloat16_projection_is_close_to_the_float32_features():
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(50, 200, generator=gen)
    exact = RandomFourierFeatures(D=1024, seed=0)(x)
    fast = RandomFourierFeatures(D=1024, seed=0, projection="bfloat16")(x)
    assert fast.dtype == torch.float32
    angle = (fast - exact).abs() * 1024**0.5  # entries are cos / sqrt(D) and sin / sqrt(D)
    assert angle.mean() < 0.01 and angle.max() < 0.1  # measured: 0.003 and 0.03 rad
    kernel = (exact @ exact.T, fast @ fast.T)
    estimate_noise = (kernel[0] - RandomFourierFeatures(D=1024, seed=0).kernel(x[:, None], x[None])).abs().max()
    assert (kernel[0] - kernel[1]).abs().max() < 0.1 * estimate_noise  # measured: 6e-4 against 0.07
    with pytest.raises(ValueError, match="projection"):
        RandomFourierFeatures(projection="float16")


@pytest.mark.parametrize("kind", ["quadratic", "rff", "rff_nocache", "rff_bf16cache"])
@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("leaf_size", [4, 256])
@pytest.mark.parametrize("propagation", ["whole", "paths"])
def test_gpu_path_updates_match_a_rebuild_with_repeated_rows(kind, many, leaf_size, propagation):
    """FixedUpdate (the fixed backend's): repeated rows count once, and the tree equals a rebuild after 100 rounds.
    ``many``: a step names more rows than there are classes (every row goes through, unchanged ones masked).
    ``leaf_size`` 256: a tree of one leaf, the root, which has no parent to take the repeats' deltas.
    ``propagation``: the changed buckets' ancestors re-summed whole, or given the deltas along their paths
    (``sampler.tree_update=paths``: wherever the tree has levels and a step names fewer rows than its classes)."""
    n, d = 203, 7
    weight = augmented(n, d, seed=7)
    mode = "resum" if propagation == "whole" else "paths"
    tree = make_tree(kind, weight, path="gpu", leaf_size=leaf_size, chunk=1 << 22, tree_update=mode)
    assert (tree.store.num_buckets == 1) == (leaf_size > n)
    update = tree.backend.tree_update
    assert update.by_paths(33) == (propagation == "paths" and leaf_size < n)  # a round's most rows without ``many``
    assert not update.by_paths(n)  # a step that names n rows or more goes through every row
    gen = torch.Generator().manual_seed(8)
    scale = tree.nodes.abs().max()
    errors = []
    for round_ in range(100):
        distinct = torch.randperm(n, generator=gen)[: int(torch.randint(1, 12, (1,), generator=gen))]
        weight[distinct] += 0.05 * torch.randn(distinct.numel(), d + 1, generator=gen)  # in place, like SGD
        rows = distinct.repeat(3 if not many else n // distinct.numel() + 1)  # every changed row named repeatedly
        tree.update(weight, rows[torch.randperm(rows.numel(), generator=gen)])
        if round_ in (9, 99):
            fresh = rebuilt(tree, kind, weight)
            errors.append((tree.nodes - fresh.nodes).abs().max() / scale)
    assert errors[0] < 1e-5 and errors[1] < 1e-5  # float rounding only: a repeat added twice would be ~1e-2
    assert errors[1] <= max(4 * errors[0], 1e-6)  # and no growth with the number of updates
