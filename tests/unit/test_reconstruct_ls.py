"""Least squares and tree consistency against dense generalised least squares."""

from __future__ import annotations

import numpy as np
import pytest

from dpdask.errors import ConvergenceWarning
from dpdask.linalg import AllRange, Dense, Identity, Kron, Prefix, Total, VStack
from dpdask.reconstruct import least_squares, tree_consistent
from tests import requires_cvxpy


def _strategies(rng: np.random.Generator):
    yield Kron([Prefix(3), Identity(4)])
    yield Kron([Dense(rng.normal(size=(5, 3))), AllRange(4)])
    yield VStack([Kron([Identity(3), Total(4)]), Kron([Total(3), Identity(4)]), Identity(12)])
    yield VStack([Kron([Identity(3), Prefix(4)]), Kron([Total(3), Identity(4)])], weights=[2, 0.5])


@pytest.mark.parametrize("method", ["auto", "pinv", "cg"])
def test_least_squares_matches_dense_lstsq(method: str, rng: np.random.Generator) -> None:
    for A in _strategies(rng):
        M = A.dense()
        Y = rng.normal(size=(6, A.shape[0]))
        x, report = least_squares(A, Y, method=method)
        expected = np.linalg.lstsq(M, Y.T, rcond=None)[0].T
        np.testing.assert_allclose(x, expected, atol=1e-7)
        assert report.converged
        x1, _ = least_squares(A, Y[0], method=method)
        np.testing.assert_allclose(x1, expected[0], atol=1e-7)


def test_cg_stopped_at_its_limit_warns(rng: np.random.Generator) -> None:
    A = VStack([Kron([Identity(3), Prefix(4)]), Kron([Total(3), Identity(4)])])
    y = rng.normal(size=A.shape[0])
    with pytest.warns(ConvergenceWarning, match="cg stopped at its iteration limit"):
        est = least_squares(A, y, method="cg", maxiter=1)
    assert not est.report.converged and est.report.iterations == 1


def test_exact_measurements_return_the_truth(rng: np.random.Generator) -> None:
    A = VStack([Kron([Identity(3), Total(4)]), Identity(12)])
    x = rng.integers(0, 20, size=12).astype(float)
    np.testing.assert_allclose(least_squares(A, A @ x).x, x, atol=1e-8)


def test_weighted_least_squares(rng: np.random.Generator) -> None:
    A = VStack([Identity(5), Prefix(5), Total(5)])
    M = A.dense()
    w = np.concatenate([np.full(5, 4.0), np.full(5, 0.25), [1.0]])
    y = rng.normal(size=A.shape[0])
    Wh = np.sqrt(w)[:, None]
    expected = np.linalg.lstsq(Wh * M, np.sqrt(w) * y, rcond=None)[0]
    for method in ("cg", "auto"):
        np.testing.assert_allclose(
            least_squares(A, y, weights=w, method=method).x, expected, atol=1e-8
        )
    w2 = rng.uniform(0.5, 2, size=A.shape[0])  # weights varying within parts
    expected2 = np.linalg.lstsq(np.sqrt(w2)[:, None] * M, np.sqrt(w2) * y, rcond=None)[0]
    np.testing.assert_allclose(least_squares(A, y, weights=w2).x, expected2, atol=1e-8)


def test_bad_measurements_raise() -> None:
    A = Identity(3)
    with pytest.raises(ValueError, match="rows"):
        least_squares(A, np.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        least_squares(A, np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="method"):
        least_squares(A, np.ones(3), method="magic")


def _tree():
    # root -> 3 children -> (2, 1, 3) grandchildren
    parents = [np.array([0, 0, 0]), np.array([0, 0, 1, 2, 2, 2])]
    sizes = [1, 3, 6]
    return parents, sizes


def _gls_oracle(estimates, variances, parents):
    """Dense GLS over the leaves: minimise sum_l sum_u (S_l x - y_l)_u^2 / v_u."""
    n_leaf = estimates[-1].shape[0]
    S = [None] * len(estimates)
    S[-1] = np.eye(n_leaf)
    for lvl in range(len(estimates) - 2, -1, -1):
        P = np.zeros((estimates[lvl].shape[0], estimates[lvl + 1].shape[0]))
        P[parents[lvl], np.arange(parents[lvl].size)] = 1
        S[lvl] = P @ S[lvl + 1]
    H = sum(Sl.T @ np.diag(1 / np.asarray(v)) @ Sl for Sl, v in zip(S, variances, strict=True))
    b = sum(
        Sl.T @ (e / np.asarray(v)[:, None])
        for Sl, v, e in zip(S, variances, estimates, strict=True)
    )
    cov = np.linalg.inv(H)
    x = cov @ b
    return [Sl @ x for Sl in S], [np.diag(Sl @ cov @ Sl.T) for Sl in S]


def test_tree_consistency_is_gls(rng: np.random.Generator) -> None:
    parents, sizes = _tree()
    est = [rng.normal(size=(s, 4)) for s in sizes]
    var = [np.array([0.5]), rng.uniform(0.5, 3, size=3), rng.uniform(0.5, 3, size=6)]
    final, fvar = tree_consistent(est, var, parents)
    want, want_var = _gls_oracle(est, var, parents)
    for f, w in zip(final, want, strict=True):
        np.testing.assert_allclose(f, w, atol=1e-10)
    for f, w in zip(fvar, want_var, strict=True):
        np.testing.assert_allclose(f, w, atol=1e-10)
    # children add up to parents exactly
    for lvl in (1, 2):
        sums = np.zeros_like(final[lvl - 1])
        np.add.at(sums, parents[lvl - 1], final[lvl])
        np.testing.assert_allclose(sums, final[lvl - 1], atol=1e-12)


def test_unmeasured_level_is_sum_of_children(rng: np.random.Generator) -> None:
    parents, sizes = _tree()
    est = [rng.normal(size=(s, 2)) for s in sizes]
    final, _ = tree_consistent(est, [1.0, np.inf, 2.0], parents)
    var = [1.0, 1e30, 2.0]
    want, _ = _gls_oracle(est, [np.full(s, v) for s, v in zip(sizes, var, strict=True)], parents)
    for f, w in zip(final, want, strict=True):
        np.testing.assert_allclose(f, w, atol=1e-8)


@requires_cvxpy
def test_project_children_is_the_simplex_projection(rng: np.random.Generator) -> None:
    import cvxpy as cp

    from dpdask.reconstruct.consistency import project_children

    parent = np.array([0, 0, 0, 1, 1, 2])
    children = rng.normal(size=(6, 4))
    totals = np.abs(rng.normal(size=(3, 4)))
    totals[1, 2] = 0.0
    out = project_children(children, parent, totals)
    for p in range(3):
        rows = parent == p
        for j in range(4):
            v = cp.Variable(int(rows.sum()))
            cp.Problem(
                cp.Minimize(cp.sum_squares(v - children[rows, j])),
                [v >= 0, cp.sum(v) == totals[p, j]],
            ).solve()
            np.testing.assert_allclose(out[rows, j], v.value, atol=1e-6)
    assert (out >= 0).all()
    sums = np.zeros_like(totals)
    np.add.at(sums, parent, out)
    np.testing.assert_allclose(sums, totals, atol=1e-12)
