"""Sparse aggregation and conversions against dense oracles (NumPy and aggregate_rows)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpdask.errors import ArgumentError, ShapeError
from dpdask.store import aggregate_sparse, densify, prefer_dense, sparsify
from dpdask.store._aggregate import aggregate_rows


def _partition(draw, n: int) -> tuple[int, ...]:
    """Chunk sizes adding up to ``n``; zero-length chunks allowed."""
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    return tuple(np.diff([0, *cuts, n]).tolist()) if n else (0,)


@st.composite
def cases(draw):
    n_in = draw(st.integers(0, 30))
    n_out = draw(st.integers(1, 8))
    n_cells = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    ancestors = rng.integers(0, n_out, n_in)
    if draw(st.booleans()):
        ancestors = np.sort(ancestors)  # the canonical order: parents contiguous
    density = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    x = rng.integers(-3, 6, size=(n_in, n_cells)) * (rng.random((n_in, n_cells)) < density)
    if n_in:
        x[rng.integers(0, n_in)] = 0  # a unit with no entries
    if draw(st.booleans()):
        x = x + rng.normal(size=x.shape) * (x != 0)  # float estimates
    return (
        x,
        ancestors,
        n_out,
        _partition(draw, n_in),
        _partition(draw, n_out),
        draw(st.integers(2, 4)),
    )


def _oracle(x: np.ndarray, ancestors: np.ndarray, n_out: int) -> np.ndarray:
    out = np.zeros((n_out, x.shape[1]), dtype=np.int64 if x.dtype.kind in "iu" else np.float64)
    np.add.at(out, ancestors, x)
    return out


def _as_sparse(x: np.ndarray, chunks: tuple[int, ...]) -> da.Array:
    return da.from_array(sparse.COO.from_numpy(x), chunks=(chunks, x.shape[1]), asarray=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_aggregate_sparse_equals_dense_aggregation(case):
    x, ancestors, n_out, in_chunks, out_chunks, split_every = case
    got = aggregate_sparse(
        _as_sparse(x, in_chunks), ancestors, out_chunks, "agg", split_every=split_every
    )
    dense = aggregate_rows(
        da.from_array(x, chunks=(in_chunks, x.shape[1])),
        ancestors,
        out_chunks,
        "agg",
        split_every=split_every,
    ).compute()
    assert got.chunks == (out_chunks, (x.shape[1],)) and got.dtype == dense.dtype
    assert isinstance(got._meta, sparse.COO)
    blocks = [b.compute() for b in got.to_delayed().ravel()]
    for block, rows in zip(blocks, out_chunks, strict=True):
        assert isinstance(block, sparse.COO) and block.shape == (rows, x.shape[1])
        assert block.dtype == dense.dtype and (block.data != 0).all()
        linear = block.coords[0] * block.shape[1] + block.coords[1]
        assert (np.diff(linear) > 0).all()  # sorted row-major, no repeats
    result = np.concatenate([b.todense() for b in blocks])
    np.testing.assert_allclose(result, dense, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result, _oracle(x, ancestors, n_out), rtol=1e-12, atol=1e-12)


def test_graph_names_and_parents_spanning_chunks(rng):
    # 40 units, 4 parents of 10; input chunks of 3 units straddle parents, and
    # each output chunk draws on more than split_every partials (a combine tree)
    x = rng.integers(0, 3, size=(40, 5)) * (rng.random((40, 5)) < 0.3)
    ancestors = np.repeat(np.arange(4), 10)
    chunks = (3,) * 13 + (1,)
    y = aggregate_sparse(_as_sparse(x, chunks), ancestors, (3, 1), "agg-county", split_every=2)
    prefixes = {str(k[0]).rsplit("-", 1)[0] for k in dict(y.__dask_graph__())}
    assert {"agg-county-partial", "agg-county-combine", "agg-county"} <= prefixes
    np.testing.assert_array_equal(y.compute().todense(), _oracle(x, ancestors, 4))


def test_dense_blocks_are_accepted(rng):
    x = rng.integers(0, 4, size=(9, 6))
    y = aggregate_sparse(da.from_array(x, chunks=(4, 6)), np.arange(9) // 3, (2, 1), "agg")
    np.testing.assert_array_equal(y.compute().todense(), _oracle(x, np.arange(9) // 3, 3))


def test_aggregate_sparse_errors(rng):
    x = _as_sparse(rng.integers(0, 2, size=(6, 3)), (6,))
    with pytest.raises(ArgumentError, match="split_every"):
        aggregate_sparse(x, np.zeros(6, int), (1,), "agg", split_every=1)
    with pytest.raises(ShapeError, match="5 ancestors for 6 rows"):
        aggregate_sparse(x, np.zeros(5, int), (1,), "agg")
    with pytest.raises(ShapeError, match=r"outside 0\.\.1"):
        aggregate_sparse(x, np.array([0, 0, 1, 1, 2, 2]), (2,), "agg")
    with pytest.raises(ShapeError, match="must be 2-D"):
        aggregate_sparse(da.zeros((6, 2, 2), chunks=3), np.zeros(6, int), (1,), "agg")


def test_sparse_rows_over_a_billion_cells():
    coords = np.array([[0, 0, 1, 2, 3], [7, 10**9 - 1, 7, 5, 10**9 - 1]])
    x = sparse.COO(coords, np.array([1, 2, 3, 4, 5]), shape=(4, 10**9))
    y = aggregate_sparse(
        da.from_array(x, chunks=(2, 10**9), asarray=False), np.array([0, 0, 0, 1]), (1, 1), "agg"
    ).compute()
    assert y.shape == (2, 10**9) and y.nnz == 4
    assert (y[0, 7], y[0, 10**9 - 1], y[0, 5], y[1, 10**9 - 1]) == (4, 2, 4, 5)


@pytest.mark.parametrize("shape", [(2, 3, 4), (24,)])
def test_densify_and_sparsify_round_trip(rng, shape):
    x = rng.integers(0, 3, size=(11, *shape)) * (rng.random((11, *shape)) < 0.3)
    d = da.from_array(x, chunks=(4, *shape))
    s = sparsify(d)
    assert s.shape == (11, 24) and isinstance(s._meta, sparse.COO) and s.chunks[0] == (4, 4, 3)
    assert s.name.startswith("sparsify-")
    np.testing.assert_array_equal(s.compute().todense(), x.reshape(11, 24))
    back = densify(s, shape)
    assert back.chunks[0] == (4, 4, 3) and back.shape == x.shape
    assert isinstance(back._meta, np.ndarray) and back.name.startswith("densify-")
    np.testing.assert_array_equal(back.compute(), x)
    np.testing.assert_array_equal(densify(s).compute(), x.reshape(11, 24))
    with pytest.raises(ShapeError, match="does not hold 24 cells"):
        densify(s, (5, 5))


@pytest.mark.parametrize(
    ("nnz", "n_units", "n_cells", "itemsize"),
    [(0, 1, 1, 8), (10, 4, 8, 8), (11, 4, 8, 8), (1000, 25_000, 492_660, 4), (2, 1, 64, 8)],
)
def test_prefer_dense_compares_bytes(nnz, n_units, n_cells, itemsize):
    dense_bytes = n_units * n_cells * itemsize
    entry_bytes = nnz * (8 + 8 + itemsize)  # two int64 coordinates and the value
    assert prefer_dense(nnz, n_units, n_cells, itemsize) == (dense_bytes <= entry_bytes)


def test_prefer_dense_errors():
    with pytest.raises(ArgumentError, match="nnz must be non-negative"):
        prefer_dense(-1, 2, 3)
    with pytest.raises(ArgumentError, match="itemsize must be positive"):
        prefer_dense(1, 2, 3, itemsize=0)
