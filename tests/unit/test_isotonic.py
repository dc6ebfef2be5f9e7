"""Isotonic regression (pool adjacent violators) against independent oracles.

Oracles: the min-max formula of the weighted isotonic fit,
``x_i = max_{j <= i} min_{k >= i} mean_w(y[j..k])`` (evaluated by brute force), and
the quadratic program solved by cvxpy.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpdask.reconstruct import isotonic
from tests import requires_cvxpy

# the function shadows its module's name on the package: fetch the module itself
iso_module = importlib.import_module("dpdask.reconstruct.isotonic")


def _minmax_oracle(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The increasing fit by the min-max formula (cubic time, no pooling involved)."""
    m = y.size
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cy = np.concatenate([[0.0], np.cumsum(w * y)])
    out = np.empty(m)
    for i in range(m):
        best = -np.inf
        for j in range(i + 1):
            k = np.arange(i, m)
            means = (cy[k + 1] - cy[j]) / (cw[k + 1] - cw[j])
            best = max(best, means.min())
        out[i] = best
    return out


@pytest.mark.parametrize("increasing", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_minmax_formula(increasing: bool, weighted: bool, rng: np.random.Generator) -> None:
    for _ in range(30):
        m = int(rng.integers(1, 25))
        y = rng.normal(size=m).cumsum() * rng.choice([-1.0, 1.0]) + rng.normal(size=m)
        w = rng.uniform(0.1, 5.0, size=m) if weighted else np.ones(m)
        x = isotonic(y, increasing=increasing, weights=w if weighted else None).x
        sign = 1.0 if increasing else -1.0
        np.testing.assert_allclose(x, sign * _minmax_oracle(sign * y, w), atol=1e-10)


@requires_cvxpy
def test_matches_quadratic_program(rng: np.random.Generator) -> None:
    import cvxpy as cp

    y = np.cumsum(rng.uniform(0, 2, size=40)) + rng.laplace(scale=3.0, size=40)
    w = rng.uniform(0.5, 2.0, size=40)
    x = cp.Variable(40)
    cp.Problem(cp.Minimize(cp.sum(cp.multiply(w, (x - y) ** 2))), [cp.diff(x) >= 0]).solve(
        solver="CLARABEL"
    )
    np.testing.assert_allclose(isotonic(y, weights=w).x, x.value, atol=1e-6)


def test_batch_rows_are_independent(rng: np.random.Generator) -> None:
    Y = rng.normal(size=(7, 30)).cumsum(axis=1) + rng.normal(scale=2.0, size=(7, 30))
    w = rng.uniform(0.5, 2.0, size=30)  # shared by every row
    est = isotonic(Y, weights=w)
    assert est.x.shape == Y.shape
    for row, fitted in zip(Y, est.x, strict=True):
        np.testing.assert_allclose(fitted, isotonic(row, weights=w).x, atol=1e-12)
    # a block never crosses into the next row: the last row alone decides its values
    Y2 = np.array([[5.0, 6.0, 7.0], [0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(isotonic(Y2).x, Y2)


def test_long_cascade_uses_the_sequential_finish() -> None:
    # one huge drop at the end pools everything, one block per pass
    y = np.concatenate([np.arange(200.0), [-1e6]])
    est = isotonic(y)
    assert est.report.details["sequential_finish"]
    np.testing.assert_allclose(est.x, np.full(201, y.mean()))
    w = np.linspace(1.0, 3.0, 201)
    np.testing.assert_allclose(isotonic(y, weights=w).x, _minmax_oracle(y, w), atol=1e-9)


def test_few_passes_on_noisy_prefix_sums(rng: np.random.Generator) -> None:
    counts = rng.poisson(3.0, size=(50, 500))
    noisy = np.cumsum(counts, axis=1) + rng.laplace(scale=5.0, size=counts.shape)
    est = isotonic(noisy)
    assert est.report.iterations <= iso_module._MAX_PASSES
    assert (np.diff(est.x, axis=1) >= -1e-9).all()
    # the fit is at least as close to the data as the truth is, and preserves each row's mean
    assert ((est.x - noisy) ** 2).sum() <= ((np.cumsum(counts, axis=1) - noisy) ** 2).sum()
    np.testing.assert_allclose(est.x.mean(axis=1), noisy.mean(axis=1), rtol=1e-10)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e3, 1e3)))
def test_properties(y: np.ndarray) -> None:
    x = isotonic(y).x
    assert (np.diff(x) >= -1e-9 * (1 + np.abs(x[1:]))).all()  # monotone
    np.testing.assert_allclose(isotonic(x).x, x, atol=1e-9)  # idempotent
    # pooled blocks keep their sums
    np.testing.assert_allclose(x.sum(), y.sum(), atol=1e-7 * (1 + np.abs(y).sum()))
    np.testing.assert_allclose(isotonic(y, increasing=False).x, -isotonic(-y).x, atol=1e-12)


def test_monotone_input_is_returned_unchanged() -> None:
    y = np.array([-2.0, 0.0, 0.0, 3.5, 10.0])
    est = isotonic(y)
    np.testing.assert_array_equal(est.x, y)
    assert est.report.iterations == 0 and est.report.converged


@pytest.mark.parametrize(
    ("y", "weights", "match"),
    [
        (np.array([1.0, np.nan]), None, "NaN"),
        (np.array([1.0, 2.0]), np.array([1.0, 0.0]), "positive"),
        (np.array([1.0, 2.0]), np.array([1.0, 2.0, 3.0]), "shape"),
        (np.ones((2, 2, 2)), None, "shape"),
        (np.array([]), None, "shape"),
    ],
)
def test_bad_input_raises(y: np.ndarray, weights: np.ndarray | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        isotonic(y, weights=weights)
