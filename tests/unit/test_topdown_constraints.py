"""Constraints (bounds, structural zeros, invariants) and the constrained family fit.

Oracles: a generic QP (cvxpy, Clarabel at tight tolerances) on the same problem written
independently from the whole ``(K, n)`` variable; the truth when noise is off; hand-made
infeasible combinations whose conflicting constraints the errors must name.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import census
from dpdask.errors import DataError, PlanError
from dpdask.linalg import Identity, Total, VStack
from dpdask.reconstruct.topdown import (
    Constraints,
    check_constraints,
    check_family,
    fit_constrained_children,
    pl94_constraints,
    pl94_full_constraints,
)
from dpdask.reconstruct.topdown._qp import solve_qp

cp = pytest.importorskip("cvxpy")


def _oracle(A, Y, w, parent, c):
    """The constrained fit as a cvxpy problem on the whole (K, n) variable."""
    K, n = c.k, c.n
    X = cp.Variable((K, n))
    W = np.sqrt(w)
    obj = 0.5 * cp.sum_squares(cp.multiply(W[None, :], X @ A.T - Y))
    cons = [X >= c.lower]
    fin = np.isfinite(c.upper)
    if fin.any():
        cons.append(X[fin] <= c.upper[fin])
    if parent is not None:
        cons.append(cp.sum(X, axis=0) == parent)
    Ans = X @ c.queries.T
    for k in range(K):
        for r in range(c.queries.shape[0]):
            if np.isfinite(c.lo[k, r]):
                cons.append(Ans[k, r] >= c.lo[k, r])
            if np.isfinite(c.hi[k, r]):
                cons.append(Ans[k, r] <= c.hi[k, r])
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return prob.value, X.value


def _random_family(seed: int, with_parent: bool = True):
    """A feasible random family: a truth inside random bounds and query bounds."""
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 5)) if with_parent else int(rng.integers(1, 3))
    n = int(rng.integers(3, 9))
    truth = rng.poisson(3.0, (K, n)).astype(float)
    zeros = rng.random((K, n)) < 0.25
    truth[zeros] = 0.0
    upper = np.where(zeros, 0.0, np.where(rng.random((K, n)) < 0.3, truth + 1.0, np.inf))
    lower = np.where(rng.random((K, n)) < 0.2, np.floor(truth / 2), 0.0)
    q = int(rng.integers(1, 4))
    Q = (rng.random((q, n)) < 0.5).astype(float)
    Q[0] = 1.0  # the total
    ans = truth @ Q.T
    kind = rng.integers(0, 3, (K, q))  # 0 none, 1 invariant, 2 interval
    lo = np.where(kind == 1, ans, np.where(kind == 2, ans - 2.0, -np.inf))
    hi = np.where(kind == 1, ans, np.where(kind == 2, ans + 1.0, np.inf))
    c = Constraints(lower, upper, Q, lo, hi, tuple(f"b{k}" for k in range(K)),
                    tuple(f"q{r}" for r in range(q)))  # fmt: skip
    m = int(rng.integers(2, n + 3))
    A = rng.normal(size=(m, n))
    A[0] = 1.0
    w = rng.uniform(0.5, 2.0, m)
    Y = truth @ A.T + rng.normal(scale=3.0, size=(K, m))
    parent = truth.sum(axis=0) if with_parent else None
    return A, Y, w, parent, c, truth


@pytest.mark.parametrize("seed", range(25))
def test_constrained_fit_matches_a_generic_qp(seed):
    A, Y, w, parent, c, _ = _random_family(seed)
    est = fit_constrained_children(A, Y, parent, c, weights=w)
    want, Xo = _oracle(A, Y, w, parent, c)
    got = est.report.details["objective"]
    assert abs(got - want) <= 1e-6 * max(1.0, abs(want))
    # the fitted answers are unique (the objective is strictly convex in A x)
    np.testing.assert_allclose(est.x @ A.T, Xo @ A.T, atol=1e-4 * max(1.0, np.abs(Y).max()))
    assert c.satisfied(est.x, atol=1e-8).all()
    np.testing.assert_allclose(est.x.sum(axis=0), parent, atol=1e-8 * max(1.0, parent.max()))
    zeros = c.upper == 0
    assert (est.x[zeros] == 0).all()  # structural zeros exactly


@pytest.mark.parametrize("seed", range(8))
def test_top_level_fit_without_parent_matches_a_generic_qp(seed):
    A, Y, w, _, c, _ = _random_family(100 + seed, with_parent=False)
    est = fit_constrained_children(A, Y, None, c, weights=w)
    want, _ = _oracle(A, Y, w, None, c)
    assert abs(est.report.details["objective"] - want) <= 1e-6 * max(1.0, abs(want))
    assert c.satisfied(est.x, atol=1e-8).all()


@pytest.mark.parametrize("seed", range(8))
def test_noise_off_returns_the_truth(seed):
    rng = np.random.default_rng(seed)
    A, _, w, parent, c, truth = _random_family(200 + seed)
    A = np.vstack([np.eye(c.n), A])  # full column rank
    w = np.concatenate([np.ones(c.n), w])
    est = fit_constrained_children(A, truth @ A.T, parent, c, weights=w * rng.uniform(1, 2))
    np.testing.assert_allclose(est.x, truth, atol=1e-6)


def test_invariants_hold_with_a_linear_query_strategy():
    A = VStack([Identity(4), Total(4)])
    c = Constraints.none(2, 4).with_queries(np.ones(4), [[3.0], [5.0]], [[3.0], [5.0]], ["total"])
    Y = np.array([[4.0, 4.0, 0.0, 1.0, 6.0], [0.0, 1.0, 1.0, 0.0, 1.0]])
    est = fit_constrained_children(A, Y, np.array([2.0, 3.0, 1.0, 2.0]), c)
    np.testing.assert_allclose(est.x.sum(axis=1), [3.0, 5.0], atol=1e-9)


def test_qp_reports_infeasible_equalities():
    # x0 + x1 = 3 and x0 + x1 = 5: no point
    M = np.array([[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(PlanError, match="no solution"):
        solve_qp(np.eye(2), np.zeros(2), M, np.array([3.0, 5.0]), np.zeros(2), np.full(2, 9.0))


def test_infeasible_overlapping_invariants_raise_plan_error_naming_the_family():
    # {0, 1} = 3 and {1, 2} = 0 with cell 0 at most 1: only the fit can tell
    c = Constraints(
        np.zeros((1, 3)), np.array([[1.0, np.inf, np.inf]]),
        np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]), np.array([[3.0, 0.0]]),
        np.array([[3.0, 0.0]]), ("block 9",), ("a", "b"),
    )  # fmt: skip
    check_constraints(c)  # nothing the checks can name
    with pytest.raises(PlanError, match="block 9"):
        fit_constrained_children(np.eye(3), np.ones((1, 3)), None, c)


def test_total_on_an_empty_block_is_named():
    c = pl94_full_constraints(np.array([2, 0]), np.zeros((2, 8), int), totals=np.array([4, 5]),
                              units=["b1", "b2"])  # fmt: skip
    with pytest.raises(DataError, match=r"b2: total must be in \[5, 5\].*every cell bounded to 0"):
        check_constraints(c)


def test_facilities_above_capacity_are_named():
    fac = np.zeros((1, 8), int)
    fac[0, 5] = 3
    cap = np.zeros((1, 8), int)
    cap[0, 5] = 2
    c = pl94_full_constraints(np.array([1]), fac, capacity=cap, units=["b7"])
    with pytest.raises(DataError, match="b7: college population must be at least 3 and at most 2"):
        check_constraints(c)


def test_more_facilities_than_an_invariant_total_are_named():
    fac = np.zeros((1, 8), int)
    fac[0, 1], fac[0, 3] = 2, 2
    c = pl94_full_constraints(np.array([1]), fac, totals=np.array([3]), units=["b3"])
    with pytest.raises(DataError, match="b3: total is at most 3 but correctional population, "
                       "nursing population need at least 4"):  # fmt: skip
        check_constraints(c)


def test_parent_invariant_must_equal_its_childrens_sum():
    kids = pl94_constraints(np.array([1, 1]), np.zeros((2, 8), int), totals=np.array([2, 3]))
    par = pl94_constraints(np.array([2]), np.zeros((1, 8), int), totals=np.array([6]),
                           units=["tract 1"])  # fmt: skip
    with pytest.raises(DataError, match="tract 1: invariant total is 6 but its children's "
                       "invariants sum to 5"):  # fmt: skip
        check_family(None, kids, par)
    check_family(None, kids, kids.aggregate(np.array([0, 0])))  # the sum is consistent


def test_parent_cells_the_children_cannot_hold_are_named():
    kids = pl94_constraints(np.array([0, 1]), np.zeros((2, 8), int), units=["e", "f"])
    p = np.zeros(252)
    p[7] = 4.0
    check_family(p, kids)  # f may hold them
    kids = pl94_constraints(np.array([0, 0]), np.zeros((2, 8), int), units=["e", "f"])
    with pytest.raises(DataError, match="cell 7 is 4 but its children's cell bounds allow"):
        check_family(p, kids, parent_name="bg 1")
    with pytest.raises(DataError, match="bg 1"):
        fit_constrained_children(np.eye(252), np.zeros((2, 252)), p, kids, parent_name="bg 1")


def test_pl94_full_structural_zeros_and_bounds():
    shape = census.pl94_full_domain().shape
    fac = np.zeros((4, 8), int)
    fac[2, 3] = 2  # a nursing facility
    fac[3, 5] = 1
    c = pl94_full_constraints(np.array([0, 4, 0, 0]), fac)
    up = c.upper.reshape(4, *shape)
    assert (up[0] == 0).all()  # no units, no facility: nobody
    assert np.isinf(up[1, 0]).all() and (up[1, 1:] == 0).all()  # households only
    assert (up[2, 3, 0] == 0).all() and np.isinf(up[2, 3, 1]).all()  # no minors in nursing
    assert (up[2, :3] == 0).all() and (up[2, 4:] == 0).all()
    assert np.isinf(up[3, 5]).all() and (up[3, 0] == 0).all()
    assert c.labels[0] == "total" and c.labels[3] == "nursing population"
    assert c.lo[2, 3] == 2 and np.isinf(c.hi[2, 3]) and c.lo[3, 5] == 1
    np.testing.assert_array_equal(c.queries[3].reshape(shape)[3], 1.0)
    assert c.queries[3].sum() == 252 and c.queries[0].sum() == 2016
    check_constraints(c)


def test_pl94_full_constraints_hold_on_synthetic_blocks():
    from dpdask.datasets import synthetic_pl94_blocks

    b = synthetic_pl94_blocks(60, 1500, seed=3)
    X = b.counts.reshape(60, -1).astype(float)
    c = pl94_full_constraints(b.housing_units, b.facilities, totals=b.population)
    check_constraints(c)
    assert c.satisfied(X, atol=0).all()  # the truth satisfies every constraint
    par = c.aggregate(np.repeat(np.arange(6), 10))
    check_family(X[:10].sum(axis=0), c.take(range(10)), par.take([0]))
    assert par.satisfied(X.reshape(6, 10, -1).sum(axis=1), atol=0).all()


def test_bad_attributes_are_data_errors():
    with pytest.raises(DataError, match="column 0"):
        pl94_full_constraints(np.array([1]), np.ones((1, 8), int))
    with pytest.raises(DataError, match="non-negative"):
        pl94_constraints(np.array([-1]), np.zeros((1, 8), int))


@pytest.mark.parametrize("seed", range(6))
def test_sparse_kkt_path_matches_a_generic_qp(seed, monkeypatch):
    from dpdask.reconstruct.topdown import _qp

    monkeypatch.setattr(_qp, "DENSE_KKT", 0)  # every system through the sparse LU
    A, Y, w, parent, c, _ = _random_family(300 + seed)
    est = fit_constrained_children(A, Y, parent, c, weights=w)
    want, _ = _oracle(A, Y, w, parent, c)
    assert abs(est.report.details["objective"] - want) <= 1e-6 * max(1.0, abs(want))
    assert c.satisfied(est.x, atol=1e-8).all()


def test_a_large_family_matches_a_generic_qp():
    rng = np.random.default_rng(11)
    K, n = 6, 120  # 720 variables: the sparse KKT path
    truth = rng.poisson(rng.gamma(0.5, 2.0, (K, n))).astype(float)
    c = pl94_constraints(np.array([0, 1, 2, 1, 3, 1]), np.zeros((K, 8), int))
    c = Constraints(c.lower[:, :n], c.upper[:, :n], c.queries[:, :n], c.lo, c.hi, c.units,
                    c.labels)  # fmt: skip
    truth[0] = 0.0
    A = np.vstack([np.ones(n), np.eye(n)])
    w = np.concatenate([[1.0], np.full(n, 0.25)])
    Y = truth @ A.T + rng.normal(size=(K, n + 1)) / np.sqrt(w)
    est = fit_constrained_children(A, Y, truth.sum(axis=0), c, weights=w)
    want, _ = _oracle(A, Y, w, truth.sum(axis=0), c)
    assert abs(est.report.details["objective"] - want) <= 1e-6 * max(1.0, abs(want))
    assert (est.x[0] == 0).all()


def test_check_hierarchy_before_any_charge():
    from dpdask.datasets import synthetic_pl94_blocks
    from dpdask.reconstruct.topdown import check_hierarchy

    b = synthetic_pl94_blocks(12, 300, seed=5)
    blocks = pl94_full_constraints(b.housing_units, b.facilities, totals=b.population)
    par = np.repeat(np.arange(3), 4)
    tracts = blocks.aggregate(par, ["t0", "t1", "t2"])
    state = tracts.aggregate(np.zeros(3, dtype=np.int64), ["state"])
    check_hierarchy([state, tracts, blocks], [np.zeros(3, dtype=np.int64), par])
    wrong = state.with_queries(np.zeros((0, 2016)), np.zeros((1, 0)), np.zeros((1, 0)), [])
    wrong.lo[0, 0] = wrong.hi[0, 0] = b.population.sum() + 1  # a state total off by one
    with pytest.raises(DataError, match="state: invariant total is 301 but its children's "
                       "invariants sum to 300"):  # fmt: skip
        check_hierarchy([wrong, tracts, blocks], [np.zeros(3, dtype=np.int64), par])
    # a state total no block can hold: only empty blocks below
    empty = pl94_constraints(np.zeros(2, int), np.zeros((2, 8), int), units=["e0", "e1"])
    top = Constraints.none(1, 252, ["state"]).with_queries(np.ones(252), [[5.0]], [[5.0]],
                                                           ["total"])  # fmt: skip
    with pytest.raises(DataError, match=r"state: invariant total is 5 but its children's "
                       r"bounds allow \[0, 0\]"):  # fmt: skip
        check_hierarchy([top, empty], [np.zeros(2, dtype=np.int64)])
