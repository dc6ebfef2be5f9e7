"""Sum queries over numeric attributes (paper 004): bins, thresholds, mechanisms, errors."""

from __future__ import annotations

import argparse
import math
import pathlib

import numpy as np
import pytest

from dpdask import Domain
from dpdask.errors import ArgumentError, BudgetTypeError, PlanError
from dpdask.linalg import Prefix
from dpdask.measure import charge_level, measure
from dpdask.noise import KeyedRNG, MeasurementId, SecretKey
from dpdask.privacy import Ledger, PureDP
from dpdask.sums import (
    MECHANISMS,
    NumericBins,
    SumWorkload,
    exponential_grid,
    monotone,
    recursive_statistic,
    recursive_sum,
    recursive_threshold,
    relative_error,
    split_budget,
    sum_mechanism,
    svt_threshold,
    threshold_charge,
)
from dpdask.workloads import sum_query

DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "cps"


@pytest.fixture(scope="module")
def small():
    """20 bins of 10 over [0, 200], a skewed histogram with a few large values."""
    bins = NumericBins.uniform(0, 200, 20)
    x = np.array([0, 4, 9, 14, 12, 10, 8, 6, 5, 3, 3, 2, 1, 1, 0, 1, 0, 0, 1, 2], dtype=np.int64)
    sums = SumWorkload(Domain(wage=20), "wage", bins.values, bins.prefixes())
    return bins, x, sums


# -- bins and workloads ----------------------------------------------------------------------
def test_bins_values_histogram_truncation():
    bins = NumericBins.uniform(0, 100, 4)
    np.testing.assert_array_equal(bins.values, [25, 50, 75, 100])
    np.testing.assert_array_equal(bins.histogram([0.0, 25.0, 25.01, 100.0]), [2, 1, 0, 1])
    np.testing.assert_array_equal(bins.truncated(60), [25, 50, 60, 60])
    np.testing.assert_array_equal(bins.truncated(math.inf), bins.values)
    np.testing.assert_array_equal(bins.prefixes(2).hi, [1, 3])
    np.testing.assert_array_equal(
        bins.ranges([0, 30], [50, 100]).dense(), [[1, 1, 0, 0], [0, 1, 1, 1]]
    )
    with pytest.raises(ValueError, match="lie in"):
        bins.histogram([101.0])
    with pytest.raises(ArgumentError, match="positive"):
        bins.truncated(0)
    with pytest.raises(ArgumentError, match="strictly increasing"):
        NumericBins([0, 1, 1])


def test_sum_workload_matches_sum_query_and_truncates():
    dom = Domain(county=3, sex=2, wage=4)
    vals = np.array([10.0, 20.0, 30.0, 40.0])
    sw = SumWorkload(dom, "wage", vals, Prefix(4), by=["county", "sex"])
    x = np.arange(dom.size, dtype=float)
    ref = sum_query(dom, "wage", vals, Prefix(4), by=["county", "sex"])
    np.testing.assert_allclose(sw.weighted() @ x, ref @ x)
    np.testing.assert_allclose(sw.weighted() @ x, sw.counting @ (sw.weights * x))
    t = sum_query(dom, "wage", np.minimum(vals, 25), Prefix(4), by=["county", "sex"])
    np.testing.assert_allclose(sw.weighted(25.0) @ x, t @ x)
    np.testing.assert_allclose(sw.weighted(25.0) @ x, sw.counting @ (sw.cell_weights(25.0) * x))
    assert sw.shape == (24, 24)


# -- thresholds ----------------------------------------------------------------------------
def test_recursive_second_stage_is_truncation():
    """Appendix A.5: min_i H_i + (N - i) Delta equals the truncated sum."""
    rng = KeyedRNG.for_testing(3, "a5")
    for _ in range(20):
        v = np.round(rng.laplace(1.0, 30, unsafe_float=True) ** 2 * 50, 2)
        for delta in (0.5, 5.0, 50.0, float(v.max()) + 1):
            assert recursive_sum(v, delta) == pytest.approx(np.minimum(v, delta).sum(), rel=1e-12)


def _neighbours(x: np.ndarray):
    for j in range(x.size):
        up = x.copy()
        up[j] += 1
        yield up
        if x[j] > 0:
            down = x.copy()
            down[j] -= 1
            yield down


def test_recursive_statistic_has_sensitivity_one(small):
    bins, x, _ = small
    for beta in (0.01, 0.3, 2.0):
        L = recursive_statistic(x, bins.values, beta, 15.0)
        for y in _neighbours(x):
            assert abs(recursive_statistic(y, bins.values, beta, 15.0) - L) <= 1


def test_svt_deterministic_limit_and_reproducible(small):
    bins, x, _ = small
    u = bins.values
    grid = exponential_grid(20, 1.2, u.max())
    assert grid[0] == 20 and grid[-1] >= u.max() > grid[-2]
    # huge epsilon: the first candidate with F_i >= r N
    res = svt_threshold(
        x, u, 1e9, KeyedRNG.for_testing(1, "svt"), r="0.9", s=20, c=1.2, unsafe_float=True
    )
    F = np.array([x[u <= g].sum() for g in grid])
    assert res.value == grid[np.argmax(F >= 0.9 * x.sum())]
    a = svt_threshold(x, u, 0.5, KeyedRNG.for_testing(5, "s"), s=20, size=50)
    b = svt_threshold(x, u, 0.5, KeyedRNG.for_testing(5, "s"), s=20, size=50)
    np.testing.assert_array_equal(a.theta, b.theta)
    assert np.isin(a.theta[np.isfinite(a.theta)], grid).all()
    assert a.privacy == PureDP("0.5") and a.to_dict()["method"] == "svt"
    with pytest.raises(PlanError, match="too large"):
        svt_threshold(x, u, 1e12, KeyedRNG.for_testing(5, "s"), s=20)


def test_svt_query_sensitivity(small):
    """q F_i - p N moves by at most max(p, q - p) between neighbours."""
    bins, x, _ = small
    u, p, q = bins.values, 499, 500
    grid = exponential_grid(20, 1.2, u.max())

    def f(h):
        return np.array([q * h[u <= g].sum() - p * h.sum() for g in grid])

    base = f(x)
    for y in _neighbours(x):
        assert np.abs(f(y) - base).max() <= max(p, q - p)


def test_recursive_threshold_limit(small):
    bins, x, _ = small
    L = recursive_statistic(x, bins.values, 0.4, 15.0)
    res = recursive_threshold(
        x,
        bins.values,
        1e9,
        KeyedRNG.for_testing(2, "r"),
        theta0=15.0,
        beta=0.4,
        mu=0.5,
        unsafe_float=True,
    )
    assert res.value == pytest.approx(15.0 * math.exp(0.5 + 0.4 * L), rel=1e-6)
    grid = exponential_grid(15.0, 1.2, 200)
    snapped = recursive_threshold(
        x, bins.values, 1.0, KeyedRNG.for_testing(2, "r"), theta0=15.0, grid=grid, size=20
    )
    assert np.isin(snapped.theta, grid).all()


# -- mechanisms and their errors ---------------------------------------------------------------
@pytest.mark.parametrize("name", MECHANISMS)
def test_expected_error_equals_monte_carlo(small, name):
    """bias^2 + variance against 40,000 draws: total within 3%, every query within 6%."""
    _, x, sums = small
    mech = sum_mechanism(name, sums, 60.0, PureDP(1), restarts=1)
    draws = mech.sample(x, KeyedRNG.for_testing(11, ("mc", name)), 40_000)
    empirical = ((draws - mech.true_answers(x)) ** 2).mean(axis=0)
    formula = mech.expected_squared_error(x)
    assert empirical.sum() == pytest.approx(formula.sum(), rel=0.03)
    np.testing.assert_allclose(empirical, formula, rtol=0.06)
    assert (mech.bias(x) <= 0).all() and mech.bias(x)[-1] < 0


def test_paper_formulas_a3_a4(small):
    """The variances equal the closed forms of appendix A.3 (TiMM) and A.4 (TaMM)."""
    _, x, sums = small
    eps = 0.5
    W = sums.counting.dense()
    t = sums.cell_weights(60.0)
    T = np.diag(t)
    timm = sum_mechanism("TiMM", sums, 60.0, PureDP(eps), strategy="hierarchical")
    A = timm.strategy.dense() / t[None, :]  # A T measured: recover A
    sens = np.abs(A @ T).sum(axis=0).max()
    a3 = 2 * sens**2 / eps**2 * np.diag(W @ np.linalg.inv(A.T @ A) @ W.T)
    np.testing.assert_allclose(timm.query_variances(), a3, rtol=1e-8)
    tamm = sum_mechanism("TaMM", sums, 60.0, PureDP(eps), strategy="hierarchical")
    A = tamm.strategy.dense()
    a4 = (
        2 * np.abs(A).sum(0).max() ** 2 / eps**2 * np.diag(W @ T @ np.linalg.inv(A.T @ A) @ T @ W.T)
    )
    np.testing.assert_allclose(tamm.query_variances(), a4, rtol=1e-8)
    ident = sum_mechanism("Identity", sums, 60.0, PureDP(eps))
    np.testing.assert_allclose(ident.query_variances(), 2 / eps**2 * (W**2 @ t**2), rtol=1e-10)
    wl = sum_mechanism("Workload", sums, 60.0, PureDP(eps))
    sens = np.abs(W @ T).sum(axis=0).max()
    np.testing.assert_allclose(wl.query_variances(), 2 * sens**2 / eps**2, rtol=1e-8)
    sqm = sum_mechanism("SQM", sums, 60.0, PureDP(eps))
    m = W.shape[0]
    np.testing.assert_allclose(
        sqm.query_variances(), 2 * (m * np.abs(W * t).max(axis=1) / eps) ** 2, rtol=1e-12
    )
    # bias: W (T - D) x, bounded by (records above theta) x max per-record loss
    d = sums.weights
    np.testing.assert_allclose(tamm.bias(x), W @ ((t - d) * x))
    above = int(x[d > 60.0].sum())
    assert (np.abs(tamm.bias(x)) <= tamm.bias_bound(above) + 1e-9).all()
    np.testing.assert_allclose(sqm.bias(x), tamm.bias(x))


def test_no_truncation_is_unbiased(small):
    _, x, sums = small
    for name in MECHANISMS:
        mech = sum_mechanism(name, sums, None, PureDP(1), strategy="hierarchical")
        np.testing.assert_allclose(mech.bias(x), 0.0, atol=1e-9)
        assert (mech.bias_per_record() == 0).all()


def test_strategy_chosen_by_select(small):
    _, _, sums = small
    tamm = sum_mechanism("TaMM", sums, 60.0, PureDP(1), strategy="hdmm", restarts=1,
                         objective="total")  # fmt: skip
    assert tamm.template.startswith("hdmm")
    hier = sum_mechanism("TaMM", sums, 60.0, PureDP(1), strategy="hierarchical")
    assert hier.template == "hierarchical"
    assert tamm.query_variances().sum() <= hier.query_variances().sum() * 1.0001
    with pytest.raises(BudgetTypeError, match="pure DP"):
        from dpdask.privacy import zCDP

        sum_mechanism("TaMM", sums, 60.0, zCDP(1))
    with pytest.raises(ArgumentError, match="unknown sum mechanism"):
        sum_mechanism("MM", sums, 60.0, PureDP(1))


def test_relative_error_and_isotonic():
    np.testing.assert_allclose(relative_error([110.0, 5.0], [100.0, 0.0]), [0.1, 0.05])
    y = monotone(np.array([[1.0, 3.0, 2.0, 4.0]]))
    np.testing.assert_allclose(y, [[1.0, 2.5, 2.5, 4.0]])


# -- budget, ledger, measure ----------------------------------------------------------------
def test_two_charges_and_measurement(tmp_path, small):
    bins, x, sums = small
    total = PureDP("0.5")
    first, second = split_budget(total, "0.1")
    assert first + second == total and first == PureDP("0.05")
    assert split_budget(total, 0) == (None, total)
    key = SecretKey.for_testing(9)
    ident = MeasurementId("wages", "county", 0, "sum:threshold")
    res = svt_threshold(x, bins.values, first.epsilon, KeyedRNG(key, ident), s=20)
    ledger = Ledger(tmp_path / "ledger.sqlite", create=True)
    ledger.open_release("wages", total)
    ledger.charge(threshold_charge(res, "wages", "run1", "county", "sum:threshold", key))
    mech = sum_mechanism("TaMM", sums, res.value, second, strategy="hierarchical")
    plan = mech.plan()
    charge_level(plan, ledger, "wages", "run1", "county", "sum:measure", key=key)
    assert ledger.spent("wages") == total and len(ledger.charges("wages")) == 2
    z = measure(
        plan, x, key, MeasurementId("wages", "county", 0, "sum:measure"), ledger, "run1",
        test_mode=True,
    )  # fmt: skip
    answers = mech.answer(z)
    sd = np.sqrt(mech.query_variances())
    assert (np.abs(answers - mech.output @ x) < 6 * sd + 1e-6).all()


# -- benchmark smoke test --------------------------------------------------------------------
@pytest.mark.skipif(not (DATA / "AER_CPS1988.csv").exists(), reason="../shared/data/cps absent")
def test_bench_sums_rows():
    from dpdask_benchmarks import sums as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        ["--workloads", "Q3", "--trials", "2", "--epsilons", "1", "--rhos", "0.5",
         "--strategy", "hierarchical", "--seed", "1"]
    )  # fmt: skip
    out = bench.run(args)
    assert out["records"] == 28155
    rows = out["rows"]
    assert {r["threshold"] for r in rows} == {"none", "svt", "recursive"}
    assert {r["mechanism"] for r in rows} == set(MECHANISMS)
    for r in rows:
        assert {"workload", "epsilon", "rho", "threshold", "mechanism"} <= set(r)
        assert r["mean_relative_error"] >= 0 and r["mean_relative_error_raw"] >= 0
