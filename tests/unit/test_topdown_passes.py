"""Multi-pass top-down fits: each pass against a generic QP, passes kept, invariants exact.

Oracles: cvxpy (Clarabel) solving each pass from its own formulation; the exact
invariants a toy hierarchy is built with; the bottom-up fit (leaves alone, summed up), which
ignores the upper levels' total measurements that the multi-pass fit uses.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask.errors import ArgumentError
from dpdask.linalg import Identity, Total, VStack
from dpdask.reconstruct.topdown import (
    Constraints,
    Pass,
    default_passes,
    fit_constrained_children,
    fit_family_passes,
    passes_tree,
)

cp = pytest.importorskip("cvxpy")


def _cvx_pass(A, Y, w, parent, lower, upper, kept):
    """One pass as cvxpy sees it: ``kept`` is a list of (Q, lo, hi) per-child bounds."""
    K, n = Y.shape[0], A.shape[1]
    X = cp.Variable((K, n))
    obj = 0.5 * cp.sum_squares(cp.multiply(np.sqrt(w)[None, :], X @ A.T - Y))
    cons = [X >= lower, cp.sum(X, axis=0) == parent]
    fin = np.isfinite(upper)
    if fin.any():
        cons.append(X[fin] <= upper[fin])
    for Q, lo, hi in kept:
        cons += [X @ Q.T >= lo, X @ Q.T <= hi]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return prob.value, X.value


def _family(seed):
    rng = np.random.default_rng(seed)
    K, n = int(rng.integers(2, 5)), int(rng.integers(3, 8))
    truth = rng.poisson(rng.gamma(0.6, 3.0, (K, n))).astype(float)
    upper = np.where(rng.random((K, n)) < 0.2, 0.0, np.inf)
    truth[upper == 0] = 0.0
    A = np.vstack([np.ones(n), np.eye(n), rng.integers(0, 2, (2, n))]).astype(float)
    w = np.concatenate([[4.0], np.full(n, 0.25), [0.5, 0.5]])
    Y = truth @ A.T + rng.normal(size=(K, A.shape[0])) / np.sqrt(w)
    c = Constraints(np.zeros((K, n)), upper, np.zeros((0, n)), np.zeros((K, 0)),
                    np.zeros((K, 0)), tuple(map(str, range(K))), ())  # fmt: skip
    return A, Y, w, truth.sum(axis=0), c


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("slack", [0.0, 0.75])
def test_each_pass_matches_a_generic_qp(seed, slack):
    A, Y, w, parent, c = _family(seed)
    n = A.shape[1]
    passes = [Pass(np.ones((1, n)), np.array([0]), slack, "total"),
              Pass(np.eye(n), None, 0.0, "detail")]  # fmt: skip
    est = fit_family_passes(A, Y, parent, c, passes=passes, weights=w)
    # pass 1: the totals' rows alone; its answers (the children's totals) are unique
    v1, X1 = _cvx_pass(A[:1], Y[:, :1], w[:1], parent, c.lower, c.upper, [])
    assert abs(est.reports[0].details["objective"] - v1) <= 1e-6 * max(1.0, v1)
    np.testing.assert_allclose(est.answers[0][:, 0], X1.sum(axis=1), atol=1e-5)
    # pass 2: every row, the totals kept within the slack
    t = X1.sum(axis=1)
    kept = [(np.ones((1, n)), (t - slack)[:, None], (t + slack)[:, None])]
    v2, _ = _cvx_pass(A, Y, w, parent, c.lower, c.upper, kept)
    assert abs(est.reports[1].details["objective"] - v2) <= 1e-6 * max(1.0, v2)
    kept_err = np.abs(est.x.sum(axis=1) - est.answers[0][:, 0])
    assert (kept_err <= slack + 1e-8 * max(1.0, parent.sum())).all()
    if slack == 0.0:
        assert kept_err.max() <= 1e-8 * max(1.0, parent.sum())
    np.testing.assert_allclose(est.x.sum(axis=0), parent, atol=1e-8 * max(1.0, parent.max()))
    assert (est.x[c.upper == 0] == 0).all()


def test_default_passes_find_the_total_rows():
    A = VStack([Identity(3), Total(3)])
    p = default_passes(A)
    assert [x.name for x in p] == ["total", "detail"]
    assert p[0].rows.tolist() == [3] and p[1].rows.tolist() == [0, 1, 2]
    q = default_passes(Identity(3))  # no total row: every row in both passes
    assert q[0].rows is None and q[1].rows is None
    with pytest.raises(ArgumentError, match="slack"):
        Pass(np.ones((1, 3)), None, -1.0)


def _tree(seed, invariants=True):
    """A 3-level toy (1 root, 3 mids, 9 leaves, 6 cells): leaf totals and the root total
    invariant, empty leaves all zero, leaf constraints aggregated upwards."""
    rng = np.random.default_rng(seed)
    n = 6
    leaves = rng.poisson(rng.gamma(0.5, 3.0, (9, n))).astype(float)
    empty = rng.random(9) < 0.3
    leaves[empty] = 0.0
    p1, p0 = np.repeat(np.arange(3), 3), np.zeros(3, dtype=np.int64)
    mids = leaves.reshape(3, 3, n).sum(axis=1)
    root = mids.sum(axis=0, keepdims=True)
    tot = leaves.sum(axis=1)[:, None]
    upper = np.where(empty[:, None], 0.0, np.full((9, n), np.inf))
    lo = tot if invariants else np.zeros((9, 1))
    hi = tot if invariants else np.full((9, 1), np.inf)
    c2 = Constraints(np.zeros((9, n)), upper, np.ones((1, n)), lo, hi,
                     tuple(f"leaf {i}" for i in range(9)), ("total",))  # fmt: skip
    c1 = c2.aggregate(p1)
    c0 = c1.aggregate(p0)
    A = VStack([Total(n), Identity(n)])
    w = np.concatenate([[1.0], np.full(n, 0.1)])
    levels = [root, mids, leaves]
    Ys = [x @ A.dense().T + rng.normal(size=(x.shape[0], n + 1)) / np.sqrt(w) for x in levels]
    return A, w, Ys, [p0, p1], [c0, c1, c2], levels


@pytest.mark.parametrize("seed", range(4))
def test_invariants_hold_exactly_at_every_level(seed):
    A, w, Ys, parents, cons, levels = _tree(seed)
    out = passes_tree([A] * 3, Ys, parents, weights=[w] * 3, constraints=cons)
    for est, x, c in zip(out, levels, cons, strict=True):
        np.testing.assert_allclose(est.x.sum(axis=1), x.sum(axis=1), atol=1e-7)
        assert c.satisfied(est.x, atol=1e-9).all()
        assert (est.x[c.upper == 0] == 0).all()  # empty leaves: nobody, exactly
    for lvl, par in enumerate(parents, start=1):
        np.testing.assert_allclose(
            np.add.reduceat(out[lvl].x, np.r_[0, np.flatnonzero(np.diff(par)) + 1]),
            out[lvl - 1].x, atol=1e-7,
        )  # fmt: skip
        # each pass's answers kept (slack 0) by the last pass
        np.testing.assert_allclose(out[lvl].x.sum(axis=1), out[lvl].answers[0][:, 0], atol=1e-7)


def test_multi_pass_totals_beat_a_fit_that_ignores_upper_levels_totals():
    """Only totals measured at the root and the middle level; the leaves measure their
    total and cells. The multi-pass fit uses every level's totals first; the bottom-up
    fit (each leaf by constrained least squares alone, summed up) ignores the upper ones."""
    n = 16
    At, Al = Total(n), VStack([Total(n), Identity(n)])
    sd_t, sd_c = 2.0, 5.0
    wt = np.array([sd_t**-2])
    wl = np.concatenate([wt, np.full(n, sd_c**-2)])
    p1, p0 = np.repeat(np.arange(4), 4), np.zeros(4, dtype=np.int64)
    multi, bottom = [], []
    for seed in range(16):
        rng = np.random.default_rng(seed)
        leaves = rng.poisson(rng.gamma(0.3, 2.0, (16, n)))
        mids = leaves.reshape(4, 4, n).sum(axis=1)
        levels = [mids.sum(axis=0, keepdims=True), mids, leaves]
        Ys = [x.sum(1, keepdims=True) + rng.normal(0, sd_t, (x.shape[0], 1)) for x in levels]
        Ys[2] = np.hstack([Ys[2], leaves + rng.normal(0, sd_c, leaves.shape)])
        out = passes_tree([At, At, Al], Ys, [p0, p1], weights=[wt, wt, wl])
        bu = fit_constrained_children(Al, Ys[2], None, weights=wl).x
        bus = [bu.sum(axis=0, keepdims=True), bu.reshape(4, 4, n).sum(axis=1), bu]
        multi.append(
            [np.mean((e.x.sum(1) - x.sum(1)) ** 2) for e, x in zip(out, levels, strict=True)]
        )
        bottom.append(
            [np.mean((b.sum(1) - x.sum(1)) ** 2) for b, x in zip(bus, levels, strict=True)]
        )
    m, b = np.mean(multi, axis=0), np.mean(bottom, axis=0)
    # expected: about 4.7, 3.6, 3.0 against 160, 24, 4.1 (root, middle, leaves)
    assert (m < 0.9 * b).all(), (m, b)
    assert m[0] < 0.2 * b[0] and m[1] < 0.5 * b[1]


@pytest.mark.parametrize("invariants", [True, False])
def test_integer_tree_keeps_invariants_zeros_and_totals(invariants):
    A, w, Ys, parents, cons, levels = _tree(7, invariants=invariants)
    out = passes_tree([A] * 3, Ys, parents, weights=[w] * 3, constraints=cons, integer=True)
    for lvl, (est, x, c) in enumerate(zip(out, levels, cons, strict=True)):
        assert est.x.dtype == np.int64
        assert c.satisfied(est.x.astype(float), atol=0).all()
        assert (est.x[c.upper == 0] == 0).all()
        # each unit's total within 1 of its fractional pass-1 answer
        assert (np.abs(est.x.sum(axis=1) - est.answers[0][:, 0]) < 1).all()
        if invariants:
            np.testing.assert_array_equal(est.x.sum(axis=1), x.sum(axis=1))
        if lvl:
            par = parents[lvl - 1]
            sums = np.zeros_like(out[lvl - 1].x)
            np.add.at(sums, par, est.x)
            np.testing.assert_array_equal(sums, out[lvl - 1].x)


@pytest.mark.parametrize("integer", [False, True])
def test_noise_off_returns_the_truth_at_every_level(integer):
    A, w, _, parents, cons, levels = _tree(11)
    Ys = [x @ A.dense().T for x in levels]
    out = passes_tree([A] * 3, Ys, parents, weights=[w] * 3, constraints=cons, integer=integer)
    for est, x in zip(out, levels, strict=True):
        np.testing.assert_allclose(est.x, x, atol=1e-6)


@pytest.mark.parametrize(
    "queries", [np.eye(400), np.ones((1, 400)), np.arange(800.0).reshape(2, 400) / 7]
)
def test_a_pass_pickles_its_counting_rows_as_bits(queries):
    """A pass travels to every worker of a release: 0/1 rows a bit each, other rows as
    they are, and back exactly."""
    import pickle

    p = Pass(queries, np.array([0, 2]), 0.5, "p", True)
    sent = pickle.dumps(p)
    got = pickle.loads(sent)
    np.testing.assert_array_equal(got.queries, queries)
    assert got.queries.dtype == queries.dtype
    assert (got.name, got.slack, got.below) == ("p", 0.5, True)
    np.testing.assert_array_equal(got.rows, [0, 2])
    binary = bool(np.isin(queries, (0, 1)).all())
    assert (len(sent) < queries.nbytes / 4) is binary
