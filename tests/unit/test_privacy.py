"""Privacy budgets: exact arithmetic, composition, conversions and calibration.

Oracles: exact rational arithmetic (hypothesis), published values (Canonne,
Kamath and Steinke's rho = 2.556 at delta = 1e-10; the classical Gaussian
bound), direct numerical integration of the hockey-stick divergence between two
Gaussians, and brute-force grids over the Renyi order.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import integrate, stats
from scipy.optimize import brentq

from dpdask.errors import BudgetTypeError, NoiseKeyError, PlanError
from dpdask.privacy import (
    MECHANISM_NORM,
    ApproxDP,
    Budget,
    Charge,
    PureDP,
    as_fraction,
    check_calibration,
    check_name,
    gaussian_delta,
    mechanism_guarantee,
    noise_scale,
    parallel,
    split_levels,
    zCDP,
    zcdp_delta,
    zcdp_epsilon,
)

fractions = st.fractions(min_value=0, max_value=1000, max_denominator=10**6)
positive_weights = st.lists(
    st.one_of(
        st.integers(min_value=0, max_value=10**6),
        st.fractions(min_value=0, max_value=100, max_denominator=10**4),
        st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
    ),
    min_size=1,
    max_size=12,
).filter(lambda w: sum(as_fraction(x) for x in w) > 0)


def budgets() -> st.SearchStrategy[Budget]:
    return st.one_of(
        fractions.map(PureDP),
        fractions.map(zCDP),
        st.tuples(fractions, st.fractions(min_value=0, max_value=Fraction(1, 2))).map(
            lambda t: ApproxDP(*t)
        ),
    )


# -- exact arithmetic ---------------------------------------------------------
@given(budgets(), positive_weights)
def test_split_sums_exactly(budget, weights):
    parts = budget.split(weights)
    assert len(parts) == len(weights)
    assert sum(parts) == budget
    assert all(type(p) is type(budget) for p in parts)


@given(budgets(), st.integers(min_value=1, max_value=50))
def test_even_split_and_division(budget, n):
    parts = budget.split(n)
    assert sum(parts) == budget
    assert all(p == budget / n for p in parts)
    assert parts[0] * n == budget


@given(budgets(), budgets())
def test_subtraction_inverts_addition(a, b):
    assume(type(a) is type(b))
    # (epsilon, delta) budgets with delta >= 1 do not exist: adding such parts must raise
    if isinstance(a, ApproxDP) and a.delta + b.delta >= 1:
        with pytest.raises(ValueError, match="delta must be below 1"):
            a + b
        return
    total = a + b
    assert total - b == a
    assert a <= total and b <= total


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_floats_convert_through_their_decimal_repr(x):
    assert as_fraction(x) == Fraction(repr(x))


def test_decimal_floats_are_exact():
    assert PureDP(0.1) + PureDP(0.2) == PureDP("0.3")
    assert sum(zCDP("2.556").split([1, 1, 1])) == zCDP(2.556)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (PureDP(1), PureDP(2), PureDP(3)),
        (zCDP("0.5"), zCDP(1), zCDP("1.5")),
        (PureDP(1), zCDP("0.5"), zCDP(1)),  # eps-DP is eps^2/2-zCDP
        (zCDP("0.5"), PureDP(2), zCDP("2.5")),
        (ApproxDP(1, "1e-6"), ApproxDP(2, "1e-6"), ApproxDP(3, "2e-6")),
        (PureDP(1), ApproxDP(1, "1e-6"), ApproxDP(2, "1e-6")),
    ],
)
def test_sequential_composition(a, b, expected):
    assert a + b == expected
    assert b + a == expected


@given(st.lists(fractions, min_size=1, max_size=8))
def test_parallel_composition_is_the_largest(values):
    assert parallel([zCDP(v) for v in values]) == zCDP(max(values))
    assert parallel([PureDP(v) for v in values]) == PureDP(max(values))


def test_parallel_composition_mixed():
    assert parallel([PureDP(1), zCDP("0.25")]) == zCDP("0.5")
    assert parallel([ApproxDP(1, "1e-9"), ApproxDP("0.5", "1e-6")]) == ApproxDP(1, "1e-6")
    with pytest.raises(BudgetTypeError):
        parallel([zCDP(1), ApproxDP(1, "1e-9")])
    with pytest.raises(ValueError):
        parallel([])


def test_incompatible_composition_raises():
    with pytest.raises(BudgetTypeError):
        zCDP(1) + ApproxDP(1, "1e-6")
    with pytest.raises(ValueError, match="exceeds"):
        PureDP(1) - PureDP(2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PureDP(-1),
        lambda: PureDP(float("nan")),
        lambda: PureDP(float("inf")),
        lambda: PureDP(True),
        lambda: zCDP("abc"),
        lambda: ApproxDP(1, 1),
        lambda: ApproxDP(1, -0.1),
        lambda: PureDP(1).split([0, 0]),
        lambda: PureDP(1).split([1, -1]),
        lambda: PureDP(1) * -1,
        lambda: PureDP(1) / 0,
    ],
)
def test_bad_budgets_raise(make):
    with pytest.raises((TypeError, ValueError)):
        make()


@pytest.mark.parametrize("budget", [PureDP("0.25"), zCDP("2.556"), ApproxDP(1, "1e-10")])
def test_serialisation_roundtrip(budget):
    assert Budget.from_dict(budget.to_dict()) == budget


def test_budgets_are_immutable_and_hashable():
    b = zCDP(1)
    with pytest.raises(AttributeError):
        b.rho = 2
    assert len({zCDP(1), zCDP(Fraction(1)), zCDP(1.0)}) == 1


# -- conversions ------------------------------------------------------------------
def _cks_epsilon_on_grid(rho: float, delta: float) -> float:
    """Independent evaluation of CKS Corollary 13 on a dense grid of Renyi orders."""
    a = 1.0 + np.geomspace(1e-4, 1e3, 400_000)
    eps = a * rho + (np.log(1 / delta) + (a - 1) * np.log1p(-1 / a) - np.log(a)) / (a - 1)
    return float(eps.min())


def test_zcdp_conversion_matches_published_value():
    # Canonne, Kamath and Steinke (2020); the US Census Bureau's figure for rho = 2.556
    eps = zCDP("2.556").epsilon(1e-10)
    assert eps == pytest.approx(17.1436, abs=2e-3)
    # tighter than the classical rho + 2 sqrt(rho log(1/delta)) and no tighter than the
    # exact profile of a single Gaussian mechanism with the same rho
    rho, delta = 2.556, 1e-10
    classical = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    mu = math.sqrt(2 * rho)
    gaussian_eps = brentq(
        lambda e: (
            stats.norm.cdf(-e / mu + mu / 2)
            - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
            - delta
        ),
        0,
        40,
    )
    assert gaussian_eps < eps < classical


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.5, 2.556, 20.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_zcdp_epsilon_is_the_infimum(rho, delta):
    eps = zcdp_epsilon(rho, delta)
    grid = _cks_epsilon_on_grid(rho, delta)
    # valid (never below the infimum) and tight (within a hair of it)
    assert grid - 1e-9 * max(1, grid) <= eps <= grid + 1e-6 * max(1, grid)
    # round trip through the delta form
    assert zcdp_delta(rho, eps) <= delta * (1 + 1e-6)


def test_pure_to_zcdp():
    assert PureDP(2).to_zcdp() == zCDP(2)
    assert PureDP("0.1").to_zcdp() == zCDP(Fraction(1, 200))


# -- calibration ----------------------------------------------------------------
def test_laplace_scale():
    assert PureDP(1).laplace_scale(2.0) == 2.0
    assert PureDP("0.1").laplace_scale(1.0) >= 10.0
    # rounded in the private direction
    b = PureDP(3).laplace_scale(1.0)
    assert Fraction(1) / Fraction(b) <= 3


@pytest.mark.parametrize("rho", ["0.001", "0.5", "2.556", "7"])
@pytest.mark.parametrize("d2", [1.0, math.sqrt(3), 17.0])
def test_zcdp_gaussian_sigma(rho, d2):
    sigma = zCDP(rho).gaussian_sigma(d2)
    assert sigma == pytest.approx(d2 / math.sqrt(2 * float(rho)), rel=1e-14)
    assert Fraction(d2) ** 2 / (2 * Fraction(sigma) ** 2) <= Fraction(rho)


def _hockey_stick(sigma: float, d: float, eps: float) -> float:
    """delta(eps) of N(0, s^2) vs N(d, s^2) by numerical integration of (p - e^eps q)_+."""
    p = stats.norm(0, sigma).pdf
    q = stats.norm(d, sigma).pdf
    # p > e^eps q  iff  y < d/2 - eps sigma^2 / d
    cut = d / 2 - eps * sigma**2 / d
    val, _ = integrate.quad(lambda y: p(y) - math.exp(eps) * q(y), -np.inf, cut, epsabs=1e-14)
    return val


@pytest.mark.parametrize(
    "eps, delta", [(0.1, 1e-5), (1.0, 1e-5), (1.0, 1e-10), (3.0, 1e-6), (8.0, 1e-3)]
)
def test_analytic_gaussian_calibration(eps, delta):
    d2 = 2.0
    sigma = ApproxDP(eps, delta).gaussian_sigma(d2)
    # private: the exact divergence at sigma is at most delta ...
    assert _hockey_stick(sigma, d2, eps) <= delta * (1 + 1e-6)
    # ... and tight: 0.1% less noise violates it
    assert _hockey_stick(sigma * 0.999, d2, eps) > delta
    # never worse than the classical calibration (valid for eps < 1)
    if eps < 1:
        assert sigma <= d2 * math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_gaussian_delta_matches_integration():
    for c, eps in [(0.5, 0.1), (1.0, 1.0), (3.0, 2.0)]:
        assert gaussian_delta(c, eps) == pytest.approx(_hockey_stick(1.0, c, eps), rel=1e-6)


def test_gaussian_needs_delta():
    with pytest.raises(ValueError, match="delta"):
        ApproxDP(1, 0).gaussian_sigma(1.0)
    with pytest.raises(ValueError):
        zCDP(0).gaussian_sigma(1.0)
    with pytest.raises(ValueError):
        PureDP(1).laplace_scale(float("nan"))


@pytest.mark.parametrize(
    "mechanism, sens, scale, privacy, ok",
    [
        ("laplace", 2.0, 2.0, PureDP(1), True),
        ("laplace", 2.0, 1.99, PureDP(1), False),
        ("discrete_laplace", 1.0, 1.0, zCDP("0.5"), True),
        ("laplace", 1.0, 1.0, zCDP("0.49"), False),
        ("gaussian", 1.0, 1.0, zCDP("0.5"), True),
        ("gaussian", 1.0, 0.99, zCDP("0.5"), False),
        ("gaussian", 1.0, 1.0, PureDP(100), False),
        ("discrete_gaussian", 3.0, 3.0, zCDP("0.5"), True),
        ("gaussian", 1.0, ApproxDP(1, "1e-5").gaussian_sigma(1.0), ApproxDP(1, "1e-5"), True),
        ("gaussian", 1.0, 3.5, ApproxDP(1, "1e-5"), False),
        ("discrete_gaussian", 1.0, 5.0, ApproxDP(1, "1e-5"), True),
        ("laplace", 1.0, 1.0, ApproxDP(1, 0), True),
    ],
)
def test_check_calibration(mechanism, sens, scale, privacy, ok):
    if ok:
        natural = check_calibration(mechanism, sens, scale, privacy)
        assert natural == mechanism_guarantee(mechanism, sens, scale)
    else:
        with pytest.raises(ValueError):
            check_calibration(mechanism, sens, scale, privacy)


# -- error classes (dpdask.errors; each still a ValueError) ------------------------
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: PureDP(-1), id="negative epsilon"),
        pytest.param(lambda: ApproxDP(1, 1), id="delta 1"),
        pytest.param(lambda: zCDP("one"), id="unparsable"),
        pytest.param(lambda: zCDP(1) - zCDP(2), id="overspent"),
        pytest.param(lambda: zCDP(1).split([0, 0]), id="no weight"),
        pytest.param(lambda: parallel([]), id="empty parallel"),
        pytest.param(lambda: PureDP(0).laplace_scale(1.0), id="zero epsilon"),
        pytest.param(lambda: check_calibration("gaussian", 1.0, 0.1, zCDP(1)), id="noise small"),
        pytest.param(lambda: check_calibration("cauchy", 1.0, 1.0, zCDP(1)), id="mechanism"),
        pytest.param(lambda: split_levels(zCDP(1), ["a", "a"]), id="repeated level"),
        pytest.param(lambda: noise_scale("laplace", 1.0, zCDP(1)), id="laplace in zCDP"),
    ],
)
def test_bad_privacy_parameters_are_plan_errors(make):
    with pytest.raises(PlanError):
        make()


def test_check_name_is_the_one_name_check():
    assert check_name("county", "level") == "county"
    with pytest.raises(ValueError, match="level must be a non-empty string, got ''"):
        check_name("", "level")
    c = Charge("r", "run1", "county", "A", "gaussian", 1.0, 2.0, zCDP("0.125"), "k1")
    assert c.same_as(c) and c._same_as(c)
    with pytest.raises(NoiseKeyError):
        Charge("r", "run1", "county", "A", "gaussian", 1.0, 2.0, zCDP("0.125"), "")
    assert MECHANISM_NORM["discrete_gaussian"] == 2
