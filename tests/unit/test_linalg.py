"""Implicit operators against dense matrices built independently, entry by entry."""

from __future__ import annotations

import itertools

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

from dpdask.linalg import (
    AllRange,
    Dense,
    Diagonal,
    Identity,
    Kron,
    Ones,
    Prefix,
    RangeQueries,
    Sparse,
    Total,
    VStack,
    aslinearquery,
)


def _range_rows(n: int, intervals: list[tuple[int, int]]) -> np.ndarray:
    M = np.zeros((len(intervals), n))
    for r, (a, b) in enumerate(intervals):
        for j in range(n):
            if a <= j <= b:
                M[r, j] = 1.0
    return M


def _oracle(name: str, n: int) -> tuple[object, np.ndarray]:
    """The operator and its dense matrix written out by definition."""
    if name == "identity":
        return Identity(n), np.array([[float(i == j) for j in range(n)] for i in range(n)])
    if name == "total":
        return Total(n), np.ones((1, n))
    if name == "ones3":
        return Ones(n, 3), np.ones((3, n))
    if name == "prefix":
        return Prefix(n), _range_rows(n, [(0, i) for i in range(n)])
    if name == "allrange":
        return AllRange(n), _range_rows(n, [(i, j) for i in range(n) for j in range(i, n)])
    if name == "ranges":
        one = min(1, n - 1)
        iv = [(0, n - 1), (one, one), (0, 0), (n // 2, n - 1), (one, max(one, n - 2))]
        return RangeQueries(n, [a for a, _ in iv], [b for _, b in iv]), _range_rows(n, iv)
    if name == "diagonal":
        d = np.arange(n) - 1.5
        M = np.zeros((n, n))
        for i in range(n):
            M[i, i] = d[i]
        return Diagonal(d), M
    raise KeyError(name)


PRIMITIVES = ["identity", "total", "ones3", "prefix", "allrange", "ranges", "diagonal"]


@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_primitive_equals_definition(name: str, n: int, rng: np.random.Generator) -> None:
    op, M = _oracle(name, n)
    np.testing.assert_array_equal(op.dense(), M)
    x = rng.normal(size=n)
    y = rng.normal(size=M.shape[0])
    X = rng.normal(size=(n, 3))
    np.testing.assert_allclose(op @ x, M @ x, atol=1e-12)
    np.testing.assert_allclose(op.T @ y, M.T @ y, atol=1e-12)
    np.testing.assert_allclose(op @ X, M @ X, atol=1e-12)
    np.testing.assert_allclose(op.gram().dense(), M.T @ M, atol=1e-12)
    np.testing.assert_allclose(op.pinv().dense(), np.linalg.pinv(M), atol=1e-10)
    assert op.sensitivity(1) == pytest.approx(np.abs(M).sum(axis=0).max())
    assert op.sensitivity(2) == pytest.approx(np.sqrt((M**2).sum(axis=0)).max())
    np.testing.assert_allclose(op.column_norms(1), np.abs(M).sum(axis=0))


def test_kron_acts_factor_by_factor(rng: np.random.Generator) -> None:
    A, B, C = rng.normal(size=(2, 3)), rng.normal(size=(4, 2)), rng.normal(size=(3, 4))
    K = Kron([Dense(A), Dense(B), Dense(C)])
    x = rng.normal(size=(3, 2, 4))
    # the product query (r, s, t) = sum_{ijk} A[r,i] B[s,j] C[t,k] x[i,j,k]
    expected = np.einsum("ri,sj,tk,ijk->rst", A, B, C, x).ravel()
    np.testing.assert_allclose(K @ x.ravel(), expected)
    np.testing.assert_allclose(K.dense(), np.kron(np.kron(A, B), C))


def test_marginal_is_a_sum_over_axes(rng: np.random.Generator) -> None:
    x = rng.integers(0, 9, size=(2, 3, 4)).astype(float)
    K = Kron([Identity(2), Total(3), Identity(4)])
    np.testing.assert_array_equal(K @ x.ravel(), x.sum(axis=1).ravel())


def test_vstack_with_weights(rng: np.random.Generator) -> None:
    x = rng.normal(size=6)
    W = VStack([Identity(6), Total(6), Prefix(6)], weights=[2.0, -1.0, 0.5], names=["i", "t", "p"])
    expected = np.concatenate([2 * x, [-x.sum()], 0.5 * np.cumsum(x)])
    np.testing.assert_allclose(W @ x, expected)
    assert W.names == ("i", "t", "p")
    assert [s.stop - s.start for s in W.part_slices()] == [6, 1, 6]
    # column j: 2 (identity) + 1 (total) + 0.5 * (6 - j) prefix rows
    l1 = 2 + 1 + 0.5 * (6 - np.arange(6))
    assert W.sensitivity(1) == pytest.approx(l1.max())
    l2 = np.sqrt(4 + 1 + 0.25 * (6 - np.arange(6)))
    assert W.sensitivity(2) == pytest.approx(l2.max())


def test_union_sensitivity_takes_the_max_over_cells_not_parts() -> None:
    # part 1 is heavy on cell 0 of axis a, part 2 on cell 1 of axis b: the max of the sum
    # is attained at a cell neither part maximises alone
    p1 = Kron([Dense([[3.0, 0.0]]), Dense([[1.0, 1.0]])])
    p2 = Kron([Dense([[1.0, 1.0]]), Dense([[0.0, 3.0]])])
    W = VStack([p1, p2])
    M = W.dense()
    assert W.sensitivity(1) == pytest.approx(np.abs(M).sum(0).max()) == pytest.approx(6.0)


def test_sensitivity_of_big_union_does_not_materialise() -> None:
    # all 2-way marginals over 8 attributes of size 10: 10^8 cells
    n, d = 10, 8
    parts = []
    for i, j in itertools.combinations(range(d), 2):
        parts.append(Kron([Identity(n) if k in (i, j) else Total(n) for k in range(d)]))
    W = VStack(parts)
    assert W.shape[1] == 10**8
    # every cell lies in exactly one cell of each of the 28 marginals
    assert W.sensitivity(1) == pytest.approx(28.0)
    assert W.sensitivity(2) == pytest.approx(np.sqrt(28.0))
    with pytest.raises(MemoryError, match="refusing to materialise"):
        W.dense()


def test_apply_to_geographies_and_dask(rng: np.random.Generator) -> None:
    K = VStack([Kron([Prefix(3), Identity(4)]), Kron([Total(3), AllRange(4)])])
    X = rng.integers(0, 5, size=(7, 3, 4))
    M = K.dense()
    expected = X.reshape(7, -1) @ M.T
    np.testing.assert_allclose(K.apply(X), expected)
    Xd = da.from_array(X, chunks=(3, 3, 4))
    out = K @ Xd
    assert out.chunks[0] == (3, 3, 1)
    assert out.name.startswith("matvec-")
    np.testing.assert_allclose(out.compute(), expected)


def test_explicit_inputs(rng: np.random.Generator) -> None:
    M = rng.normal(size=(4, 5)) * (rng.random((4, 5)) > 0.5)
    x = rng.normal(size=5)
    for op in (aslinearquery(M), aslinearquery(sp.csr_matrix(M)), Sparse(sparse.COO(M))):
        np.testing.assert_allclose(op @ x, M @ x)
        np.testing.assert_allclose(x[:4] @ op, x[:4] @ M)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Identity(0), "positive integer"),
        (lambda: RangeQueries(4, [2], [1]), "lo <= hi"),
        (lambda: VStack([Identity(2), Identity(3)]), "different numbers of columns"),
        (lambda: VStack([Identity(2)], weights=[1.0, 2.0]), "weights"),
        (lambda: Identity(3) @ np.ones(4), "shape mismatch"),
        (lambda: Identity(3).sensitivity(3), "p = 1 and p = 2"),
        (lambda: Diagonal([1.0, np.nan]), "finite"),
    ],
)
def test_bad_arguments_raise(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_prefix_gram_closed_form_large_is_implicit() -> None:
    G = Prefix(5000).gram()
    x = np.zeros(5000)
    x[0] = 1.0
    # column 0 of P^T P: (P^T P)_{i0} = n - max(i, 0) = n - i
    np.testing.assert_allclose(G @ x, 5000 - np.arange(5000))


@pytest.mark.parametrize("rank_deficient", [False, True])
def test_gram_root_has_same_gram_and_sensitivity(rank_deficient: bool, rng) -> None:
    from dpdask.linalg import gram_root

    D = rng.normal(size=(6, 3))
    if rank_deficient:
        D[:, 2] = D[:, 0] + D[:, 1]
    A = Kron([VStack([Identity(2), Total(2)]), Dense(D), Prefix(4)])
    B = gram_root(A)
    M, R = A.dense(), B.dense()
    assert R.shape[0] <= A.shape[1]
    np.testing.assert_allclose(R.T @ R, M.T @ M, atol=1e-9)
    assert B.sensitivity(2) == pytest.approx(np.linalg.norm(M, axis=0).max())
