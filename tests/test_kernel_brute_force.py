"""Kernel proposals against a brute-force kernel computed here from h and every class vector (issue 22, item 1).

Every expected probability below is computed in float64 directly from the definitions in docs/strategies.md:
the quadratic kernel alpha (h.w)^2 + 1, the exact RFF kernel exp(nu cos(h, w)), and the RFF estimate
phi(h).phi(w) with phi(u) = D^(-1/2) [cos(Omega u/|u|), sin(Omega u/|u|)] built here from the sampler's own random
frequencies Omega (the only thing read from the sampler besides its public ``log_q``, ``log_q_all`` and ``sample``).
No tree node, walk or feature map of lmtrain is used to build the expectation, so a tree that sums the wrong
features, a missing normalization, a wrong in-bucket kernel or a wrong mixture weight changes ``exp(log q)`` by far
more than the 1e-5 tolerance (the trees run in float64 here, where their rounding is ~1e-15).

The RFF frequencies themselves (their scale sqrt(nu), the 1/sqrt(D) normalization) cannot be checked against the
same Omega: ``test_rff_estimate_converges_to_the_true_kernel`` checks them against exp(nu (cos - 1)).
"""

from __future__ import annotations

import math

import pytest
import torch

from lmtrain.sampler import QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel import QuadraticFeatures, RandomFourierFeatures
from tests.helpers import log_q_all_from, log_q_from, sample_from

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5  # absolute, on probabilities; float64 trees round at ~1e-15


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def classes(n: int, d: int, seed: int) -> torch.Tensor:
    """Augmented class vectors [w, b] (n, d + 1) in float64 with a non-zero bias column."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([0.3 * torch.randn(n, d, generator=gen), 0.5 * torch.randn(n, 1, generator=gen)], 1).double()


def queries(count: int, d: int, seed: int) -> torch.Tensor:
    """Query vectors [h, 1] (count, d + 1) in float64."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randn(count, d, generator=gen), torch.ones(count, 1)], 1).double()


def quadratic_kernel(query: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """K(h, w_j) = alpha (h . w_j)^2 + 1 for every query and class, (N, n)."""
    return alpha * (query @ weight.T) ** 2 + 1.0


def rff_estimate(query: torch.Tensor, weight: torch.Tensor, omega: torch.Tensor, paired: bool = False) -> torch.Tensor:
    """phi(h) . phi(w_j) with phi(u) = D^(-1/2) [cos(Omega u/|u|), sin(Omega u/|u|)], (N, n), from Omega (D, d);
    ``paired``: only query i with class i, (N,)."""
    omega = omega.double()
    D = omega.shape[0]

    def phi(x: torch.Tensor) -> torch.Tensor:
        angle = unit(x) @ omega.T
        return torch.cat([angle.cos(), angle.sin()], -1) / math.sqrt(D)

    if paired:
        return (phi(query) * phi(weight)).sum(-1)
    return phi(query) @ phi(weight).T


def normalized(kernel: torch.Tensor) -> torch.Tensor:
    return kernel / kernel.sum(-1, keepdim=True)


def every_class(count: int, n: int) -> torch.Tensor:
    return torch.arange(n).expand(count, n)


def assert_sampler_gives(sampler, query: torch.Tensor, expected: torch.Tensor) -> None:
    """``exp(log q)`` of every class, through ``log_q``, ``log_q_all`` and the step's ``propose(query)`` (what
    training uses), equals ``expected`` ((N, n) per example or (n,) batch-shared), and the log q returned with draws
    is that of the ids drawn."""
    n = expected.shape[-1]
    if not sampler.shared:
        got = log_q_from(sampler, query, every_class(query.shape[0], n)).exp()
    else:
        got = log_q_from(sampler, query, torch.arange(n)).exp()
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    every = expected if expected.dim() == 2 else expected.expand(query.shape[0], n)
    torch.testing.assert_close(log_q_all_from(sampler, query, n).exp(), every, rtol=0, atol=TOL)
    torch.manual_seed(0)
    ids, log_q = sample_from(sampler, query, 50)
    torch.testing.assert_close(log_q.exp(), expected.gather(-1, ids), rtol=0, atol=TOL)
    targets = torch.randint(n, (query.shape[0],))
    proposal = sampler.propose(query, None, targets)
    all_ids = torch.arange(n) if proposal.shared else every_class(query.shape[0], n)
    torch.testing.assert_close(proposal.log_q(all_ids).exp(), expected, rtol=0, atol=TOL)
    ids, log_q, target_log_q, _ = proposal.draw(50)
    torch.testing.assert_close(log_q.exp(), expected.gather(-1, ids), rtol=0, atol=TOL)
    torch.testing.assert_close(proposal.log_q(ids), log_q, rtol=0, atol=TOL)
    torch.testing.assert_close(target_log_q.exp(), every.gather(1, targets[:, None]), rtol=0, atol=TOL)


@pytest.mark.parametrize("leaf_size", [1, 3, 8, None])
def test_quadratic_per_example_is_the_normalized_kernel(leaf_size):
    """q(j | h) = K(h, w_j) / sum_k K(h, w_k) for every class, whatever the bucket size (the kernel is exact, so
    the tree's bucket sums and the in-bucket kernel telescope to it)."""
    n, d, alpha = 50, 6, 100.0
    weight, query = classes(n, d, seed=1), queries(4, d, seed=2)
    sampler = QuadraticSampler(alpha=alpha, leaf_size=leaf_size)
    sampler.update(weight)
    assert_sampler_gives(sampler, query, normalized(quadratic_kernel(query, weight, alpha)))


@pytest.mark.parametrize("leaf_size", [1, 5, None])
def test_quadratic_batch_shared_is_the_mixture_of_the_normalized_kernels(leaf_size):
    """Batch-shared: q-bar(j) = (1/N) sum_i K(h_i, w_j) / sum_k K(h_i, w_k), one distribution for the batch."""
    n, d, alpha = 50, 6, 100.0
    weight = classes(n, d, seed=3)
    sampler = QuadraticSampler(alpha=alpha, leaf_size=leaf_size)
    sampler.share_negatives(True)
    sampler.update(weight)
    assert sampler.shared
    for seed in (4, 5):  # a second batch on the same tree: nothing of the first batch's mixture may be reused
        query = queries(7, d, seed=seed)
        assert_sampler_gives(sampler, query, normalized(quadratic_kernel(query, weight, alpha)).mean(0))


# nu = 1: exp(nu (cos - 1)) >= e^-2 ~ 0.14, and with D = 2048 the estimate's error (1 - k^2) / sqrt(2 D) <= 0.016,
# so every phi(h).phi(w) is positive and no eps clamp of the walk binds: the tree's q is then exactly the formula.
RFF_D, RFF_NU = 2048, 1.0


def rff_sampler(leaf_size: int | None, shared: bool) -> RFFSampler:
    sampler = RFFSampler(D=RFF_D, nu=RFF_NU, seed=5, leaf_size=leaf_size, feature_cache="off", unigram_share=0.0)
    sampler.share_negatives(shared)
    return sampler


def test_rff_per_example_with_one_class_per_bucket_is_the_normalized_estimate():
    """With one class per bucket the walk's branch probabilities telescope: q(j | h) = K^(h, w_j) / sum_k K^(h, w_k)
    with K^ the feature estimate phi(h).phi(w) from the sampler's own frequencies."""
    n, d = 50, 6
    weight, query = classes(n, d, seed=6), queries(4, d, seed=7)
    sampler = rff_sampler(leaf_size=1, shared=False)
    sampler.update(weight)
    estimate = rff_estimate(query, weight, sampler.features.omega)
    assert estimate.min() > 1e-3  # the precondition: no clamp binds
    assert_sampler_gives(sampler, query, normalized(estimate))


def test_rff_per_example_picks_inside_a_bucket_with_the_exact_kernel():
    """Buckets of L classes (docs/strategies.md: contiguous id ranges; n = 64, leaf_size 4 gives 16 buckets of 4):
    the walk reaches bucket B with probability sum_{k in B} K^(h, w_k) / sum_k K^(h, w_k) (feature estimates),
    then picks j in B with probability exp(nu cos(h, w_j)) / sum_{k in B} exp(nu cos(h, w_k)) (the exact kernel).
    A wrong nu or a missing normalization of h or w in the in-bucket kernel fails here."""
    n, d, size = 64, 6, 4
    weight, query = classes(n, d, seed=8), queries(3, d, seed=9)
    sampler = rff_sampler(leaf_size=size, shared=False)
    sampler.update(weight)
    estimate = rff_estimate(query, weight, sampler.features.omega)  # (N, n)
    assert estimate.min() > 1e-3
    reach = normalized(estimate.view(3, n // size, size).sum(2))  # (N, B)
    exact = torch.exp(RFF_NU * unit(query) @ unit(weight).T).view(3, n // size, size)
    expected = (reach.unsqueeze(2) * normalized(exact)).view(3, n)
    assert_sampler_gives(sampler, query, expected)


@pytest.mark.parametrize("leaf_size", [1, 4, None])
def test_rff_batch_shared_is_the_mixture_of_the_normalized_estimates(leaf_size):
    """Batch-shared: q-bar(j) = (1/N) sum_i K^(h_i, w_j) / sum_k K^(h_i, w_k), whatever the bucket size (the walk
    and the in-bucket pick both use the mixture query's feature-space scores)."""
    n, d = 64, 6
    weight = classes(n, d, seed=10)
    sampler = rff_sampler(leaf_size=leaf_size, shared=True)
    sampler.update(weight)
    for seed in (11, 12):  # a second batch on the same tree: nothing of the first batch's mixture may be reused
        query = queries(5, d, seed=seed)
        estimate = rff_estimate(query, weight, sampler.features.omega)
        assert estimate.min() > 1e-3
        assert_sampler_gives(sampler, query, normalized(estimate).mean(0))


def test_unigram_share_mixes_the_kernel_with_the_unigram():
    """unigram_share s: q = (1 - s') K / sum K + s' u with s' = round(s m) / m of the last draw and u the smoothed
    training unigram ((c + 1) / sum (c + 1))."""
    n, d, alpha, m = 50, 6, 100.0, 8
    weight, query = classes(n, d, seed=12), queries(3, d, seed=13)
    counts = torch.arange(n, 0, -1) ** 2
    sampler = QuadraticSampler(alpha=alpha, unigram_share=0.25, num_classes=n, counts=counts)
    sampler.update(weight)
    torch.manual_seed(1)
    sample_from(sampler, query, m)  # sets s' = round(0.25 * 8) / 8 = 0.25
    u = (counts.double() + 1) / (counts.double() + 1).sum()
    expected = 0.75 * normalized(quadratic_kernel(query, weight, alpha)) + 0.25 * u
    torch.testing.assert_close(log_q_from(sampler, query, every_class(3, n)).exp(), expected, rtol=0, atol=TOL)


def test_rff_estimate_converges_to_the_true_kernel():
    """The RFF estimate phi(x).phi(y) = (1/D) sum_k cos(omega_k . (x - y)) of unit x, y is unbiased for
    k(x, y) = exp(-nu |x - y|^2 / 2) = exp(nu (cos - 1)) when omega ~ N(0, nu I), with variance
    ((1 + k^4) / 2 - k^2) / D = (1 - k^2)^2 / (2 D). So the root-mean-square error falls like 1 / sqrt(D) with a
    known constant. Over P = 300 pairs and S = 30 seeds (frequency draws) the statistic
    R = mean square error * 2 D / mean (1 - k^2)^2 must be 1 within 0.15 at every D: measured, R of one seed
    spreads with a standard deviation of ~0.08, so the mean over 30 seeds has a standard error of ~0.015 and
    0.15 is ~10 of them. The mean error (the bias) must be within 4 standard errors of 0 (SE from the spread of
    the per-seed means). Guard: frequencies scaled by sqrt(nu) too many (omega ~ N(0, nu^2 I), a "wrong nu")
    converge to exp(nu^2 (cos - 1)); the same statistics reject it by far."""
    nu, d, pairs, seeds = 4.0, 16, 300, 30
    gen = torch.Generator().manual_seed(14)
    x = unit(torch.randn(pairs, d, generator=gen, dtype=torch.float64))
    spread = torch.linspace(0.05, 1.5, pairs, dtype=torch.float64).unsqueeze(1)
    y = unit(x + spread * torch.randn(pairs, d, generator=gen, dtype=torch.float64))  # cosines from ~0 to ~1
    true = torch.exp(nu * ((x * y).sum(1) - 1))  # k(x, y), the kernel the sampler's K is proportional to
    assert true.min() < 0.05 and true.max() > 0.9

    def statistics(D: int, scale: float = 1.0) -> tuple[float, float, float, float]:
        errors = []
        for seed in range(seeds):
            omega = RandomFourierFeatures(D=D, nu=nu, seed=seed).frequencies(d)  # the RFF sampler's Omega (D, d)
            errors.append(rff_estimate(x, y, scale * omega, paired=True) - true)
        err = torch.stack(errors)  # (S, P)
        ratio = (err.square().mean() * 2 * D / (1 - true**2).square().mean()).item()
        stderr = (err.mean(1).std() / math.sqrt(seeds)).item()
        return ratio, err.mean().item(), stderr, err.square().mean().sqrt().item()

    rms = []
    for D in (64, 256, 1024, 4096):
        ratio, bias, stderr, root = statistics(D)
        assert abs(ratio - 1) < 0.15, (D, ratio)
        assert abs(bias) < 4 * stderr, (D, bias, stderr)
        rms.append(root)
    # 1 / sqrt(D): each 4x step in D halves the RMS error (2 within the 0.15 band of R)
    for a, b in zip(rms, rms[1:], strict=False):
        assert 1.7 < a / b < 2.3, rms
    ratio, bias, stderr, _ = statistics(4096, scale=math.sqrt(nu))  # the wrong frequencies
    assert abs(ratio - 1) > 1 and abs(bias) > 20 * stderr, (ratio, bias, stderr)


def test_a_checkpoint_s_frequencies_replace_the_seed_s():
    """A resumed run samples from the saved Omega, not from a fresh draw of its own seed (or of none yet)."""
    saved = RandomFourierFeatures(D=16, nu=2.0, seed=5)
    x = queries(4, 7, seed=3).float()
    expected = saved(x)  # draws Omega (16, 8) from seed 5
    fresh = RandomFourierFeatures(D=16, nu=2.0, seed=0)  # Omega not drawn yet: a (16, 0) placeholder
    fresh.load_state_dict(saved.state_dict())
    assert fresh.omega.shape == (16, 8)
    torch.testing.assert_close(fresh(x), expected, rtol=0, atol=0)
    drawn = RandomFourierFeatures(D=16, nu=2.0, seed=0)
    drawn(x)  # Omega of seed 0 already drawn at the same shape
    drawn.load_state_dict(saved.state_dict())
    torch.testing.assert_close(drawn(x), expected, rtol=0, atol=0)


def test_a_checkpoint_s_frequencies_take_the_model_s_dtype():
    """A float32 checkpoint loaded into a float64 model keeps the model's dtype (its products stay float64)."""
    saved = RandomFourierFeatures(D=16, seed=5)
    x = queries(4, 7, seed=3)
    saved(x.float())
    model = RandomFourierFeatures(D=16, seed=0).double()
    model.load_state_dict(saved.state_dict())
    assert model.omega.dtype == torch.float64 and model(x).dtype == torch.float64


def test_quadratic_features_apply_to_any_leading_shape():
    """phi of a (2, 3, d) block equals phi of its rows one by one: the constant 1 is appended on the last axis."""
    features = QuadraticFeatures(alpha=3.0)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    torch.testing.assert_close(features(x), features(x.reshape(6, 5)).reshape(2, 3, -1))
