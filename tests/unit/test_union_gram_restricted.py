"""The restricted union Gram against the dense principal submatrix.

The oracle is independent of :mod:`dpdask.reconstruct._union_gram`: the strategy's
dense matrix ``M``, its Gram ``M^T M``, the Jacobi scale from its diagonal, and the
submatrix indexed ``[idx][:, idx]``. Random unions of Kronecker products (identity,
total, prefix, rank-one, low-rank and dense factors, weighted parts, attributes of one
cell) and random supports, in float64 and float32; both ways of applying a part's
marginal (restricted to the cells reached, and the whole marginal) are forced; the
top-down level's support products (rows, one child's subset, the batched subsets) are
checked on the same oracle, and a children's fit through it against Clarabel.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpdask.reconstruct._union_gram as union_gram
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Ones, Prefix, Total, VStack
from dpdask.reconstruct._union_gram import scaled_union_gram
from dpdask.reconstruct.topdown import fit_children
from dpdask.reconstruct.topdown._level import Level
from tests import requires_cvxpy
from tests.unit.test_topdown import _assert_feasible, _cvxpy, _objective, _problem

_KINDS = ("identity", "total", "prefix", "rank1", "lowrank", "dense")


def _factor(kind: str, n: int, rng: np.random.Generator) -> LinearQuery:
    if kind == "identity":
        return Identity(n)
    if kind == "total":
        return Total(n)
    if kind == "prefix":
        return Prefix(n)
    if kind == "rank1":  # one row, not constant: a rank-one Gram that is not a total
        return Dense(rng.uniform(0.5, 2.0, size=(1, n)))
    if kind == "lowrank":
        return Dense(rng.normal(size=(max(1, n // 3), n)))
    return Dense(rng.normal(size=(n + 1, n)))


def _union(sizes: tuple[int, ...], kinds: list[list[str]], rng: np.random.Generator) -> VStack:
    parts = [Kron([_factor(k, n, rng) for k, n in zip(ks, sizes, strict=True)]) for ks in kinds]
    return VStack(parts, weights=list(rng.uniform(0.2, 2.0, size=len(parts))))


def _oracle(A: LinearQuery, idx: np.ndarray) -> np.ndarray:
    """``(S G S)[idx, idx]`` from the dense strategy."""
    M = np.asarray(A.dense(), dtype=float)
    G = M.T @ M
    d = np.diag(G)
    s = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)
    H = s[:, None] * G * s[None, :]
    return H[np.ix_(idx, idx)]


def _check(A: LinearQuery, idx: np.ndarray, rng: np.random.Generator) -> None:
    op = scaled_union_gram(A, np.float32)
    assert op is not None
    H = _oracle(A, idx)
    U = rng.normal(size=(3, idx.size))
    ref = U @ H
    size = max(float(np.abs(ref).max(initial=0.0)), 1.0)
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        restricted = op.restricted(idx, dtype)
        got = restricted.rows(U)
        assert got.dtype == np.dtype(dtype)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * size)
        if idx.size:
            np.testing.assert_allclose(restricted(U[0]), ref[0], rtol=0, atol=rtol * size)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[tuple[int, ...], list[list[str]], int, float]:
    d = draw(st.integers(1, 3))
    sizes = tuple(draw(st.lists(st.integers(1, 6), min_size=d, max_size=d)))
    p = draw(st.integers(1, 3))
    kind = st.sampled_from(_KINDS)
    kinds = [draw(st.lists(kind, min_size=d, max_size=d)) for _ in range(p)]
    return sizes, kinds, draw(st.integers(0, 2**32 - 1)), draw(st.floats(0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(case=_cases(), threshold=st.sampled_from([0.0, 0.3, 2.0]))
def test_restricted_matches_dense_principal_submatrix(
    case: tuple[tuple[int, ...], list[list[str]], int, float], threshold: float
) -> None:
    """Random unions and supports; the marginal applied whole (threshold 0), restricted
    to the cells reached (threshold 2) or as chosen (0.3)."""
    sizes, kinds, seed, frac = case
    rng = np.random.default_rng(seed)
    A = _union(sizes, kinds, rng)
    n = A.shape[1]
    idx = np.flatnonzero(rng.uniform(size=n) < frac)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(union_gram, "_RESTRICT_FULL", threshold)
        _check(A, idx, rng)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 2.0])
@pytest.mark.parametrize("frac", [0.02, 0.3, 1.0])
def test_restricted_opt_plus_shape(threshold: float, frac: float, rng: np.random.Generator) -> None:
    """HDMM's OPT_+ form on a 2 x 2 x 7 x 3 x 9 domain (totals out on some attributes,
    full-rank factors on the others, an identity part), sparse to full supports."""
    sizes = (2, 2, 7, 3, 9)
    kinds = [
        ["dense", "dense", "dense", "total", "dense"],
        ["dense", "total", "total", "dense", "prefix"],
        ["identity"] * 5,
    ]
    A = _union(sizes, kinds, rng)
    idx = np.flatnonzero(rng.uniform(size=A.shape[1]) < frac)
    if idx.size == 0:
        idx = np.array([5])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(union_gram, "_RESTRICT_FULL", threshold)
        _check(A, idx, rng)


def test_restricted_marginal_cells_scale_with_support(rng: np.random.Generator) -> None:
    """Each part reaches at most ``|idx|`` cells of its marginal, and a part that totals
    attributes out reaches at most its marginal's size."""
    A = _union((3, 4, 5), [["dense", "total", "dense"], ["total", "total", "prefix"]], rng)
    idx = np.sort(rng.choice(A.shape[1], 12, replace=False))
    op = scaled_union_gram(A)
    assert op is not None
    parts = op.restricted(idx)._parts
    assert [p.nm for p in parts] == [15, 5]
    assert all(p.m <= min(idx.size, p.nm) for p in parts)


def test_restricted_rejects_cells_outside_the_domain() -> None:
    A = VStack([Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)])])
    op = scaled_union_gram(A)
    assert op is not None
    for bad in (np.array([6]), np.array([-1]), np.zeros((2, 2), dtype=int)):
        with pytest.raises(ValueError, match="cell indices"):
            op.restricted(bad)


def test_support_gram_products_on_a_union_level(rng: np.random.Generator) -> None:
    """A top-down level with a union Gram: ``rows``, ``fast_rows``, ``sub`` and
    ``batched`` on a parent's support agree with the dense submatrix."""
    A = _union((3, 5, 6), [["dense", "total", "prefix"], ["total", "dense", "identity"]], rng)
    level = Level(A, None, "kron")
    assert level.kind == "union"
    idx = np.sort(rng.choice(A.shape[1], 40, replace=False))
    H = _oracle(A, idx)
    gram = level.support(idx)
    U = rng.uniform(size=(4, idx.size))
    np.testing.assert_allclose(gram.rows(U), U @ H, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gram.fast_rows(U), U @ H, rtol=1e-5, atol=1e-5)
    local = np.sort(rng.choice(idx.size, 15, replace=False))
    v = rng.uniform(size=local.size)
    np.testing.assert_allclose(gram.sub(local, np.float64)(v), H[np.ix_(local, local)] @ v)
    locals_ = [np.sort(rng.choice(idx.size, k, replace=False)) for k in (3, 0, 20)]
    batch = gram.batched(locals_, np.float64)
    assert batch is not None
    vs = [rng.uniform(size=loc.size) for loc in locals_]
    want = np.concatenate([H[np.ix_(loc, loc)] @ x for loc, x in zip(locals_, vs, strict=True)])
    np.testing.assert_allclose(batch(np.concatenate(vs)), want, rtol=1e-12, atol=1e-12)


def test_ones_factor_of_several_rows(rng: np.random.Generator) -> None:
    """A factor of repeated total rows (``Ones(n, m)``: Gram ``m`` times all-ones, rank
    one) is contracted like a total."""
    A = VStack([Kron([Ones(4, 3), Dense(rng.normal(size=(5, 5)))]), Kron([Identity(4), Total(5)])])
    idx = np.array([0, 3, 7, 8, 12, 19])
    _check(A, idx, rng)


@requires_cvxpy
@pytest.mark.parametrize("method", ["fista", "newton"])
def test_union_restricted_fit_matches_oracle(method: str, rng: np.random.Generator) -> None:
    """A weighted union of Kronecker products over three attributes (totals, prefixes,
    dense factors, an identity part), a sparse parent: the fit through the restricted
    union Gram agrees with Clarabel (through cvxpy) to 1e-6 relative."""
    A = VStack(
        [
            Kron([Dense(rng.normal(size=(3, 2))), Total(3), Prefix(4)]),
            Kron([Total(2), Dense(rng.normal(size=(4, 3))), Identity(4)]),
            Kron([Identity(2), Identity(3), Identity(4)]),
        ],
        weights=[1.3, 0.7, 0.4],
    )
    M = A.dense()
    w = np.ones(M.shape[0])
    Y, p = _problem(4, 24, M, rng)
    p[rng.uniform(size=24) < 0.4] = 0.0
    X, report = fit_children(A, Y, p, tol=1e-10, gram="kron", method=method)
    assert report.details["gram"] == "union"
    assert report.converged
    _assert_feasible(X, p)
    f, f_ref = _objective(M, Y, X, w), _objective(M, Y, _cvxpy(M, Y, p, w), w)
    assert abs(f - f_ref) <= 1e-6 * f_ref


def test_nnls_inner_solves_restricted_to_the_free_set(rng: np.random.Generator) -> None:
    """NNLS on a union strategy takes its inner products restricted to the free set
    (``details["restricted"]``) and still reaches scipy's active-set NNLS objective."""
    from scipy.optimize import nnls as scipy_nnls

    from dpdask.reconstruct import nnls

    A = _union((3, 4, 5), [["dense", "total", "prefix"], ["total", "dense", "identity"]], rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.2, rng.poisson(4.0, size=A.shape[1]), 0)
    y = M @ x + rng.normal(scale=1.5, size=M.shape[0])
    est = nnls(A, y, tol=1e-11)
    assert est.report.converged and est.report.details["union_float32"]
    assert est.report.details["restricted"] > 0
    ref = scipy_nnls(M, y)[0]
    # (the union may be rank deficient: the same fit, not necessarily the same x)
    f, f_ref = (float(np.sum((M @ v - y) ** 2)) for v in (est.x, ref))
    assert (est.x >= 0).all() and abs(f - f_ref) <= 1e-8 * f_ref
