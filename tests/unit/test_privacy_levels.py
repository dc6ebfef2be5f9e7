"""The one budget-to-noise path: the split over levels and each level's noise scale."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dpdask.errors import BudgetTypeError
from dpdask.linalg import Prefix
from dpdask.privacy import (
    ApproxDP,
    PureDP,
    check_calibration,
    noise_scale,
    split_levels,
    zCDP,
)
from dpdask.strategy import select

LEVELS = ("state", "county", "tract")
BUDGETS = [PureDP("0.7"), zCDP("2.556"), ApproxDP(1, "1e-9")]


@pytest.mark.parametrize("total", BUDGETS, ids=repr)
@pytest.mark.parametrize(
    "shares",
    [
        None,
        [1, 1, 1],
        [1, 2, 7],
        ["0.1", 0.3, Fraction(1, 3)],
        {"tract": 5, "state": 1, "county": "2.5"},
    ],
    ids=["even", "ones", "ints", "mixed", "mapping"],
)
def test_split_is_exact(total, shares) -> None:
    parts = split_levels(total, LEVELS, shares)
    assert list(parts) == list(LEVELS)  # the levels' order, whatever the mapping's
    assert sum(parts.values()) == total  # exactly, in rational arithmetic
    assert all(type(b) is type(total) for b in parts.values())
    if isinstance(shares, dict):
        weights = [Fraction(str(shares[lv])) for lv in LEVELS]
    else:
        weights = [Fraction(str(w)) for w in shares or [1, 1, 1]]
    for lv, w in zip(LEVELS, weights, strict=True):
        assert parts[lv] == total * (w / sum(weights))


def test_even_split() -> None:
    assert split_levels(zCDP(1), ["state", "county"], None) == {
        "state": zCDP(Fraction(1, 2)),
        "county": zCDP(Fraction(1, 2)),
    }


@pytest.mark.parametrize(
    ("levels", "shares", "message"),
    [
        (LEVELS, {"state": 1, "county": 1}, r"no share for level\(s\) \['tract'\]"),
        (LEVELS, {"state": 1, "county": 1, "tract": 1, "block": 1}, r"\['block'\]"),
        (LEVELS, [1, 2], "2 budget shares for 3 levels"),
        (LEVELS, [1, 2, 3, 4], "4 budget shares for 3 levels"),
        (LEVELS, [1, 0, 1], "share of level 'county' must be positive"),
        (LEVELS, {"state": 1, "county": -1, "tract": 1}, "'county' must be positive"),
        (LEVELS, [1, True, 1], "boolean"),
        (LEVELS, [1, "x", 1], "cannot parse"),
        (LEVELS, [1, math.inf, 1], "finite"),
        (LEVELS, "112", "mapping of level to share or a sequence"),
        (LEVELS, 3, "mapping of level to share or a sequence"),
        ((), None, "no levels"),
        ("state", None, "not the string"),
        (("state", "state"), None, r"\['state'\] are repeated"),
    ],
)
def test_split_refuses(levels, shares, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_levels(zCDP(1), levels, shares)


def test_split_needs_a_budget() -> None:
    with pytest.raises(BudgetTypeError, match="budget"):
        split_levels(1.0, LEVELS)  # type: ignore[arg-type]


@pytest.mark.parametrize("sensitivity", [1.0, 2.0, 3.0, 0.1, 17.25])
@pytest.mark.parametrize("epsilon", ["1", "0.5", "0.1", "1/3", "2.556"])
def test_laplace_scale_is_sensitivity_over_epsilon(sensitivity: float, epsilon: str) -> None:
    b = noise_scale("laplace", sensitivity, PureDP(epsilon))
    eps = Fraction(epsilon)
    assert b == pytest.approx(sensitivity / float(eps), rel=1e-15)
    assert Fraction(sensitivity) / Fraction(b) <= eps  # never spends more than epsilon
    assert b == PureDP(epsilon).laplace_scale(sensitivity)


@pytest.mark.parametrize("sensitivity", [1.0, 2.0, math.sqrt(3), 0.1, 17.25])
@pytest.mark.parametrize("rho", ["1", "0.5", "0.01", "1/3", "2.556"])
def test_gaussian_sigma_is_sensitivity_over_sqrt_2rho(sensitivity: float, rho: str) -> None:
    sigma = noise_scale("gaussian", sensitivity, zCDP(rho))
    assert sigma == pytest.approx(sensitivity / math.sqrt(2 * float(Fraction(rho))), rel=1e-15)
    assert Fraction(sensitivity) ** 2 / (2 * Fraction(sigma) ** 2) <= Fraction(rho)


@pytest.mark.parametrize(("epsilon", "delta"), [(1, "1e-5"), ("0.5", "1e-9"), (3, "1e-12")])
def test_gaussian_sigma_for_approximate_dp(epsilon, delta) -> None:
    budget = ApproxDP(epsilon, delta)
    sigma = noise_scale("gaussian", 2.0, budget)
    assert sigma == budget.gaussian_sigma(2.0)
    check_calibration("gaussian", 2.0, sigma, budget)  # fits the budget


def test_closed_form_examples() -> None:
    assert noise_scale("laplace", 2.0, PureDP("0.5")) == 4.0
    assert noise_scale("gaussian", 1.0, zCDP("0.5")) == 1.0
    assert round(noise_scale("gaussian", 1.0, ApproxDP(1, 1e-5)), 4) == 3.7306


@pytest.mark.parametrize(
    ("mechanism", "budget", "error", "message"),
    [
        ("gaussian", PureDP(1), ValueError, "pure-DP budget needs Laplace"),
        ("laplace", zCDP(1), ValueError, "zCDP budget needs Gaussian"),
        ("laplace", ApproxDP(1, "1e-9"), ValueError, "ApproxDP budget needs Gaussian"),
        ("discrete_gaussian", zCDP(1), ValueError, "unknown mechanism"),
        ("Laplace", PureDP(1), ValueError, "unknown mechanism"),
        ("laplace", 1.0, TypeError, "budget"),
        ("laplace", PureDP(0), ValueError, "zero epsilon"),
        ("gaussian", zCDP(0), ValueError, "zero rho"),
        ("gaussian", ApproxDP(1, 0), ValueError, "delta > 0"),
    ],
)
def test_noise_scale_refuses(mechanism: str, budget, error, message: str) -> None:
    with pytest.raises(error, match=message):
        noise_scale(mechanism, 1.0, budget)


def test_negative_sensitivity_is_refused() -> None:
    with pytest.raises(ValueError, match="sensitivity"):
        noise_scale("laplace", -1.0, PureDP(1))


@pytest.mark.parametrize("total", [PureDP(1), zCDP("0.5")], ids=repr)
def test_plans_and_level_plans_use_it(total) -> None:
    plan = select(Prefix(16), total, "hierarchical")
    norm = 1 if isinstance(total, PureDP) else 2  # the oracle: Laplace is L1, Gaussian L2
    assert plan.noise_scale == noise_scale(plan.mechanism, plan.sensitivity, total)
    for lv, b in split_levels(total, LEVELS, [1, 2, 3]).items():
        level = plan.at(b)
        sens = float(level.strategy.sensitivity(norm))
        assert level.noise_scale == noise_scale(plan.mechanism, sens, b), lv
        assert level.privacy == b and level.base is plan and plan.privacy == total
