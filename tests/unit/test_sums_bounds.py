"""The published SVT bias bound covers the truth at its stated confidence (Monte Carlo).

A sum release with an SVT threshold publishes: with probability ``>= 1 - beta``, at most
``(1 - r) N + alpha / q`` records lie above ``theta`` and every prefix sum is lowered by at
most that many times ``bias_per_record``. Here the exact (discrete Laplace) SVT runs
thousands of times on data whose truncation matters; the failure rate must stay below
``beta`` (plus three Monte Carlo standard errors), and a bound without the additive term
must fail more often than ``beta`` at small epsilon (the check has power).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpdask.noise import KeyedRNG
from dpdask.sums import NumericBins, svt_threshold, svt_truncation_bound

RUNS = 4000
BETA = 0.05


def _lognormal() -> tuple[NumericBins, np.ndarray]:
    bins = NumericBins.uniform(0, 2000, 200)
    rng = np.random.default_rng(0)  # the data only
    return bins, bins.histogram(np.minimum(rng.lognormal(5.0, 0.6, 20_000), 2000.0))


def _cliff() -> tuple[NumericBins, np.ndarray]:
    """97% of the records at most 100, 3% spread over (1500, 2000]: F jumps past r N late."""
    bins = NumericBins.uniform(0, 2000, 200)
    rng = np.random.default_rng(1)
    low = rng.uniform(1.0, 100.0, 19_400)
    high = rng.uniform(1500.5, 2000.0, 600)
    return bins, bins.histogram(np.concatenate([low, high]))


def _oracle(bins: NumericBins, x: np.ndarray, theta: float) -> tuple[int, np.ndarray, np.ndarray]:
    """Records above theta, the prefix sums' truncation bias and per-record loss (dense)."""
    u = bins.values
    t = np.minimum(u, theta)
    bias = np.cumsum((t - u) * x)  # W (T - D) x for every prefix
    per_record = np.maximum.accumulate(u - t)  # max_{j <= i} (u_j - t_j)
    return int(x[u > theta].sum()), bias, per_record


@pytest.mark.parametrize("data", [_lognormal, _cliff])
@pytest.mark.parametrize("eps", [0.05, 0.2, 1.0])
def test_svt_bias_bound_covers_truth(data, eps):
    bins, x = data()
    n = int(x.sum())
    rng = KeyedRNG.for_testing(7, ("svt-mc", str(eps), data.__name__))
    res = svt_threshold(x, bins.values, eps, rng, s=20, size=RUNS)
    frac, additive = svt_truncation_bound(res, BETA)
    assert frac == pytest.approx(0.002) and additive > 0
    bound = frac * n + additive
    fails = naive_fails = 0
    for theta in res.theta:
        if math.isinf(theta):  # no candidate chosen: nothing truncated, unbiased
            continue
        n_trunc, bias, per_record = _oracle(bins, x, float(theta))
        covered = n_trunc <= bound and np.all(-bias <= bound * per_record + 1e-6)
        fails += not covered
        naive_fails += n_trunc > frac * n
        assert np.all(bias <= 1e-9)  # truncation only lowers the sums
    allowance = 3 * math.sqrt(BETA * (1 - BETA) / RUNS)
    assert fails / RUNS <= BETA + allowance
    if eps == 0.05:  # without alpha / q the bound fails: the Monte Carlo has power
        assert naive_fails / RUNS > BETA + allowance


def test_svt_bound_parameters():
    bins, x = _lognormal()
    res = svt_threshold(x, bins.values, 0.5, KeyedRNG.for_testing(1, "p"), r="0.95", s=20)
    frac, additive = svt_truncation_bound(res, 0.1)
    k = int(res.params["candidates"])
    # r = 19/20: Delta = max(19, 1) = 19, q = 20
    assert frac == pytest.approx(0.05)
    assert additive == pytest.approx(8 * 19 / 0.5 * math.log(4 * k / 0.1) / 20)
    with pytest.raises(ValueError, match="beta"):
        svt_truncation_bound(res, 1.5)
    from dpdask.sums import recursive_threshold

    rec = recursive_threshold(x, bins.values, 0.5, KeyedRNG.for_testing(1, "r"), theta0=20)
    with pytest.raises(ValueError, match="SVT"):
        svt_truncation_bound(rec)


# --- the recursive threshold's bound -------------------------------------------------


def _above(bins: NumericBins, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Records above each threshold, counted from the histogram (the oracle)."""
    u = bins.values
    return np.array([int(x[u > t].sum()) for t in np.asarray(theta, dtype=float)])


@pytest.mark.parametrize("seed", range(6))
def test_recursive_event_bounds_truncation_for_every_noise(seed):
    """Derivation check by enumeration: for every integer noise ``Y > -mu / beta`` the
    records above ``theta0 exp(mu + beta (L + Y))`` are at most ``L``; and a noise at or
    below it can truncate every record (the event cannot be dropped)."""
    from dpdask.sums import recursive_statistic

    rng = np.random.default_rng(seed)
    bins = NumericBins.uniform(0, 500, 50)
    x = rng.poisson(rng.uniform(0, 4, 50) * (rng.uniform(size=50) < 0.4))
    theta0, beta, mu = 10.0, float(rng.choice([0.05, 0.2, 0.7])), float(rng.choice([0.3, 1.0]))
    L = recursive_statistic(x, bins.values, beta, theta0)
    a = mu / beta
    ys = np.arange(math.floor(-a) + 1, 60)
    theta = theta0 * np.exp(mu + beta * (L + ys))
    assert np.all(_above(bins, x, theta) <= L)

    same = np.zeros(50, dtype=np.int64)
    same[-1] = 1000  # every record at the top value
    L1 = recursive_statistic(same, bins.values, beta, theta0)
    assert L1 < 1000
    low = theta0 * np.exp(mu + beta * (L1 + math.floor(-a - 1)))
    assert _above(bins, same, np.array([low]))[0] == 1000


@pytest.mark.parametrize("mu", [0.5, 3.0])
@pytest.mark.parametrize("eps", [0.05, 0.5])
def test_recursive_bias_bound_covers_truth(mu, eps):
    """Monte Carlo: the published count bound fails at most at its stated rate."""
    from dpdask.sums import recursive_threshold, recursive_truncation_bound

    bins, x = _cliff()
    rng = KeyedRNG.for_testing(11, ("rec-mc", str(eps), str(mu)))
    res = recursive_threshold(x, bins.values, eps, rng, theta0=20, mu=mu, size=RUNS)
    bounds, fail = recursive_truncation_bound(res, BETA)
    # mu / beta_r = 2.5 mu / eps: the event Y > -mu / beta_r is affordable for mu = 3 only
    assert (fail <= BETA) if mu == 3.0 else (fail > 2 * BETA)
    n_trunc = _above(bins, x, res.theta)
    allowance = 3 * math.sqrt(fail * (1 - fail) / RUNS)
    assert np.mean(n_trunc > bounds) <= fail + allowance
    for theta, b in zip(res.theta[:50], bounds[:50], strict=True):
        _, bias, per_record = _oracle(bins, x, float(theta))
        if _above(bins, x, np.array([theta]))[0] <= b:
            assert np.all(-bias <= b * per_record + 1e-6)


@pytest.mark.parametrize("mu", [0.5, 3.0])
def test_recursive_failure_rate_is_tight(mu):
    """Every record at the top value: the bound fails exactly when the threshold falls
    below it, so the observed failure rate matches the stated one from both sides."""
    from dpdask.sums import recursive_threshold, recursive_truncation_bound

    bins = NumericBins.uniform(0, 2000, 200)
    x = np.zeros(200, dtype=np.int64)
    x[-1] = 5000
    eps = 0.2
    rng = KeyedRNG.for_testing(12, ("rec-tower", str(mu)))
    res = recursive_threshold(x, bins.values, eps, rng, theta0=20, mu=mu, size=RUNS)
    bounds, fail = recursive_truncation_bound(res, BETA)
    rate = np.mean(_above(bins, x, res.theta) > bounds)
    sd = math.sqrt(fail * (1 - fail) / RUNS)
    assert rate <= fail + 3 * sd
    if mu == 0.5:  # the event Y <= -mu / beta_r is what fails: the rate is not lower
        assert rate >= fail - 4 * sd - 0.02


def test_recursive_bound_refusals():
    from dpdask.sums import recursive_threshold, recursive_truncation_bound

    bins, x = _lognormal()
    svt = svt_threshold(x, bins.values, 0.5, KeyedRNG.for_testing(1, "p"), s=20)
    with pytest.raises(ValueError, match="recursive"):
        recursive_truncation_bound(svt)
    gridded = recursive_threshold(
        x, bins.values, 0.5, KeyedRNG.for_testing(1, "g"), theta0=20, grid=bins.values
    )
    with pytest.raises(ValueError, match="grid"):
        recursive_truncation_bound(gridded)
