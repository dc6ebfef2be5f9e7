"""The working-set products, the segmented simplex projection and active-set FISTA.

Oracles independent of :mod:`dpdask.reconstruct.topdown._working_gram`: the strategy's dense
matrix and its Jacobi-scaled Gram (as in :mod:`tests.unit.test_union_gram_restricted`),
:func:`~dpdask.reconstruct.topdown._fista.project_threshold` on dense columns (the
pairs outside the working set at minus infinity), and the QP oracles of
:mod:`tests.unit.test_topdown` for whole fits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.reconstruct._union_gram import scaled_union_gram
from dpdask.reconstruct.topdown import children_fitter, fit_children
from dpdask.reconstruct.topdown._fista import project_threshold
from dpdask.reconstruct.topdown._working_gram import WorkingGram, segment_project
from tests import requires_cvxpy
from tests.unit.test_topdown import _assert_feasible, _cvxpy, _kkt_gap, _objective, _slsqp
from tests.unit.test_union_gram_restricted import _KINDS, _oracle, _union


def _mask(K: int, S: int, frac: float, rng: np.random.Generator) -> np.ndarray:
    mask = rng.uniform(size=(K, S)) < frac
    mask[rng.integers(0, K, size=S), np.arange(S)] = True  # every cell present
    return mask


def _working_set(gram: WorkingGram, mask: np.ndarray):
    cell, ch = np.nonzero(mask.T)
    return gram.working_set(ch, cell), ch, cell


@st.composite
def _cases(draw: st.DrawFn):
    d = draw(st.integers(1, 3))
    sizes = tuple(draw(st.lists(st.integers(1, 6), min_size=d, max_size=d)))
    p = draw(st.integers(1, 3))
    kind = st.sampled_from(_KINDS)
    kinds = [draw(st.lists(kind, min_size=d, max_size=d)) for _ in range(p)]
    return sizes, kinds, draw(st.integers(0, 2**32 - 1)), draw(st.floats(0.05, 1.0))


@settings(max_examples=60, deadline=None)
@given(case=_cases(), K=st.integers(1, 4), frac=st.floats(0.0, 1.0))
def test_working_products_match_dense(case, K: int, frac: float) -> None:
    """``rows`` (float32 and exact) and ``dense`` against ``U H`` with the dense
    principal submatrix, ``U`` zero off the working set."""
    sizes, kinds, seed, support = case
    rng = np.random.default_rng(seed)
    A = _union(sizes, kinds, rng)
    union = scaled_union_gram(A, np.float64)
    assert union is not None
    idx = np.flatnonzero(rng.uniform(size=A.shape[1]) < support)
    if idx.size == 0:
        idx = np.array([0])
    H = _oracle(A, idx)
    gram = WorkingGram(union, idx, K)
    ws, ch, cell = _working_set(gram, _mask(K, idx.size, frac, rng))
    v = rng.normal(size=ws.size)
    U = np.zeros((K, idx.size))
    U[ch, cell] = v
    ref = U @ H
    size = max(float(np.abs(ref).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(gram.dense(ws, v), ref, rtol=0, atol=1e-12 * size)
    np.testing.assert_allclose(gram.rows(ws, v, exact=True), ref[ch, cell], atol=1e-12 * size)
    np.testing.assert_allclose(gram.rows(ws, v), ref[ch, cell], rtol=0, atol=3e-5 * size)
    # the float32 arrays kept between products do not leak one product into the next
    np.testing.assert_allclose(gram.rows(ws, 2 * v), 2 * ref[ch, cell], atol=6e-5 * size)


@settings(max_examples=100, deadline=None)
@given(
    K=st.integers(1, 7),
    S=st.integers(1, 30),
    frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_segment_project_matches_sorting(K: int, S: int, frac: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(K, S)) * rng.uniform(0.01, 100.0, size=S)
    t = rng.uniform(1e-6, 10.0, size=S)
    mask = _mask(K, S, frac, rng)
    union = scaled_union_gram(VStack([Kron([Identity(S), Total(1)])]), np.float64)
    assert union is not None
    ws, ch, cell = _working_set(WorkingGram(union, np.arange(S), K), mask)
    got = segment_project(V[ch, cell], ws, t)
    ref = project_threshold(np.where(mask, V, -np.inf), t)[0][ch, cell]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * max(1.0, np.abs(V).max()))
    assert (got >= 0).all()
    np.testing.assert_allclose(np.bincount(cell, weights=got, minlength=S), t, rtol=1e-12)


def test_working_set_needs_every_cell() -> None:
    union = scaled_union_gram(VStack([Kron([Identity(3), Total(2)])]), np.float64)
    assert union is not None
    gram = WorkingGram(union, np.arange(3), 2)
    with pytest.raises(ValueError, match="every cell"):
        gram.working_set(np.array([0, 1]), np.array([0, 2]))


def _union_strategy(rng: np.random.Generator) -> LinearQuery:
    return VStack(
        [
            Kron([Dense(rng.normal(size=(3, 2))), Total(3), Prefix(4)]),
            Kron([Total(2), Dense(rng.normal(size=(4, 3))), Identity(4)]),
            Kron([Identity(2), Identity(3), Identity(4)]),
        ],
        weights=[1.3, 0.7, 0.4],
    )


def _sparse_family(K: int, M: np.ndarray, rng: np.random.Generator, density: float = 0.2):
    n = M.shape[1]
    X0 = rng.poisson(3.0, size=(K, n)) * (rng.uniform(size=(K, n)) < density)
    Y = X0 @ M.T + rng.normal(scale=1.5, size=(K, M.shape[0]))
    p = X0.sum(axis=0).astype(float)
    p[rng.uniform(size=n) < 0.2] = 0.0
    return Y, p


@pytest.mark.parametrize("oracle", ["slsqp", pytest.param("cvxpy", marks=requires_cvxpy)])
@pytest.mark.parametrize("density", [0.15, 0.6])
def test_active_matches_qp_oracle(oracle: str, density: float, rng: np.random.Generator) -> None:
    A = _union_strategy(rng)
    M = A.dense()
    w = np.ones(M.shape[0])
    if oracle == "slsqp":  # constant within each part: the union keeps its structure
        for sl in A.part_slices():
            w[sl] = rng.uniform(0.5, 2.0)
    Y, p = _sparse_family(3 if oracle == "slsqp" else 6, M, rng, density)
    wt = w if oracle == "slsqp" else None
    X, report = fit_children(A, Y, p, weights=wt, tol=1e-10, gram="kron", method="active")
    assert report.method == "topdown-active" and report.details["gram"] == "union"
    assert report.converged
    _assert_feasible(X, p)
    ref = (_slsqp if oracle == "slsqp" else _cvxpy)(M, Y, p, w)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, ref, w)
    assert abs(f - f_ref) <= 1e-6 * f_ref
    assert 0 <= _kkt_gap(M, Y, X, p, w) <= 1e-6 * f
    assert report.details["objective"] == pytest.approx(f, rel=1e-9)
    assert 0 <= report.details["gap"] <= 1e-6 * f


def test_active_agrees_with_fista_and_on_support(rng: np.random.Generator) -> None:
    """The same minimiser as FISTA on the whole family, from Y or Z, on the support."""
    A = _union_strategy(rng)
    M = A.dense()
    Y, p = _sparse_family(8, M, rng)
    w = np.ones(M.shape[0])
    fits = {m: children_fitter(A, tol=1e-10, gram="kron", method=m) for m in ("active", "fista")}
    Xa, Xf = fits["active"](Y, p).x, fits["fista"](Y, p).x
    fa, ff = _objective(M, Y, Xa, w), _objective(M, Y, Xf, w)
    assert abs(fa - ff) <= 1e-8 * ff
    Z = np.linalg.lstsq(M, Y.T, rcond=None)[0].T
    est = fits["active"].on_support(p, Z=Z)
    assert abs(_objective(M, Y, est.dense(M.shape[1]), w) - ff) <= 1e-8 * ff


def test_active_without_a_union_gram_is_fista(rng: np.random.Generator) -> None:
    A = Kron([Prefix(3), Dense(rng.uniform(size=(5, 4)))])
    M = A.dense()
    Y, p = _sparse_family(3, M, rng, 0.6)
    X, report = fit_children(A, Y, p, tol=1e-10, method="active")
    assert report.converged
    _assert_feasible(X, p)
    w = np.ones(M.shape[0])
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, _slsqp(M, Y, p, w), w)
    assert abs(f - f_ref) <= 1e-6 * f_ref


def test_marginals_and_the_proportional_start(rng: np.random.Generator) -> None:
    """``Level.marginals`` against a dense contraction, and the proportional split is
    feasible (each cell sums to ``t``, even where no child is positive)."""
    from dpdask.reconstruct.topdown._level import Level
    from dpdask.reconstruct.topdown._solve import proportional

    A = VStack([Kron([Identity(3), Total(4), Prefix(5)]), Kron([Total(3), Identity(4), Total(5)])])
    level = Level(A, None, "kron")
    assert level.kind == "union"
    Z = rng.normal(size=(4, 60))
    idx = np.sort(rng.choice(60, 17, replace=False))
    got = level.marginals(Z, idx)
    assert got is not None
    ref = Z.reshape(4, 3, 4, 5).sum(axis=2).reshape(4, 15)  # the (3, 5) marginal is finer
    r = scaled_union_gram(A, np.float64)._plans[0].rank_one[0][1]  # type: ignore[union-attr]
    key = np.ravel_multi_index([np.unravel_index(idx, (3, 4, 5))[a] for a in (0, 2)], (3, 5))
    np.testing.assert_allclose(got, ref[:, key] * abs(r[0]), rtol=1e-12)
    t = rng.uniform(0.5, 3.0, size=idx.size)
    W = got.copy()
    W[:, 0] = -1.0  # no positive child: an even split
    U = proportional(W, t)
    assert (U >= 0).all()
    np.testing.assert_allclose(U.sum(axis=0), t, rtol=1e-12)
    np.testing.assert_allclose(U[:, 0], t[0] / 4)
    assert Level(Kron([Prefix(3), Identity(4)]), None, "kron").marginals(Z[:, :12], idx[:3]) is None


@settings(max_examples=100, deadline=None)
@given(
    K=st.integers(1, 6),
    S=st.integers(1, 25),
    frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_whole_family_kkt_through_the_working_set(K: int, S: int, frac: float, seed: int) -> None:
    """The KKT residual from the working set (with the pairs off it that could bind)
    equals the dense one, ``||U - P(U - R)|| / sqrt(K S)``."""
    from dpdask.reconstruct.topdown._active import _kkt

    rng = np.random.default_rng(seed)
    t = rng.uniform(0.01, 5.0, size=S)
    mask = _mask(K, S, frac, rng)
    union = scaled_union_gram(VStack([Kron([Identity(S), Total(1)])]), np.float64)
    assert union is not None
    ws, ch, cell = _working_set(WorkingGram(union, np.arange(S), K), mask)
    u = segment_project(rng.normal(size=ws.size) * 3, ws, t)
    U = np.zeros((K, S))
    U[ch, cell] = u
    R = rng.normal(size=(K, S)) * rng.uniform(0.1, 4.0)
    dense = np.linalg.norm(U - project_threshold(U - R, t)[0]) / np.sqrt(K * S)
    assert _kkt(ws, u, R, t) == pytest.approx(dense, rel=1e-10, abs=1e-13)
