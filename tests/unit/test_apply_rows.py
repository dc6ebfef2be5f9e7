"""``dpdask.linalg.apply_rows`` on sparse chunks: the operator's answers, part by part.

Oracle: the dense matrix of the operator (``op.dense()``) times the dense rows; for the
marginal path on integer counts, exact equality with the integer product where the
operator's entries are integers.
"""

from __future__ import annotations

import numpy as np
import pytest
import sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import dpdask.linalg._geo as geo
from dpdask.linalg import Dense, Identity, Kron, Prefix, Scaled, Total, VStack, apply_rows
from dpdask.strategy._marginals import WeightedMarginals

SIZES = (2, 3, 4)


def _operators():
    a, b, c = SIZES
    return {
        "total-kron": Kron([Total(a), Identity(b), Prefix(c)]),
        "all-totals": Kron([Total(a), Total(b), Total(c)]),
        "no-totals": Kron([Identity(a), Prefix(b), Identity(c)]),
        "union": VStack(
            [
                Kron([Total(a), Identity(b), Total(c)]),
                Scaled(Kron([Identity(a), Total(b), Prefix(c)]), 0.5),
                Identity(a * b * c),
            ],
            weights=[1.0, 2.0, 3.0],
        ),
        "weighted-total": Kron([Dense(np.array([[2.0, 2.0]])), Identity(b), Total(c)]),
        "marginals": WeightedMarginals(SIZES, np.linspace(0.1, 0.8, 8)),
    }


def _chunk(rng, g=7, density=0.2, dtype=np.int64):
    n = int(np.prod(SIZES))
    x = rng.integers(0, 9, size=(g, n)) * (rng.random((g, n)) < density)
    x[3] = 0
    return x.astype(dtype)


@pytest.mark.parametrize("name", sorted(_operators()))
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_sparse_rows_are_the_dense_product(rng, name, dtype):
    op = _operators()[name]
    x = _chunk(rng, dtype=dtype)
    want = x.astype(np.float64) @ op.dense().T
    got = apply_rows(op, sparse.COO.from_numpy(x))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(apply_rows(op, x), want, rtol=1e-13, atol=1e-12)


def test_integer_marginals_are_exact(rng):
    op = _operators()["union"]
    x = _chunk(rng) * 10**9  # sums far beyond float32, within float64's integers
    M = op.dense()
    integer_rows = np.all(M == np.round(M), axis=1)
    got = apply_rows(op, sparse.COO.from_numpy(x), exact_only=True)
    exact = (x.astype(object) @ M.astype(np.int64).astype(object).T)[:, integer_rows]
    assert np.array_equal(got[:, integer_rows].astype(np.int64), exact.astype(np.int64))


def test_marginal_path_is_taken_and_bounded(rng, monkeypatch):
    """A part with totals never forms dense rows; a marginal above the batch does."""
    op = _operators()["total-kron"]
    x = sparse.COO.from_numpy(_chunk(rng))
    calls = []
    real = geo._dense_batches
    monkeypatch.setattr(geo, "_dense_batches", lambda o, c: calls.append(o) or real(o, c))
    apply_rows(op, x)
    assert calls == []
    monkeypatch.setattr(geo, "DENSE_BATCH_CELLS", 1)
    apply_rows(op, x)
    assert calls == [op]


def test_float_entries_under_exact_only_go_dense(rng, monkeypatch):
    calls = []
    real = geo._dense_batches
    monkeypatch.setattr(geo, "_dense_batches", lambda o, c: calls.append(o) or real(o, c))
    op = _operators()["total-kron"]
    x = sparse.COO.from_numpy(_chunk(rng, dtype=np.float64))
    apply_rows(op, x, exact_only=True)
    assert calls == [op]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    thetas=st.lists(st.floats(0.0, 2.0), min_size=8, max_size=8).filter(lambda t: any(t)),
)
def test_weighted_marginals_property(seed, thetas):
    rng = np.random.default_rng(seed)
    op = WeightedMarginals(SIZES, np.array(thetas))
    x = _chunk(rng, g=4, density=0.3)
    np.testing.assert_allclose(
        apply_rows(op, sparse.COO.from_numpy(x)), x @ op.dense().T, rtol=1e-12, atol=1e-10
    )
