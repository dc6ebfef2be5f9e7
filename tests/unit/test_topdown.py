"""Top-down estimation against independent oracles.

* the children's fit against a generic QP solver (scipy's SLSQP, and Clarabel through
  cvxpy when installed) on the full problem, the parent's zero cells as bounds
  ``0 <= x <= 0``: objectives agree to 1e-6 relative and the answer is feasible;
* exact measurements: the truth, for one parent and for a whole tree;
* controlled rounding: hypothesis properties, and a brute-force search over every
  floor/ceiling choice for the nearest integer columns;
* integer trees add up exactly at every level.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from dpdask.errors import ConvergenceWarning
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.reconstruct.consistency import children_sum
from dpdask.reconstruct.topdown import (
    children_fitter,
    fit_children,
    round_children,
    round_top,
    topdown_tree,
)
from tests import requires_cvxpy

# -- oracles ---------------------------------------------------------------


def _objective(M: np.ndarray, Y: np.ndarray, X: np.ndarray, w: np.ndarray) -> float:
    R = X @ M.T - Y
    return 0.5 * float((w * R * R).sum())


def _slsqp(M: np.ndarray, Y: np.ndarray, p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """SLSQP on every cell of every child; the parent's zero cells bounded to zero."""
    K, n = Y.shape[0], M.shape[1]

    def f(z: np.ndarray) -> tuple[float, np.ndarray]:
        R = z.reshape(K, n) @ M.T - Y
        return 0.5 * float((w * R * R).sum()), ((w * R) @ M).ravel()

    cons = {
        "type": "eq",
        "fun": lambda z: z.reshape(K, n).sum(axis=0) - p,
        "jac": lambda z: np.tile(np.eye(n), (1, K)),
    }
    bounds = [(0.0, 0.0 if p[j] == 0 else None) for _ in range(K) for j in range(n)]
    res = minimize(
        f, np.tile(p / K, K), jac=True, method="SLSQP", bounds=bounds, constraints=[cons],
        options={"ftol": 1e-15, "maxiter": 5000},
    )  # fmt: skip
    return res.x.reshape(K, n)


def _cvxpy(M: np.ndarray, Y: np.ndarray, p: np.ndarray, w: np.ndarray) -> np.ndarray:
    import cvxpy as cp

    K, n = Y.shape[0], M.shape[1]
    X = cp.Variable((K, n), nonneg=True)
    cons = [cp.sum(X, axis=0) == p]
    if (p == 0).any():
        cons.append(X[:, np.flatnonzero(p == 0)] == 0)
    resid = cp.multiply(np.sqrt(w)[None, :], X @ M.T - Y)
    cp.Problem(cp.Minimize(0.5 * cp.sum_squares(resid)), cons).solve(solver=cp.CLARABEL)
    return np.asarray(X.value)


ORACLES = {"slsqp": _slsqp, "cvxpy": _cvxpy}
ORACLE_PARAMS = ["slsqp", pytest.param("cvxpy", marks=requires_cvxpy)]


def _assert_feasible(X: np.ndarray, p: np.ndarray) -> None:
    assert (X >= 0).all()
    assert (X[:, p == 0] == 0).all()
    np.testing.assert_array_less(np.abs(X.sum(axis=0) - p), 1e-9 * np.maximum(p, 1.0) + 1e-300)


def _matrix(kind: str, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "full-rank":
        return rng.uniform(size=(m, n))
    if kind == "rank-deficient":  # rank n - 2
        return rng.uniform(size=(m, n - 2)) @ rng.uniform(size=(n - 2, n))
    return rng.normal(size=(m, n))  # signed: the power iteration from ones is not Perron


def _problem(K: int, n: int, M: np.ndarray, rng: np.random.Generator):
    """Children with some empty cells, noisy measurements, and a parent (not the
    children's sum: a final estimate from above) with two zero cells."""
    X = rng.poisson(3.0, size=(K, n)) * (rng.uniform(size=(K, n)) < 0.7)
    Y = X @ M.T + rng.normal(scale=2.0, size=(K, M.shape[0]))
    p = X.sum(axis=0) + rng.integers(-2, 3, size=n)
    p = np.maximum(p, 0).astype(float)
    p[rng.choice(n, size=2, replace=False)] = 0.0
    return Y, p


# -- the children's fit ----------------------------------------------------


@pytest.mark.parametrize("oracle", ORACLE_PARAMS)
@pytest.mark.parametrize("kind", ["full-rank", "rank-deficient", "signed"])
@pytest.mark.parametrize(("K", "n"), [(2, 6), (3, 9), (4, 12)])
def test_matches_qp_oracle(
    K: int, n: int, kind: str, oracle: str, rng: np.random.Generator
) -> None:
    M = _matrix(kind, n + 4, n, rng)
    Y, p = _problem(K, n, M, rng)
    w = np.ones(M.shape[0])
    X, report = fit_children(Dense(M), Y, p, tol=1e-10)
    assert report.converged
    _assert_feasible(X, p)
    ref = ORACLES[oracle](M, Y, p, w)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, ref, w)
    assert abs(f - f_ref) <= 1e-6 * f_ref
    # the reported objective and duality gap are those of the answer
    assert report.details["objective"] == pytest.approx(f, rel=1e-9)
    assert 0 <= report.details["gap"] <= 1e-6 * f


def _kkt_gap(M: np.ndarray, Y: np.ndarray, X: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    """The Frank-Wolfe duality gap of a feasible ``X``, from the problem's data alone:
    ``<grad, X> - sum_j p_j min_c grad_cj >= f(X) - f*`` (zero exactly at a minimiser)."""
    grad = (w * (X @ M.T - Y)) @ M
    S = p > 0
    return float((grad[:, S] * X[:, S]).sum() - (p[S] * grad[:, S].min(axis=0)).sum())


@pytest.mark.parametrize("oracle", ORACLE_PARAMS)
@pytest.mark.parametrize("kind", ["full-rank", "rank-deficient", "signed"])
@pytest.mark.parametrize(("K", "n"), [(2, 6), (3, 9), (5, 12)])
@pytest.mark.parametrize("gram", ["dense", "full"])
def test_newton_matches_qp_oracle(
    gram: str, K: int, n: int, kind: str, oracle: str, rng: np.random.Generator
) -> None:
    """The projected Newton method (whatever the Gram's form) against the QP oracles."""
    M = _matrix(kind, n + 4, n, rng)
    Y, p = _problem(K, n, M, rng)
    w = rng.uniform(0.5, 2.0, size=M.shape[0])
    X, report = fit_children(Dense(M), Y, p, weights=w, tol=1e-10, gram=gram, method="newton")
    assert report.method == "topdown-newton"
    assert report.converged
    _assert_feasible(X, p)
    ref = ORACLES[oracle](M, Y, p, w)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, ref, w)
    assert abs(f - f_ref) <= 1e-6 * f_ref
    # the certificate, computed here from the data: f(X) - f* <= gap, gap tiny
    assert 0 <= _kkt_gap(M, Y, X, p, w) <= 1e-6 * f
    assert report.details["objective"] == pytest.approx(f, rel=1e-9)


def test_newton_stall_hands_over_to_fista(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """A stalled Newton fit (forced: no progress is ever enough) is finished by FISTA
    from its iterate, to the oracle's objective."""
    import dpdask.reconstruct.topdown._newton as newton

    monkeypatch.setattr(newton, "_STALL", 2)
    monkeypatch.setattr(newton, "_STALL_RATIO", 0.0)
    M = _matrix("full-rank", 16, 12, rng)
    Y, p = _problem(4, 12, M, rng)
    w = np.ones(M.shape[0])
    X, report = fit_children(Dense(M), Y, p, tol=1e-10, gram="full", method="newton")
    assert report.details["switched"] and report.converged
    _assert_feasible(X, p)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, _slsqp(M, Y, p, w), w)
    assert abs(f - f_ref) <= 1e-6 * f_ref


@pytest.mark.parametrize("structure", ["kron", "union"])
def test_newton_sparse_families_match_clarabel(structure: str, rng: np.random.Generator) -> None:
    """Ten sparse children on a 60-cell Kronecker (or union) strategy, most cells with
    one or two non-zero children (the free sets of the Newton method then differ from
    child to child): the objective agrees with a generic QP to 1e-6 relative."""
    pytest.importorskip("cvxpy")
    if structure == "kron":
        A: LinearQuery = Kron([Prefix(4), Identity(5), Dense(rng.uniform(size=(4, 3)))])
    else:
        A = VStack(
            [
                Kron([Identity(12), Total(5)]),
                Kron([Total(12), Prefix(5)]),
                Kron([Identity(12), Identity(5)]),
            ]
        )
    M = A.dense()
    K, n = 10, M.shape[1]
    X0 = rng.poisson(2.0, size=(K, n)) * (rng.uniform(size=(K, n)) < 0.15)
    Y = X0 @ M.T + rng.normal(scale=1.5, size=(K, M.shape[0]))
    p = X0.sum(axis=0).astype(float)
    w = np.ones(M.shape[0])
    fits = {
        method: fit_children(A, Y, p, tol=1e-9, gram="kron", method=method)
        for method in ("newton", "fista")
    }
    ref = _cvxpy(M, Y, p, w)
    f_ref = _objective(M, Y, ref, w)
    for X, report in fits.values():
        assert report.converged
        _assert_feasible(X, p)
        f = _objective(M, Y, X, w)
        assert abs(f - f_ref) <= 1e-6 * f_ref
        assert _kkt_gap(M, Y, X, p, w) <= 1e-6 * f
    assert fits["newton"].report.details["gram"] == structure


@pytest.mark.parametrize("start", ["estimates", "admm", "simple"])
@pytest.mark.parametrize("method", ["newton", "fista"])
def test_from_estimates_every_start(start: str, method: str, rng: np.random.Generator) -> None:
    """From the children's least-squares estimates, whatever the start: the
    same minimiser as from the measurements, checked against Clarabel."""
    pytest.importorskip("cvxpy")
    A = Kron([Prefix(4), Identity(3), Dense(rng.uniform(size=(5, 4)))])  # full column rank
    M = A.dense()
    K, n = 6, M.shape[1]
    X0 = rng.poisson(2.0, size=(K, n)) * (rng.uniform(size=(K, n)) < 0.3)
    Y = X0 @ M.T + rng.normal(scale=1.5, size=(K, M.shape[0]))
    w = np.ones(M.shape[0])
    p = X0.sum(axis=0).astype(float)
    Z = np.linalg.lstsq(M, Y.T, rcond=None)[0].T
    fit = children_fitter(A, tol=1e-9, gram="kron", method=method, start=start)
    X, report = fit.from_estimates(Z, p)
    used = {"estimates": "estimates", "admm": "admm" if method == "newton" else "simple"}
    assert report.details["start"] in (
        [used[start]] if used.get(start, "simple") != "simple" else ["even", "jacobi"]
    )
    assert report.converged
    _assert_feasible(X, p)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, _cvxpy(M, Y, p, w), w)
    assert abs(f - f_ref) <= 1e-6 * f_ref
    assert _kkt_gap(M, Y, X, p, w) <= 1e-6 * f


@pytest.mark.parametrize("method", ["newton", "fista"])
@pytest.mark.parametrize("gram", ["dense", "kron", "full"])
def test_methods_exact_measurements(method: str, gram: str, rng: np.random.Generator) -> None:
    """Noise off: either method returns the truth, exactly feasible."""
    A = Kron([Prefix(3), Identity(2), Dense(rng.uniform(size=(6, 4)))])  # full column rank
    M = A.dense()
    X = (rng.poisson(3.0, size=(6, 24)) * (rng.uniform(size=(6, 24)) < 0.4)).astype(float)
    X[:, [1, 9, 20]] = 0.0
    p = X.sum(axis=0)
    est = fit_children(A, X @ M.T, p, tol=1e-10, gram=gram, method=method)
    assert est.report.converged
    _assert_feasible(est.x, p)
    np.testing.assert_allclose(est.x, X, rtol=0, atol=1e-6 * X.max())


@pytest.mark.parametrize("gram", ["dense", "kron", "full"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("structure", ["kron", "union"])
def test_gram_paths_match_oracle(
    structure: str, weighted: bool, gram: str, rng: np.random.Generator
) -> None:
    if structure == "kron":
        A: LinearQuery = Kron([Prefix(3), Dense(rng.uniform(size=(5, 4)))])
    else:
        A = VStack([Kron([Identity(3), Total(4)]), Kron([Total(3), Prefix(4)]), Identity(12)])
    M = A.dense()
    w = rng.uniform(0.2, 2.0, size=M.shape[0]) if weighted else np.ones(M.shape[0])
    Y, p = _problem(3, 12, M, rng)
    X, report = fit_children(A, Y, p, weights=w if weighted else None, tol=1e-10, gram=gram)
    # a weighted or union strategy is not a Kronecker product: "kron" falls back to "full"
    kron_ok = structure == "kron" and not weighted
    assert report.details["gram"] == ("full" if gram == "kron" and not kron_ok else gram)
    assert report.converged
    _assert_feasible(X, p)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, _slsqp(M, Y, p, w), w)
    assert abs(f - f_ref) <= 1e-6 * f_ref


@pytest.mark.parametrize("gram", ["dense", "kron", "full"])
def test_exact_measurements_return_the_truth(gram: str, rng: np.random.Generator) -> None:
    A = Kron([Prefix(3), Dense(rng.uniform(size=(6, 4)))])  # full column rank
    M = A.dense()
    X = rng.poisson(4.0, size=(4, 12)) * (rng.uniform(size=(4, 12)) < 0.6)
    X[:, [2, 7]] = 0  # cells empty in the parent
    X = X.astype(float)
    est = fit_children(A, X @ M.T, X.sum(axis=0), tol=1e-10, gram=gram)
    assert est.report.converged
    np.testing.assert_allclose(est.x, X, rtol=0, atol=1e-6 * X.max())
    assert est.report.details["support"] == 10


def test_support_only(rng: np.random.Generator) -> None:
    """Only the parent's support is solved: zeros stay zeros, the problem shrinks."""
    A = VStack([Identity(10), Prefix(10), Total(10)])
    M = A.dense()
    p = np.array([5.0, 0, 3, 0, 0, 8, 1, 0, 2, 0])
    Y = rng.poisson(2.0, size=(3, M.shape[0])).astype(float)
    X, report = fit_children(A, Y, p, tol=1e-10)
    _assert_feasible(X, p)
    assert report.details["support"] == 5
    assert report.details["variables"] == 3 * 5
    assert report.details["cells"] == 10
    # the same as the fit of the strategy restricted to the support's columns
    S = np.flatnonzero(p)
    X_S, _ = fit_children(Dense(M[:, S]), Y, p[S], tol=1e-10)
    np.testing.assert_allclose(X[:, S], X_S, atol=1e-7)


def test_one_child_is_the_parent(rng: np.random.Generator) -> None:
    A = VStack([Identity(6), Total(6)])
    p = np.array([1.5, 0.0, 2.0, 7.0, 0.0, 3.25])
    X, report = fit_children(A, rng.normal(size=(1, 7)), p)
    np.testing.assert_array_equal(X, p[None, :])
    assert report.iterations == 0 and report.converged


def test_fitter_reuses_the_level(rng: np.random.Generator) -> None:
    A = Kron([Prefix(3), Identity(4)])
    M = A.dense()
    fit = children_fitter(A, tol=1e-10)
    for K in (2, 5):
        Y, p = _problem(K, 12, M, rng)
        np.testing.assert_allclose(fit(Y, p).x, fit_children(A, Y, p, tol=1e-10).x, atol=1e-9)


def test_iteration_limit_warns(rng: np.random.Generator) -> None:
    M = _matrix("full-rank", 12, 8, rng)
    Y, p = _problem(3, 8, M, rng)
    with pytest.warns(ConvergenceWarning):
        X, report = fit_children(Dense(M), Y, p, tol=1e-14, maxiter=2)
    assert not report.converged and report.iterations == 2
    _assert_feasible(X, p)  # feasible even when stopped early


@pytest.mark.parametrize(
    ("Y", "parent", "match"),
    [
        (np.zeros((2, 4)), np.array([1.0, -1.0, 0.0]), "non-negative"),
        (np.zeros((2, 4)), np.array([1.0, 1.0]), "shape"),
        (np.zeros((2, 5)), np.array([1.0, 1.0, 1.0]), "shape"),
        (np.full((2, 4), np.nan), np.array([1.0, 1.0, 1.0]), "NaN"),
    ],
)
def test_rejects_bad_inputs(Y: np.ndarray, parent: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_children(VStack([Identity(3), Total(3)]), Y, parent)


# -- rounding --------------------------------------------------------------


@st.composite
def _fractional_children(draw):
    K = draw(st.integers(1, 5))
    n = draw(st.integers(1, 6))
    p = np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.int64)
    share = st.floats(0.0, 1.0, allow_nan=False)
    w = np.array(draw(st.lists(share, min_size=K * n, max_size=K * n))).reshape(K, n)
    tot = w.sum(axis=0)
    w = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 1.0 / K)
    return w * p, p


@settings(max_examples=200, deadline=None)
@given(_fractional_children())
def test_round_children_properties(case) -> None:
    X, p = case
    R = round_children(X, p)
    assert R.dtype == np.int64 and R.shape == X.shape
    np.testing.assert_array_equal(R.sum(axis=0), p)
    assert (R >= 0).all()
    assert (np.abs(R - X) < 1).all()
    # the nearest such columns: brute force over every floor/ceiling choice
    F = np.floor(X)
    best = np.zeros(X.shape[1])
    for j in range(X.shape[1]):
        dists = [
            np.abs(F[:, j] + c - X[:, j]).sum()
            for c in itertools.product((0, 1), repeat=X.shape[0])
            if F[:, j].sum() + sum(c) == p[j]
        ]
        best[j] = min(dists)
    np.testing.assert_allclose(np.abs(R - X).sum(axis=0), best, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(_fractional_children())
def test_round_children_keeping_totals_is_the_nearest_such_table(case) -> None:
    """Brute force over every floor/ceiling table (K n <= 12 entries): the rounding
    keeps every column and every child's total, and no such table is nearer."""
    X, p = case
    if X.size > 12:
        X, p = X[:, :2], p[:2]
    R = round_children(X, p, keep_totals=True)
    F, rho = np.floor(X), X.sum(axis=1)
    np.testing.assert_array_equal(R.sum(axis=0), p)
    assert (np.abs(R - X) < 1).all()
    assert (np.abs(R.sum(axis=1) - rho) < 1 + 1e-9).all()
    best = np.inf
    for c in itertools.product((0, 1), repeat=X.size):
        T = F + np.reshape(c, X.shape)
        if (T.sum(axis=0) == p).all() and (np.abs(T.sum(axis=1) - rho) < 1 + 1e-9).all():
            best = min(best, float(np.abs(T - X).sum()))
    assert np.isfinite(best)  # Bacharach: such a table always exists
    assert float(np.abs(R - X).sum()) <= best + 1e-9


def test_round_children_keeping_totals_fixes_the_largest_remainders_drift() -> None:
    """Thin fractional mass: child 0 has 0.3 of every cell, child 1 the other 0.7; the
    largest remainders give child 1 everything (a drift of 3 in child 0's total)."""
    X = np.vstack([np.full(10, 0.3), np.full(10, 0.7)])
    p = np.ones(10, dtype=np.int64)
    np.testing.assert_array_equal(round_children(X, p).sum(axis=1), [0, 10])
    R = round_children(X, p, keep_totals=True)
    np.testing.assert_array_equal(R.sum(axis=0), p)
    assert R.sum(axis=1).tolist() == [3, 7]


def test_round_children_example() -> None:
    X = np.array([[0.6, 2.5, 0.0, 1 / 3], [0.3, 0.25, 1.0, 1 / 3], [0.1, 0.25, 0.0, 1 / 3]])
    R = round_children(X, np.array([1, 3, 1, 1.0]))
    # thirds tie: the first child gets the unit; naive rounding would give 0 + 0 + 0
    np.testing.assert_array_equal(R, [[1, 3, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("X", "p", "match"),
    [
        (np.array([[0.5, 1.0], [0.5, 1.0]]), np.array([1, 3]), "sum"),
        (np.array([[0.5, 1.0], [0.5, 1.0]]), np.array([1.0, 2.5]), "integers"),
        (np.array([[-0.5, 1.0], [1.5, 1.0]]), np.array([1, 2]), "non-negative"),
        (np.array([[0.5, 1.0], [0.5, 1.0]]), np.array([1, 2, 0]), "shape"),
    ],
)
def test_round_children_rejects(X: np.ndarray, p: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        round_children(X, p)


def test_round_top() -> None:
    """Each unit's total (10.7 -> 11) is kept by the largest remainders: floors 0, 0, 0,
    0, 2, 7 sum to 9, and the two units go to the largest fractions, 0.51 and 0.5."""
    x = np.array([[-3.0, -0.4, 0.49, 0.51, 2.5, 7.2], [0.2, 0.2, 0.2, 0.2, 0.2, 0.0]])
    r = round_top(x)
    assert r.dtype == np.int64
    np.testing.assert_array_equal(r, [[0, 0, 0, 1, 3, 7], [1, 0, 0, 0, 0, 0]])
    assert (np.abs(r - np.maximum(x, 0)) < 1).all() and (r >= 0).all()
    np.testing.assert_array_equal(r.sum(axis=1), np.rint(np.maximum(x, 0).sum(axis=1)))


@given(st.lists(st.floats(-5, 50, allow_nan=False), min_size=1, max_size=40))
def test_round_top_keeps_the_total_within_one_per_cell(values: list[float]) -> None:
    x = np.array(values)
    r = round_top(x)
    pos = np.maximum(x, 0)
    assert (r >= 0).all() and (np.abs(r - pos) < 1).all()
    assert r.sum() == np.rint(pos.sum())


# -- the tree --------------------------------------------------------------


def _tree(rng: np.random.Generator):
    """2 states > 5 counties > 14 tracts on 12 cells, a strategy per level, truth."""
    strategies = [
        VStack([Kron([Identity(3), Identity(4)]), Kron([Total(3), Prefix(4)])]),
        Kron([Prefix(3), Identity(4)]),
        VStack([Identity(12), Kron([Total(3), Total(4)])]),
    ]
    parents = [np.array([0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 2, 0])]
    tracts = rng.poisson(2.0, size=(14, 12)) * (rng.uniform(size=(14, 12)) < 0.6)
    tracts[:, 5] = 0  # a cell empty everywhere
    counties = children_sum(tracts, parents[1], 5)
    states = children_sum(counties, parents[0], 2)
    return strategies, parents, [states, counties, tracts]


def _measure(strategies, truth, rng, scale):
    return [A.apply(x) + rng.normal(scale=scale, size=(x.shape[0], A.shape[0])) if scale
            else A.apply(x) for A, x in zip(strategies, truth, strict=True)]  # fmt: skip


@pytest.mark.parametrize("integer", [False, True])
def test_tree_exact_measurements_return_the_truth(integer: bool, rng) -> None:
    strategies, parents, truth = _tree(rng)
    levels = topdown_tree(
        strategies, _measure(strategies, truth, rng, 0), parents, integer=integer, tol=1e-10
    )
    for est, x in zip(levels, truth, strict=True):
        assert est.report.converged
        if integer:
            np.testing.assert_array_equal(est.x, x)
        else:
            np.testing.assert_allclose(est.x, x, rtol=0, atol=1e-6 * x.max())


def test_tree_integer_adds_up(rng: np.random.Generator) -> None:
    strategies, parents, truth = _tree(rng)
    Ys = _measure(strategies, truth, rng, 3.0)
    weights = [None, 0.5, np.full(strategies[2].shape[0], 2.0)]
    levels = topdown_tree(strategies, Ys, parents, weights=weights, integer=True, tol=1e-8)
    for lvl, est in enumerate(levels):
        assert est.x.dtype == np.int64 and (est.x >= 0).all()
        assert est.report.converged
        if lvl:
            up = levels[lvl - 1].x
            sums = children_sum(est.x, parents[lvl - 1], up.shape[0])
            np.testing.assert_array_equal(sums, up)
    # each parent's integer children are within one of their fractional fit
    tracts, counties = levels[2].x, levels[1].x
    for c in range(5):
        ch = np.flatnonzero(parents[1] == c)
        frac = fit_children(strategies[2], Ys[2][ch], counties[c], weights=2.0, tol=1e-8).x
        assert (np.abs(tracts[ch] - frac) < 1).all()
    assert levels[2].report.details["parents"] == 5


def test_tree_fractional_adds_up(rng: np.random.Generator) -> None:
    strategies, parents, truth = _tree(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        levels = topdown_tree(strategies, _measure(strategies, truth, rng, 3.0), parents)
    for lvl in (1, 2):
        up = levels[lvl - 1].x
        sums = children_sum(levels[lvl].x, parents[lvl - 1], up.shape[0])
        np.testing.assert_allclose(sums, up, rtol=1e-9, atol=1e-12)
        assert (levels[lvl].x >= 0).all()
        assert (levels[lvl].x[up[parents[lvl - 1]] == 0] == 0).all()


def test_tree_rejects_bad_parents(rng: np.random.Generator) -> None:
    strategies, parents, truth = _tree(rng)
    Ys = _measure(strategies, truth, rng, 0)
    with pytest.raises(ValueError, match="parent indices"):
        topdown_tree(strategies, Ys, [parents[0], parents[1] + 3])
    with pytest.raises(ValueError, match="L - 1"):
        topdown_tree(strategies, Ys, parents[:1])
