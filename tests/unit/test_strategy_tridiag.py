"""CA for prefix and all-range workloads through the tridiagonal inverse Gram (``_tridiag``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import eigh_tridiagonal

from dpdask import select
from dpdask.linalg import AllRange, Identity, Prefix, Scaled, VStack, from_dict, to_dict
from dpdask.privacy import zCDP
from dpdask.strategy import convex
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._tridiag import (
    SpectralStrategy,
    ca_solve_tridiagonal,
    sqrt_inverse_diag,
    tridiagonal_inverse,
    uses_tridiagonal,
)
from dpdask.strategy.convex import CONVEX_MAX_N


def _tridiagonal(d: np.ndarray, e: np.ndarray) -> np.ndarray:
    return np.diag(d) + np.diag(e, 1) + np.diag(e, -1)


def _dense_error(W: np.ndarray, A: np.ndarray) -> float:
    """``||A||_2^2 ||W A^+||_F^2`` computed from dense matrices."""
    sens = np.sqrt((A * A).sum(axis=0)).max()
    return float(sens**2 * np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2)


@pytest.mark.parametrize("W", [Prefix(9), AllRange(8), Scaled(Prefix(6), 3.0), Prefix(1)])
def test_tridiagonal_inverse_is_the_inverse(W) -> None:
    G = Gram.of(W)
    d, e = tridiagonal_inverse(G)
    np.testing.assert_allclose(_tridiagonal(d, e) @ G.dense(), np.eye(G.n), atol=1e-12)


def test_other_grams_have_no_tridiagonal_inverse() -> None:
    assert tridiagonal_inverse(Gram.of(Identity(5))) is None
    assert tridiagonal_inverse(Gram.of(VStack([Prefix(5), AllRange(5)]))) is None
    assert tridiagonal_inverse(Gram.of(VStack([Prefix(5), Identity(5)]))) is None


@pytest.mark.parametrize("n", [1, 2, 50, 400])
def test_sqrt_inverse_diag(n: int) -> None:
    rng = np.random.default_rng(n)
    e = -rng.random(n - 1)
    d = np.abs(np.concatenate([e, [0.0]])) + np.abs(np.concatenate([[0.0], e]))
    d = d + 10.0 ** rng.uniform(-6, 1, n)  # positive definite, badly conditioned
    mu, V = eigh_tridiagonal(d, e)
    exact = (V * V) @ mu**-0.5
    np.testing.assert_allclose(sqrt_inverse_diag(d, e), exact, rtol=1e-9)


@pytest.mark.parametrize("W", [Prefix(300), AllRange(257)], ids=["prefix", "allrange"])
@pytest.mark.parametrize("tol", [1e-4, 1e-8])
def test_matches_the_dense_solver(W, tol: float) -> None:
    """Certified like the dense CA solver, and with its optimum."""
    G = Gram.of(W)
    A, error, lower, evaluations, converged = ca_solve_tridiagonal(*tridiagonal_inverse(G), tol=tol)
    assert converged and evaluations > 0
    assert error <= lower * (1 + tol)
    dense = convex.ca_solve_gram(G.dense(), tol=1e-9)
    # both lower bounds are bounds of the same optimum, and each error is above both
    assert lower <= dense.error * (1 + 1e-9) and dense.lower_bound <= error * (1 + 1e-9)
    assert error == pytest.approx(dense.lower_bound, rel=tol + 1e-8)
    # the error is the strategy's, computed independently, at L2 sensitivity 1
    assert _dense_error(W.dense(), A.matrix) == pytest.approx(error, rel=1e-9)
    np.testing.assert_allclose(np.sqrt((A.matrix**2).sum(axis=0)).max(), 1.0, rtol=1e-12)


def test_spectral_strategy_inverse_gram_and_serialisation() -> None:
    G = Gram.of(Prefix(40))
    A, error, _, _, _ = ca_solve_tridiagonal(*tridiagonal_inverse(G), tol=1e-6)
    X = inverse_gram(A)
    M = A.matrix
    np.testing.assert_allclose(X.dense(), np.linalg.inv(M.T @ M), rtol=1e-8, atol=1e-10)
    assert X.trace(G) == pytest.approx(error, rel=1e-10)
    back = from_dict(to_dict(A))
    assert isinstance(back, SpectralStrategy)
    np.testing.assert_array_equal(back.matrix, M)
    np.testing.assert_allclose(inverse_gram(back).dense(), X.dense(), rtol=1e-14)


def test_which_problems_use_it() -> None:
    big = CONVEX_MAX_N + 1
    assert uses_tridiagonal(Gram.of(Prefix(big))) and uses_tridiagonal(Gram.of(AllRange(big)))
    assert uses_tridiagonal(Gram.of(Prefix(5))) and uses_tridiagonal(Gram.of(AllRange(1)))
    assert not uses_tridiagonal(Gram.of(Prefix(CONVEX_MAX_N)), CONVEX_MAX_N + 1)
    assert not uses_tridiagonal(Gram.of(VStack([Prefix(big), Identity(big)])))
    # ca_solve keeps its dense solver up to CONVEX_MAX_N
    assert not isinstance(convex.ca_solve(Prefix(40)).strategy, SpectralStrategy)


@pytest.mark.parametrize("W", [Prefix(150), AllRange(97)], ids=["prefix", "allrange"])
def test_gaussian_select_matches_the_dense_solver(W) -> None:
    """Gaussian OPT_0 within CONVEX_MAX_N: certified against the dense solver's optimum."""
    plan = select(W, zCDP("0.5"), restarts=1)  # unit noise variance: error = loss
    assert isinstance(plan.strategy, SpectralStrategy) and plan.info["solver"] == "convex"
    loss = plan.sensitivity**2 * plan.analysis.total()
    dense = convex.ca_solve(W, tol=1e-10)  # the dense Newton solver at this size
    assert dense.lower_bound <= loss <= dense.error * (1 + 2e-4)
    assert loss == pytest.approx(_dense_error(W.dense(), plan.strategy.dense()), rel=1e-8)


@pytest.mark.parametrize("W", [Prefix(2100), AllRange(2049)], ids=["prefix", "allrange"])
def test_gaussian_opt0_beyond_the_dense_solver(W) -> None:
    """select and ca_solve beyond CONVEX_MAX_N: certified within 0.1%, above the SVD bound."""
    plan = select(W, zCDP("0.5"), restarts=1)  # unit noise variance: error = loss
    loss = plan.sensitivity**2 * plan.analysis.total()
    sol = convex.ca_solve(W, tol=1e-6)
    assert sol.converged and sol.error <= sol.lower_bound * (1 + 1e-6)
    assert sol.lower_bound >= plan.svd_bound() * (1 - 1e-9)  # the SVD bound is weaker
    assert sol.lower_bound <= loss <= sol.lower_bound * (1 + 1e-3)
    # the analysis of the plan (through the strategy's inverse Gram) is its error
    M = plan.strategy.dense()
    XtX = M.T @ M
    G = Gram.of(W).dense()
    exact = plan.sensitivity**2 * float(np.trace(np.linalg.solve(XtX, G)))
    assert loss == pytest.approx(exact, rel=1e-8)
