"""The levels below's estimates of a unit's total, and the fit that uses them.

Oracles: the dense variance ``1^T (A^T W A)^-1 1``; a dense weighted least-squares
solve of a subtree's totals; cvxpy (Clarabel) on the fit with extra rows; bottom-up
least squares over the whole tree (a dense solve), which the top unit's total of the
multi-pass fit equals when no bound is active and the levels' noise is proportional.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask.linalg import Identity, Total, VStack
from dpdask.reconstruct.topdown import Constraints, Pass, fit_constrained_children, passes_tree
from dpdask.reconstruct.topdown._subtree import known_totals, subtree_sums, total_estimator


@pytest.mark.parametrize("seed", range(4))
def test_total_estimator_is_unbiased_with_its_dense_variance(seed):
    rng = np.random.default_rng(seed)
    n = 5
    A = np.vstack([np.ones(n), np.eye(n), rng.integers(0, 2, (3, n))]).astype(float)
    w = rng.uniform(0.2, 3.0, A.shape[0])
    p, s = total_estimator(A, w)
    np.testing.assert_allclose(A.T @ p, np.ones(n), atol=1e-10)  # E[y @ p] = 1^T x
    G = A.T @ (w[:, None] * A)
    np.testing.assert_allclose(s, np.ones(n) @ np.linalg.solve(G, np.ones(n)), rtol=1e-10)
    np.testing.assert_allclose(s, p @ (p / w), rtol=1e-10)  # Var(y @ p) = p^T W^-1 p


def test_no_estimate_when_the_strategy_cannot_see_the_total():
    A = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    assert total_estimator(A, np.ones(2)) is None


def test_known_totals_from_invariants_and_fixed_cells():
    n = 3
    upper = np.array([[0.0] * n, [np.inf] * n, [np.inf] * n])
    c = Constraints(np.zeros((3, n)), upper, np.ones((1, n)),
                    np.array([[0.0], [7.0], [0.0]]), np.array([[np.inf], [7.0], [np.inf]]),
                    ("a", "b", "c"), ("total",))  # fmt: skip
    known, value = known_totals(c)
    assert known.tolist() == [True, True, False]
    assert value[:2].tolist() == [0.0, 7.0]


@pytest.mark.parametrize("seed", range(5))
def test_subtree_sums_are_the_dense_best_linear_estimates(seed):
    """Three levels (1 > 3 > 3 x k): the root's ``S`` is the sum of the middle units'
    best linear unbiased totals from their own and their leaves' estimates."""
    rng = np.random.default_rng(seed)
    k = rng.integers(1, 4, 3)
    p1 = np.repeat(np.arange(3), k)
    leaves = (rng.normal(5, 2, k.sum()), rng.uniform(0.5, 3, k.sum()))
    mids = (rng.normal(10, 3, 3), rng.uniform(0.5, 3, 3))
    (S0, V0), (S1, V1) = subtree_sums([mids, leaves], [np.zeros(3, int), p1], [1, 3, k.sum()])
    np.testing.assert_allclose(S1, np.bincount(p1, leaves[0]))
    np.testing.assert_allclose(V1, np.bincount(p1, leaves[1]))
    best, var = [], []
    for j in range(3):  # unknowns: mid j's leaves' totals; rows: each leaf, and the mid
        kids = np.flatnonzero(p1 == j)
        M = np.vstack([np.eye(kids.size), np.ones(kids.size)])
        sd = np.sqrt(np.r_[leaves[1][kids], mids[1][j]])
        M, y = M / sd[:, None], np.r_[leaves[0][kids], mids[0][j]] / sd
        t = np.linalg.lstsq(M, y, rcond=None)[0]
        best.append(t.sum())
        var.append(np.ones(kids.size) @ np.linalg.inv(M.T @ M) @ np.ones(kids.size))
    np.testing.assert_allclose(S0, [sum(best)], rtol=1e-10)
    np.testing.assert_allclose(V0, [sum(var)], rtol=1e-10)


def test_a_known_child_total_enters_exactly():
    (S, V), = subtree_sums([(np.array([3.0, 4.0]), np.array([0.0, 2.0]))],
                           [np.array([0, 0])], [1, 2])  # fmt: skip
    assert S.tolist() == [7.0] and V.tolist() == [2.0]


cp = pytest.importorskip("cvxpy")


@pytest.mark.parametrize("seed", range(6))
def test_extra_rows_match_a_generic_qp(seed):
    rng = np.random.default_rng(seed)
    K, n = int(rng.integers(2, 5)), int(rng.integers(3, 7))
    truth = rng.poisson(rng.gamma(0.6, 3.0, (K, n))).astype(float)
    A = np.vstack([np.ones(n), np.eye(n)])
    w = np.r_[0.5, np.full(n, 0.2)]
    Y = truth @ A.T + rng.normal(size=(K, n + 1)) / np.sqrt(w)
    E = np.ones((1, n))
    v = truth.sum(axis=1, keepdims=True) + rng.normal(size=(K, 1))
    u = rng.uniform(0.0, 2.0, (K, 1))
    parent = truth.sum(axis=0)
    est = fit_constrained_children(A, Y, parent, weights=w, extra=(E, v, u))
    X = cp.Variable((K, n))
    obj = 0.5 * cp.sum_squares(cp.multiply(np.sqrt(w)[None, :], X @ A.T - Y))
    obj += 0.5 * cp.sum_squares(cp.multiply(np.sqrt(u), X @ E.T - v))
    prob = cp.Problem(cp.Minimize(obj), [X >= 0, cp.sum(X, axis=0) == parent])
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    got = est.report.details["objective"]
    assert abs(got - prob.value) <= 1e-6 * max(1.0, prob.value)
    np.testing.assert_allclose(est.x.sum(axis=1), X.value.sum(axis=1), atol=1e-4)


def _passes(n):
    return [Pass(np.ones((1, n)), None, 0.0, "total", below=True),
            Pass(np.eye(n), None, 0.0, "detail")]  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_top_total_is_bottom_up_least_squares_when_no_bound_is_active(seed):
    """Large counts (no bound active), each level's noise a multiple of one covariance:
    the best linear unbiased total of the top unit from every level is the bottom-up
    least-squares one, and the multi-pass fit's top total is it."""
    rng = np.random.default_rng(seed)
    n, k1, k2 = 4, 3, 2
    leaves = rng.uniform(300, 600, (k1 * k2, n))
    p1 = np.repeat(np.arange(k1), k2)
    mids = np.add.reduceat(leaves, np.arange(0, k1 * k2, k2))
    root = mids.sum(axis=0, keepdims=True)
    A = VStack([Total(n), Identity(n)]).dense()
    base = np.r_[2.0, np.full(n, 0.5)]
    ws = [0.3 * base, 0.5 * base, 2.0 * base]
    lv = [root, mids, leaves]
    Ys = [
        x @ A.T + rng.normal(size=(x.shape[0], n + 1)) / np.sqrt(w)
        for x, w in zip(lv, ws, strict=True)
    ]
    out = passes_tree([A] * 3, Ys, [np.zeros(k1, int), p1], weights=ws, passes=[_passes(n)] * 3)
    H1 = np.kron(np.repeat(np.eye(k1), k2, axis=1), np.eye(n))
    H0 = np.kron(np.ones((1, k1 * k2)), np.eye(n))
    rows, rhs = [], []
    for H, Y, w, cnt in ((H0, Ys[0], ws[0], 1), (H1, Ys[1], ws[1], k1),
                         (np.eye(k1 * k2 * n), Ys[2], ws[2], k1 * k2)):  # fmt: skip
        sw = np.sqrt(np.tile(w, cnt))
        rows.append((np.kron(np.eye(cnt), A) @ H) * sw[:, None])
        rhs.append(Y.reshape(-1) * sw)
    ls = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)[0]
    np.testing.assert_allclose(out[0].x.sum(), ls.sum(), rtol=1e-7)


def test_invariants_and_empty_units_hold_with_the_levels_below():
    from tests.unit.test_topdown_passes import _tree

    A, w, Ys, parents, cons, levels = _tree(1)
    n = A.shape[1]
    out = passes_tree([A] * 3, Ys, parents, weights=[w] * 3, constraints=cons,
                      passes=[_passes(n)] * 3)  # fmt: skip
    for est, x, c in zip(out, levels, cons, strict=True):
        np.testing.assert_allclose(est.x.sum(axis=1), x.sum(axis=1), atol=1e-7)
        assert c.satisfied(est.x, atol=1e-9).all()
        assert (est.x[c.upper == 0] == 0).all()


# -- today's fitter with structural zeros and extra totals (the default passes' fast path)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_totals", [False, True])
def test_fitter_with_zeros_and_totals_matches_the_interior_point_qp(seed, with_totals):
    """The FISTA fit with pairs held at zero and per-child total rows against the
    interior-point QP of the same problem (itself checked against cvxpy): the same
    optimum, to the fitter's tolerance."""
    from dpdask.reconstruct.topdown import children_fitter

    rng = np.random.default_rng(seed)
    K, n = int(rng.integers(2, 6)), int(rng.integers(4, 9))
    truth = rng.poisson(rng.gamma(0.8, 4.0, (K, n))).astype(float)
    zeros = rng.random((K, n)) < 0.3
    zeros[0] = False  # every cell keeps a child that is free
    truth[zeros] = 0.0
    A = np.vstack([np.ones(n), np.eye(n)])
    w = np.r_[0.5, np.full(n, 0.3)]
    Y = truth @ A.T + rng.normal(size=(K, n + 1)) / np.sqrt(w)
    parent = truth.sum(axis=0)
    upper = np.where(zeros, 0.0, np.inf)
    c = Constraints(np.zeros((K, n)), upper, np.zeros((0, n)), np.zeros((K, 0)),
                    np.zeros((K, 0)), tuple(map(str, range(K))), ())  # fmt: skip
    v = truth.sum(axis=1) + rng.normal(size=K)
    u = rng.uniform(0.1, 2.0, K)
    extra = (np.ones((1, n)), v[:, None], u[:, None]) if with_totals else None
    ref = fit_constrained_children(A, Y, parent, c, weights=w, extra=extra)
    fit = children_fitter(VStack([Total(n), Identity(n)]), w,
                          tol=1e-9, maxiter=200000)  # fmt: skip
    est = fit.on_support(parent, Y=Y, fixed=zeros, totals=(v, u) if with_totals else None)
    X = np.zeros((K, n))
    X[:, est.idx] = est.x
    assert (X[zeros] == 0).all() and (X >= 0).all()
    np.testing.assert_allclose(X.sum(axis=0), parent, atol=1e-9 * max(1.0, parent.max()))

    def objective(Z):
        f = 0.5 * float(np.sum(w * (Z @ A.T - Y) ** 2))
        return f + (0.5 * float(np.sum(u * (Z.sum(axis=1) - v) ** 2)) if with_totals else 0.0)

    assert objective(X) <= objective(ref.x) + 1e-6 * max(1.0, objective(ref.x))
    np.testing.assert_allclose(X, ref.x, atol=1e-3 * max(1.0, parent.max()))
