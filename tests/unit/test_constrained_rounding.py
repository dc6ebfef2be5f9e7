"""Integer rounding that keeps the parent, the constraints and each pass's answers.

Oracles: an integer program (``scipy.optimize.milp``) written independently, on the
integer cells with the absolute values through auxiliary variables, solved stage by
stage with the earlier stages' answers of the rounder fixed (so equal optima at every
stage certify the rounder's lexicographic optimum); exhaustive enumeration on tiny
families; and the guarantees (floor or ceiling, exact sums, totals within 1, zeros) on the
16- and 252-cell domains where the largest-remainder rounding lets block totals drift.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.reconstruct.topdown import (
    Constraints,
    fit_constrained_children,
    pl94_constraints,
    round_children,
    round_constrained,
)


def _groups(n, g):
    """Queries of ``g`` disjoint groups of cells (a laminar family with the total)."""
    Q = np.zeros((g, n))
    for j in range(n):
        Q[j % g, j] = 1.0
    return Q


def _family(seed, K=None, n=None):
    """A fractional fit of a feasible constrained family with an integer parent."""
    rng = np.random.default_rng(seed)
    K = K or int(rng.integers(2, 5))
    n = n or int(rng.integers(3, 9))
    truth = rng.poisson(rng.gamma(0.8, 3.0, (K, n))).astype(float)
    zeros = rng.random((K, n)) < 0.2
    truth[zeros] = 0.0
    G = _groups(n, 2)
    Q = np.vstack([np.ones(n), G])
    ans = truth @ Q.T
    lo = np.where(rng.random((K, 3)) < 0.3, ans, -np.inf)
    lo[:, 1:] = np.minimum(ans[:, 1:], np.where(rng.random((K, 2)) < 0.5, 1.0, 0.0))
    hi = np.where(np.isfinite(lo[:, :1]) & (lo[:, :1] == ans[:, :1]), ans[:, :1], np.inf)
    hi = np.hstack([hi, np.full((K, 2), np.inf)])
    c = Constraints(np.zeros((K, n)), np.where(zeros, 0.0, np.inf), Q, lo, hi,
                    tuple(f"b{k}" for k in range(K)), ("total", "g0", "g1"))  # fmt: skip
    Y = truth + rng.normal(0, 2.0, truth.shape)
    X = fit_constrained_children(np.eye(n), Y, truth.sum(axis=0), c).x
    return X, truth.sum(axis=0).astype(np.int64), c, [np.ones((1, n)), G]


def _oracle_stage(X, parent, c, passes, fixed, objective_Q, target):
    """min sum |objective_Q x_c - target_c| over integer x in [floor X, ceil X] meeting
    the constraints, the passes' bands and the ``fixed`` answers ``(Q, values)``."""
    K, n = X.shape
    N = K * n
    lo_x, hi_x = np.floor(X + 1e-9), np.ceil(X - 1e-9)
    lo_x = np.maximum(lo_x, np.ceil(c.lower))
    hi_x = np.minimum(hi_x, c.upper)
    q = objective_Q.shape[0]
    T = K * q  # auxiliary |.| variables
    rows, lo, hi = [], [], []

    def per_child(Q, L, H):
        for k in range(K):
            for r in range(Q.shape[0]):
                row = np.zeros(N + T)
                row[k * n : (k + 1) * n] = Q[r]
                rows.append(row)
                lo.append(L[k, r])
                hi.append(H[k, r])

    per_child(c.queries, np.ceil(c.lo - 1e-9), np.floor(c.hi + 1e-9))
    for Q in passes:
        a = X @ Q.T
        per_child(Q, np.floor(a + 1e-9), np.ceil(a - 1e-9))
    for Q, vals in fixed:
        per_child(Q, vals, vals)
    if parent is not None:
        for j in range(n):
            row = np.zeros(N + T)
            row[j:N:n] = 1.0
            rows.append(row)
            lo.append(parent[j])
            hi.append(parent[j])
    for k in range(K):  # t >= +-(Q x - target)
        for r in range(q):
            for sgn in (1.0, -1.0):
                row = np.zeros(N + T)
                row[k * n : (k + 1) * n] = sgn * objective_Q[r]
                row[N + k * q + r] = -1.0
                rows.append(row)
                lo.append(-np.inf)
                hi.append(sgn * target[k, r])
    cost = np.concatenate([np.zeros(N), np.ones(T)])
    integrality = np.concatenate([np.ones(N), np.zeros(T)])
    bounds = Bounds(np.concatenate([lo_x.ravel(), np.zeros(T)]),
                    np.concatenate([hi_x.ravel(), np.full(T, np.inf)]))  # fmt: skip
    res = milp(cost, constraints=[LinearConstraint(np.array(rows), lo, hi)],
               integrality=integrality, bounds=bounds)  # fmt: skip
    assert res.status == 0, res.message
    return res.fun


@pytest.mark.parametrize("seed", range(15))
def test_each_stage_is_optimal_against_an_integer_program(seed):
    X, parent, c, passes = _family(seed)
    Xi = round_constrained(X, parent, c, passes=passes)
    fixed = []
    for Q in passes:
        mine = float(np.abs(Xi @ Q.T - X @ Q.T).sum())
        best = _oracle_stage(X, parent, c, passes, fixed, Q, X @ Q.T)
        assert abs(mine - best) <= 1e-7, (mine, best)
        fixed.append((Q, (Xi @ Q.T).astype(float)))
    mine = float(np.abs(Xi - X).sum())
    best = _oracle_stage(X, parent, c, passes, fixed, np.eye(X.shape[1]), X)
    assert abs(mine - best) <= 1e-7
    _guarantees(Xi, X, parent, c, passes)


def _guarantees(Xi, X, parent, c, passes):
    assert Xi.dtype == np.int64
    assert ((Xi == np.floor(X + 1e-9)) | (Xi == np.ceil(X - 1e-9))).all()
    if parent is not None:
        np.testing.assert_array_equal(Xi.sum(axis=0), parent)
    assert c.satisfied(Xi.astype(float), atol=0).all()
    for Q in passes:
        assert (np.abs(Xi @ Q.T - X @ Q.T) < 1).all()


@pytest.mark.parametrize("seed", range(10))
def test_tiny_families_against_enumeration(seed):
    X, parent, c, passes = _family(100 + seed, K=2, n=4)
    Xi = round_constrained(X, parent, c, passes=passes)
    lo, hi = np.floor(X + 1e-9).astype(int), np.ceil(X - 1e-9).astype(int)
    best = None
    for ups in itertools.product(*(range(a, b + 1) for a, b in zip(lo.ravel(), hi.ravel(),
                                                                   strict=True))):  # fmt: skip
        Z = np.array(ups, dtype=float).reshape(X.shape)
        if (Z.sum(axis=0) != parent).any() or not c.satisfied(Z, atol=0).all():
            continue
        if any((np.abs(Z @ Q.T - X @ Q.T) >= 1).any() for Q in passes):
            continue
        key = tuple(round(float(np.abs(Z @ Q.T - X @ Q.T).sum()), 9) for Q in passes)
        key += (round(float(np.abs(Z - X).sum()), 9),)
        best = key if best is None or key < best else best
    got = tuple(round(float(np.abs(Xi @ Q.T - X @ Q.T).sum()), 9) for Q in passes)
    got += (round(float(np.abs(Xi - X).sum()), 9),)
    assert got == best


@pytest.mark.parametrize("n", [16, 252])
def test_block_totals_kept_on_small_domains(n):
    rng = np.random.default_rng(n)
    K = 12
    hu = rng.integers(0, 3, K)
    hu[:3] = 0  # three empty blocks
    c = pl94_constraints(hu, np.zeros((K, 8), int)) if n == 252 else Constraints.none(K, n)
    worst_lr = 0.0
    for _ in range(5):
        parent = rng.poisson(3.0, n)
        share = rng.gamma(0.5, 1.0, (K, n)) * (c.upper > 0)
        share[:, share.sum(axis=0) == 0] = 1.0 * (c.upper[:, share.sum(axis=0) == 0] > 0)
        X = share / share.sum(axis=0) * parent
        Xi = round_constrained(X, parent, c)
        _guarantees(Xi, X, parent, c, [np.ones((1, n))])
        assert (Xi[c.upper == 0] == 0).all()
        lr = round_children(X, parent)
        worst_lr = max(worst_lr, float(np.abs(lr.sum(1) - X.sum(1)).max()))
    assert worst_lr >= 1  # the largest remainders let totals drift; the rounder does not


def test_invariants_kept_exactly():
    n = 5
    X = np.array([[1.5, 0.5, 1.0, 0.0, 0.0], [0.5, 1.5, 0.0, 1.0, 1.0]])
    c = Constraints.none(2, n).with_queries(np.ones(n), [[3.0], [4.0]], [[3.0], [4.0]],
                                            ["total"])  # fmt: skip
    Xi = round_constrained(X, np.array([2, 2, 1, 1, 1]), c)
    np.testing.assert_array_equal(Xi.sum(axis=1), [3, 4])


def test_top_level_rounds_each_unit_keeping_its_total():
    X = np.array([[0.4, 0.4, 0.4], [2.5, 0.25, 0.0]])
    Xi = round_constrained(X, None)
    np.testing.assert_array_equal(Xi.sum(axis=1), [1, 3])


def test_no_rounding_raises_plan_error_naming_the_family():
    # x0 + x1 = 1 and x0 - x1 = 0: (0.5, 0.5) but no integers
    c = Constraints(np.zeros((1, 2)), np.full((1, 2), np.inf), np.array([[1.0, 1.0],
                    [1.0, -1.0]]), np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]]),
                    ("block 4",), ("total", "difference"))  # fmt: skip
    with pytest.raises(PlanError, match="block 4"):
        round_constrained(np.array([[0.5, 0.5]]), None, c)


def test_bad_inputs():
    X = np.array([[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ShapeError, match="do not sum"):
        round_constrained(X, np.array([2, 2]))
    with pytest.raises(ArgumentError, match="integers"):
        round_constrained(X, np.array([1.0, 0.5]))
    c = Constraints.none(2, 2)
    c = Constraints(c.lower, np.zeros((2, 2)), c.queries, c.lo, c.hi, c.units, c.labels)
    with pytest.raises(PlanError, match="outside its cell bounds"):
        round_constrained(X, np.array([1, 1]), c)


def test_pl94_full_family_keeps_total_then_group_quarters():
    """The Bureau's order on the 2,016-cell domain: the blocks' totals, then their
    group-quarters populations (laminar inside the total), then the cells."""
    from dpdask.datasets import synthetic_pl94_blocks
    from dpdask.reconstruct.topdown import pl94_full_constraints

    b = synthetic_pl94_blocks(10, 400, seed=2)
    truth = b.counts.reshape(10, -1).astype(float)
    c = pl94_full_constraints(b.housing_units, b.facilities)
    rng = np.random.default_rng(0)
    parent = truth.sum(axis=0)
    X = fit_constrained_children(np.eye(2016), truth + rng.normal(0, 1.5, truth.shape), parent, c).x
    passes = [c.queries[:1], c.queries[1:]]
    Xi = round_constrained(X, parent.astype(np.int64), c, passes=passes)
    _guarantees(Xi, X, parent.astype(np.int64), c, passes)
    assert (Xi[c.upper == 0] == 0).all()
