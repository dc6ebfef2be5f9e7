"""What TiMM's and TaMM's strategy selection minimises: the ``total`` or ``relative`` error."""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import Domain
from dpdask.errors import ArgumentError
from dpdask.noise import KeyedRNG
from dpdask.privacy import PureDP
from dpdask.sums import (
    DEFAULT_OBJECTIVE,
    NumericBins,
    SumWorkload,
    relative_weights,
    select_strategy,
    sum_mechanism,
)


@pytest.fixture(scope="module")
def small():
    """40 bins of 10 over [0, 400], empty first bins, a skewed histogram with a tail."""
    bins = NumericBins.uniform(0, 400, 40)
    rng = np.random.default_rng(3)  # the data only
    x = bins.histogram(np.minimum(rng.lognormal(4.3, 0.6, 3000) + 25.0, 400.0))
    sums = SumWorkload(Domain(wage=40), "wage", bins.values, bins.prefixes())
    return bins, x, sums


def test_relative_weights_oracle(small):
    bins, _, sums = small
    W = sums.counting.dense()
    for theta in (None, 120.0):
        t = bins.values if theta is None else np.minimum(bins.values, theta)
        np.testing.assert_allclose(relative_weights(sums, theta), (W @ t) ** -0.5, rtol=1e-12)
    ranges = SumWorkload(Domain(wage=40), "wage", bins.values, bins.ranges([0, 100], [50, 400]))
    np.testing.assert_allclose(
        relative_weights(ranges, 120.0),
        (ranges.counting.dense() @ np.minimum(bins.values, 120.0)) ** -0.5,
        rtol=1e-12,
    )


def _weighted_total(mech, r: np.ndarray) -> float:
    return float((mech.query_variances() * r**2).sum())


def test_each_objective_minimises_its_own_criterion(small):
    """HDMM on the objective's workload beats the other objective on that criterion."""
    _, _, sums = small
    theta = 150.0
    r = relative_weights(sums, theta)
    rel = sum_mechanism("TaMM", sums, theta, PureDP(1), objective="relative", restarts=2)
    tot = sum_mechanism("TaMM", sums, theta, PureDP(1), objective="total", restarts=2)
    assert rel.info["objective"] == "relative" and tot.info["objective"] == "total"
    assert _weighted_total(rel, r) <= _weighted_total(tot, r) * 1.02
    assert rel.query_variances().sum() >= tot.query_variances().sum() * 0.98
    # the relative selection gives the smallest prefixes less noise
    assert rel.query_variances()[:5].sum() < tot.query_variances()[:5].sum()


def test_defaults_and_errors(small):
    _, _, sums = small
    assert DEFAULT_OBJECTIVE == {"TiMM": "total", "TaMM": "relative"}
    tamm = sum_mechanism("TaMM", sums, 150.0, PureDP(1), restarts=1)
    timm = sum_mechanism("TiMM", sums, 150.0, PureDP(1), restarts=1)
    assert tamm.info["objective"] == "relative" and timm.info["objective"] == "total"
    with pytest.raises(ArgumentError, match="unknown objective"):
        sum_mechanism("TaMM", sums, 150.0, PureDP(1), objective="max")
    with pytest.raises(ArgumentError, match="only TiMM and TaMM"):
        select_strategy("Identity", sums, 150.0, PureDP(1))


@pytest.mark.parametrize("objective", ["relative", "total"])
def test_timm_strategy_is_truncation_independent(small, objective):
    """TiMM's ``A`` is chosen for ``W`` (its weights use the untruncated values)."""
    _, _, sums = small
    a = select_strategy("TiMM", sums, 60.0, PureDP(1), objective=objective, restarts=1)
    b = select_strategy("TiMM", sums, 300.0, PureDP(1), objective=objective, restarts=1)
    np.testing.assert_allclose(a.strategy.dense(), b.strategy.dense(), rtol=1e-12)
    mech = sum_mechanism("TiMM", sums, 60.0, PureDP(1), objective=objective, restarts=1)
    A = mech.strategy.dense() / sums.cell_weights(60.0)[None, :]
    np.testing.assert_allclose(A, a.strategy.dense(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("objective", ["relative", "total"])
def test_a4_closed_form_and_monte_carlo_for_both_objectives(small, objective):
    """Whatever ``A`` the objective selects, TaMM answers ``W T`` with A.4's error."""
    _, x, sums = small
    eps, theta = 0.5, 150.0
    mech = sum_mechanism("TaMM", sums, theta, PureDP(eps), objective=objective, restarts=1)
    W = sums.counting.dense()
    T = np.diag(sums.cell_weights(theta))
    A = mech.strategy.dense()
    a4 = (
        2
        * np.abs(A).sum(0).max() ** 2
        / eps**2
        * np.diag(W @ T @ np.linalg.pinv(A.T @ A) @ T @ W.T)
    )
    np.testing.assert_allclose(mech.query_variances(), a4, rtol=1e-8)
    draws = mech.sample(x, KeyedRNG.for_testing(4, ("obj", objective)), 40_000)
    empirical = ((draws - mech.true_answers(x)) ** 2).mean(axis=0)
    assert empirical.sum() == pytest.approx(mech.expected_squared_error(x).sum(), rel=0.03)


def test_group_sums_select_with_relative_objective():
    """Sums by group: the relative weights scale the rows on the attribute only."""
    bins = NumericBins.uniform(0, 200, 20)
    sums = SumWorkload(Domain(sex=2, wage=20), "wage", bins.values, bins.prefixes(), by=["sex"])
    mech = sum_mechanism("TaMM", sums, 90.0, PureDP(1), restarts=1)
    assert mech.output.shape == (40, 40)
    v = mech.query_variances()
    np.testing.assert_allclose(v[:20], v[20:], rtol=1e-6)  # the groups are symmetric
    M = mech.strategy.dense()
    R = sums.weighted(90.0).dense() @ np.linalg.pinv(M)
    np.testing.assert_allclose(v, 2 * mech.noise_scale**2 * (R**2).sum(1), rtol=1e-8)
