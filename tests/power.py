"""Chi-square goodness-of-fit tests sized by power (issue 22, item 3).

The requirement: a relative error of ``REL_ERROR`` = 5% in the probability of one class, or of one bucket of
classes (a tree node), holding at least ``P_MIN`` = 2% of the mass, is caught with probability >= ``POWER`` = 0.9
at the false-alarm rate ``ALPHA`` = 1e-4 of Pearson's chi-square test.

The calculation. Draw N ids from q' where one bin B (a class, or the classes of a bucket) has mass
q'(B) = (1 + e) q(B) and the rest is scaled by (1 - (1 + e) q(B)) / (1 - q(B)), and test against q with k bins.
Pearson's statistic is then approximately noncentral chi-square with df = k - 1 and noncentrality
lambda = N sum_i (q'_i - q_i)^2 / q_i = N e^2 q(B) / (1 - q(B)) (the error inside B spread in proportion to q; any
other spread gives a larger lambda, by Cauchy-Schwarz). The test rejects above c = chi2.isf(ALPHA, df); its power is
ncx2.sf(c, df, lambda). ``draws_for`` solves ncx2.sf(c, df, lambda) = POWER for lambda and returns
N = ``SAFETY`` x lambda (1 - P_MIN) / (e^2 P_MIN), the draws that give every bin of mass >= P_MIN at least that power.
The noncentral approximation is a little optimistic at this lambda (simulated, 1,000 tests of a 5% error on a 2%
class: rejected 87.7% of the time at SAFETY = 1, 93.2% at 1.1), hence SAFETY = 1.1. For df = 36 (37 classes) that is
lambda = 62.7 and N = 1.35 million; for df = 29, N = 1.26 million.
``test_draws_power.py::test_the_power_calculation_holds_by_simulation`` checks it by simulation. Bins whose
expected count is below 5 are pooled into one (they hold < 5 / N of the mass, far below P_MIN), which only lowers df.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

ALPHA = 1e-4
POWER = 0.9
REL_ERROR = 0.05
P_MIN = 0.02
SAFETY = 1.1


def noncentrality_for(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """lambda at which the chi-square test with ``df`` degrees of freedom at level ``alpha`` has ``power``."""
    critical = chi2.isf(alpha, df)
    return brentq(lambda lam: ncx2.sf(critical, df, lam) - power, 1e-6, 1e5)


def draws_for(num_bins: int, p_min: float = P_MIN, rel_error: float = REL_ERROR) -> int:
    """Draws that catch a ``rel_error`` error on any bin of mass >= ``p_min`` with probability ``POWER`` at level
    ``ALPHA``, for at most ``num_bins`` bins (pooling only lowers df, which raises the power)."""
    lam = noncentrality_for(num_bins - 1)
    return math.ceil(SAFETY * lam * (1 - p_min) / (rel_error**2 * p_min))


def power_of(draws: int, num_bins: int, mass: float, rel_error: float = REL_ERROR) -> float:
    """The chi-square test's probability of catching a ``rel_error`` error on a bin of ``mass`` with ``draws``."""
    lam = draws * rel_error**2 * mass / (1 - mass)
    return float(ncx2.sf(chi2.isf(ALPHA, num_bins - 1), num_bins - 1, lam))


def chi_square_pvalue(counts: np.ndarray, q: np.ndarray) -> float:
    """Pearson's chi-square p-value of observed ``counts`` (n,) against probabilities ``q`` (n,), bins expecting
    fewer than 5 draws pooled into one."""
    counts, q = np.asarray(counts, dtype=np.float64), np.asarray(q, dtype=np.float64)
    q = q / q.sum()
    total = counts.sum()
    expected = q * total
    big = expected >= 5
    obs, exp = list(counts[big]), list(expected[big])
    if not big.all():
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    statistic = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    return float(chi2.sf(statistic, len(obs_a) - 1))
