"""``children_fitter(...).on_support``: the family's fit on its parent's support.

Against the dense entry points (``fit(Y, parent)``, ``fit.from_estimates``) and the
independent QP oracles of :mod:`tests.unit.test_topdown` (SLSQP, Clarabel through
cvxpy), on dense, Kronecker and union-of-Kronecker strategies; measurements and
least-squares estimates give the same fit; and no array of the shape ``(K, n)`` is
allocated (``tracemalloc`` on a larger domain).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import dpdask.reconstruct.topdown._fitter as topdown_fitter
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.reconstruct.topdown import SupportEstimate, children_fitter
from tests import requires_cvxpy
from tests.unit.test_topdown import (
    _assert_feasible,
    _cvxpy,
    _kkt_gap,
    _matrix,
    _objective,
    _problem,
    _slsqp,
)


def _strategy(structure: str, rng: np.random.Generator) -> LinearQuery:
    if structure == "dense":
        return Dense(_matrix("full-rank", 16, 12, rng))
    if structure == "kron":
        return Kron([Prefix(3), Dense(rng.uniform(size=(5, 4)))])
    return VStack([Kron([Identity(3), Total(4)]), Kron([Total(3), Prefix(4)]), Identity(12)])


def _check_support(est: SupportEstimate, p: np.ndarray, K: int) -> None:
    assert isinstance(est, SupportEstimate)
    assert est.idx.dtype == np.int64
    np.testing.assert_array_equal(est.idx, np.flatnonzero(p > 0))
    assert est.x.shape == (K, est.idx.size) and est.x.dtype == np.float64
    assert (est.x >= 0).all()
    np.testing.assert_array_less(
        np.abs(est.x.sum(axis=0) - p[est.idx]), 1e-9 * np.maximum(p[est.idx], 1.0)
    )


@pytest.mark.parametrize("method", ["newton", "fista"])
@pytest.mark.parametrize("structure", ["dense", "kron", "union"])
def test_on_support_equals_the_dense_path(
    structure: str, method: str, rng: np.random.Generator
) -> None:
    A = _strategy(structure, rng)
    M = A.dense()
    Y, p = _problem(4, 12, M, rng)
    gram = "dense" if structure == "dense" else "kron"
    fit = children_fitter(A, tol=1e-10, gram=gram, method=method)
    est = fit.on_support(p, Y=Y)
    _check_support(est, p, 4)
    dense = fit(Y, p)
    np.testing.assert_allclose(est.dense(12), dense.x, rtol=0, atol=1e-6 * p.max())
    w = np.ones(M.shape[0])
    f, f_ref = _objective(M, Y, est.dense(12), w), _objective(M, Y, dense.x, w)
    assert abs(f - f_ref) <= 1e-8 * f_ref
    assert est.report.converged
    assert est.report.details["objective"] == pytest.approx(f, rel=1e-9)
    assert est.report.details["support"] == est.idx.size


@pytest.mark.parametrize("oracle", ["slsqp", pytest.param("cvxpy", marks=requires_cvxpy)])
@pytest.mark.parametrize("structure", ["dense", "kron", "union"])
def test_on_support_matches_qp_oracle(
    structure: str, oracle: str, rng: np.random.Generator
) -> None:
    A = _strategy(structure, rng)
    M = A.dense()
    w = rng.uniform(0.5, 2.0, size=M.shape[0])
    Y, p = _problem(3, 12, M, rng)
    est = children_fitter(A, w, tol=1e-10).on_support(p, Y=Y)
    X = est.dense(12)
    _assert_feasible(X, p)
    ref = (_slsqp if oracle == "slsqp" else _cvxpy)(M, Y, p, w)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, ref, w)
    assert abs(f - f_ref) <= 1e-6 * f_ref
    assert 0 <= _kkt_gap(M, Y, X, p, w) <= 1e-6 * f
    assert 0 <= est.report.details["gap"] <= 1e-6 * f


@pytest.mark.parametrize("method", ["newton", "fista"])
@pytest.mark.parametrize("structure", ["dense", "kron", "union"])
def test_measurements_and_estimates_give_the_same_fit(
    structure: str, method: str, rng: np.random.Generator
) -> None:
    """``Y`` and the least-squares estimates ``Z`` of ``Y``: one minimiser (and the
    same as ``from_estimates``)."""
    A = _strategy(structure, rng)
    M = A.dense()
    w = rng.uniform(0.5, 2.0, size=M.shape[0])
    Y, p = _problem(5, 12, M, rng)
    rw = np.sqrt(w)
    Z = np.linalg.lstsq(M * rw[:, None], (Y * rw).T, rcond=None)[0].T
    gram = "dense" if structure == "dense" else "kron"
    fit = children_fitter(A, w, tol=1e-10, gram=gram, method=method)
    from_y, from_z = fit.on_support(p, Y=Y), fit.on_support(p, Z=Z)
    np.testing.assert_array_equal(from_y.idx, from_z.idx)
    Xy, Xz = from_y.dense(12), from_z.dense(12)
    f_y, f_z = _objective(M, Y, Xy, w), _objective(M, Y, Xz, w)
    assert abs(f_y - f_z) <= 1e-8 * f_y
    # a strategy of full column rank has one minimiser
    np.testing.assert_allclose(Xy, Xz, rtol=0, atol=1e-5 * p.max())
    np.testing.assert_allclose(Xz, fit.from_estimates(Z, p).x, rtol=0, atol=1e-5 * p.max())


def test_one_child_and_empty_parent(rng: np.random.Generator) -> None:
    A = VStack([Identity(6), Total(6)])
    fit = children_fitter(A)
    p = np.array([1.5, 0.0, 2.0, 7.0, 0.0, 3.25])
    one = fit.on_support(p, Y=rng.normal(size=(1, 7)))
    np.testing.assert_array_equal(one.idx, [0, 2, 3, 5])
    np.testing.assert_array_equal(one.x, p[one.idx][None, :])
    empty = fit.on_support(np.zeros(6), Z=rng.normal(size=(3, 6)))
    assert empty.idx.size == 0 and empty.x.shape == (3, 0) and empty.report.converged


def test_rejects_both_or_neither(rng: np.random.Generator) -> None:
    A = VStack([Identity(3), Total(3)])
    fit = children_fitter(A)
    p = np.ones(3)
    with pytest.raises(ValueError, match="exactly one"):
        fit.on_support(p)
    with pytest.raises(ValueError, match="exactly one"):
        fit.on_support(p, Y=np.zeros((2, 4)), Z=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="shape"):
        fit.on_support(p, Z=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="non-negative"):
        fit.on_support(-p, Y=np.zeros((2, 4)))


@pytest.mark.parametrize("given", ["Y", "Z"])
def test_no_whole_family_array(
    given: str, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """On a 96,000-cell union strategy with 16 children and a support of 300 cells, the
    fit allocates far less than one ``(K, n)`` float64 array (12 MB) at its peak."""
    monkeypatch.setattr(topdown_fitter, "_BATCH_ENTRIES", 1)  # one row at a time
    A = VStack(
        [Kron([Identity(40), Total(40), Identity(60)]), Kron([Total(40), Prefix(40), Identity(60)])]
    )
    n, K = A.shape[1], 16
    fit = children_fitter(A, 2.0)
    p = np.zeros(n)
    p[rng.choice(n, size=300, replace=False)] = rng.uniform(1.0, 20.0, size=300)
    data = rng.normal(size=(K, A.shape[0] if given == "Y" else n))
    fit.on_support(p, **{given: data})  # warm: what the level builds once
    tracemalloc.start()
    try:
        est = fit.on_support(p, **{given: data})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    _check_support(est, p, K)
    assert peak < K * n * 8 / 3


@pytest.mark.parametrize("weight", [None, 0.37])
def test_least_squares_from_the_normal_equations(weight, rng: np.random.Generator) -> None:
    """For a union of two Kronecker products (a structured pseudo-inverse that solves
    the normal equations), the start's least-squares estimates reuse ``A_w^T y``: the
    same as applying the pseudo-inverse, and a least-squares solution."""
    from dpdask.reconstruct.structured import KronPairInverse

    A = VStack(
        [Kron([Identity(3), Total(4), Prefix(5)]), Kron([Total(3), Identity(4), Identity(5)])]
    )
    fit = children_fitter(A, weight)
    pinv = fit._pinv
    assert pinv is not None
    inner = pinv.A if weight is not None else pinv
    assert isinstance(inner, KronPairInverse)
    Y = rng.normal(size=(3, A.shape[0]))
    Yw = Y if weight is None else Y * np.sqrt(weight)
    AtY = fit.level.Aw.T.apply(Yw)
    Z = fit._least_squares(pinv, Yw, AtY)
    np.testing.assert_allclose(Z, pinv.apply(Yw), rtol=0, atol=1e-10 * np.abs(Z).max())
    M = A.dense() * (1.0 if weight is None else np.sqrt(weight))
    np.testing.assert_allclose(M.T @ (M @ Z.T), AtY.T, rtol=0, atol=1e-8 * np.abs(AtY).max())
