"""Sparse counts in Dask: ``sparse.COO`` blocks of rows over flat cells, summed lazily.

At fine geography levels most cells of most units are zero, so a level is a Dask
array of shape ``(n_units, n_cells)`` (cells flattened in C order over the domain)
whose blocks are 2-D :class:`sparse.COO` arrays, coordinates sorted row-major. Memory
then grows with the entries, not with units x cells.

* :func:`aggregate_sparse` sums rows by ancestor, with the graph of
  :func:`~dpdask.store._aggregate.aggregate_rows` (``<name>-partial``,
  ``<name>-combine``, ``<name>``) and sparse blocks all along;
* :func:`prefer_dense` tells whether a level is smaller dense, and :func:`densify`
  / :func:`sparsify` convert between sparse and dense blocks ("dense only where it
  is smaller").

The partial sums inside are plain sorted ``(rows, cells, values)`` triples, added
with NumPy (no Numba compilation on first use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import dask.array as da
import numpy as np
import numpy.typing as npt
import sparse
from dask.base import tokenize

from dpdask.errors import ArgumentError, ShapeError
from dpdask.store._aggregate import _acc_dtype, graph_array

__all__ = ["aggregate_sparse", "coo_rows", "densify", "prefer_dense", "sparse_meta", "sparsify"]

# (rows, cells, values): sorted by (row, cell), no repeated (row, cell), no zero value
_Triples: TypeAlias = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[Any]]
_KEY_LIMIT = 2**62  # row span x cells below this: one int64 sort key


def prefer_dense(nnz: int, n_units: int, n_cells: int, itemsize: int = 8) -> bool:
    """Whether ``n_units x n_cells`` values take no more room dense than as ``nnz`` entries.

    An entry costs two int64 coordinates and its value (``16 + itemsize`` bytes); a
    dense value ``itemsize`` bytes. The entries of a level are at most those of any
    finer level, so the finest level's ``nnz`` is a safe bound for every level.

    Parameters
    ----------
    nnz : int
        Number of non-zero values (or an upper bound).
    n_units, n_cells : int
        Rows and flat cells of the level.
    itemsize : int
        Bytes per value (8 for int64 counts and float64 estimates).

    Returns
    -------
    bool
        True when the dense array is at most the size of the entries.

    Examples
    --------
    >>> prefer_dense(nnz=1_000, n_units=25_000, n_cells=492_660)
    False
    >>> prefer_dense(nnz=8_000_000, n_units=52, n_cells=252)
    True
    """
    for name, value in (("nnz", nnz), ("n_units", n_units), ("n_cells", n_cells)):
        if int(value) < 0:
            raise ArgumentError(f"{name} must be non-negative, got {value}")
    if int(itemsize) < 1:
        raise ArgumentError(f"itemsize must be positive, got {itemsize}")
    return int(n_units) * int(n_cells) * int(itemsize) <= int(nnz) * (16 + int(itemsize))


def sparse_meta(dtype: npt.DTypeLike) -> sparse.COO:
    """An empty 2-D :class:`sparse.COO` of ``dtype``: the ``meta`` of sparse Dask arrays."""
    # sorted and unique (it is empty): the flags spare the constructor a numba-compiled
    # check, about a second of compilation in every process that makes one
    return sparse.COO(
        np.empty((2, 0), dtype=np.int64), np.empty(0, dtype=dtype), shape=(0, 0), fill_value=0,
        sorted=True, has_duplicates=False,
    )  # fmt: skip


def coo_rows(
    rows: npt.NDArray[np.integer[Any]],
    cells: npt.NDArray[np.integer[Any]],
    values: npt.NDArray[Any],
    n_rows: int,
    n_cells: int,
) -> sparse.COO:
    """A ``(n_rows, n_cells)`` COO from entries already sorted by (row, cell), unique."""
    coords = np.empty((2, rows.size), dtype=np.int64)
    coords[0], coords[1] = rows, cells
    return sparse.COO(
        coords,
        values,
        shape=(int(n_rows), int(n_cells)),
        has_duplicates=False,
        sorted=True,
        fill_value=0,
    )


def _triples(block: sparse.COO | npt.NDArray[Any]) -> _Triples:
    """The entries of a 2-D block (COO or dense), in row-major order."""
    if isinstance(block, sparse.COO):
        return block.coords[0], block.coords[1], block.data
    block = np.asarray(block)
    block = block.reshape(block.shape[0], int(np.prod(block.shape[1:], dtype=np.int64)))
    rows, cells = np.nonzero(block)
    return rows, cells, block[rows, cells]


def _coalesce(
    rows: npt.NDArray[Any], cells: npt.NDArray[Any], values: npt.NDArray[Any], n_cells: int
) -> _Triples:
    """Sort entries by (row, cell), add repeated ones and drop zero sums."""
    if rows.size == 0:
        return rows.astype(np.int64), cells.astype(np.int64), values
    rows, cells = rows.astype(np.int64, copy=False), cells.astype(np.int64, copy=False)
    r0 = int(rows.min())
    if (int(rows.max()) - r0 + 1) * max(int(n_cells), 1) < _KEY_LIMIT:
        key = (rows - r0) * int(n_cells) + cells
        if key.size > 1 and not (key[1:] > key[:-1]).all():
            order = np.argsort(key, kind="stable")
            key, rows, cells, values = key[order], rows[order], cells[order], values[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    else:
        order = np.lexsort((cells, rows))
        rows, cells, values = rows[order], cells[order], values[order]
        starts = np.flatnonzero(np.r_[True, (rows[1:] != rows[:-1]) | (cells[1:] != cells[:-1])])
    if starts.size < rows.size:
        values = np.add.reduceat(values, starts)
        rows, cells = rows[starts], cells[starts]
    keep = values != 0
    if not keep.all():
        rows, cells, values = rows[keep], cells[keep], values[keep]
    return rows, cells, values


def _partial(
    block: sparse.COO | npt.NDArray[Any], ancestors: npt.NDArray[np.int64], dtype: np.dtype[Any]
) -> _Triples:
    """The entries of ``block`` summed by the ancestor of their row."""
    rows, cells, values = _triples(block)
    n_cells = block.shape[1] if block.ndim == 2 else int(np.prod(block.shape[1:]))
    return _coalesce(ancestors[rows], cells, values.astype(dtype, copy=False), n_cells)


def _restrict(part: _Triples, lo: int, hi: int) -> _Triples:
    rows, cells, values = part
    a, b = np.searchsorted(rows, [lo, hi])
    return rows[a:b], cells[a:b], values[a:b]


def _merge(parts: list[_Triples], lo: int, hi: int, n_cells: int) -> _Triples:
    parts = [_restrict(p, lo, hi) for p in parts]
    if not parts:  # an output chunk no input row maps to
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    if len(parts) == 1:
        return parts[0]
    rows, cells, values = (np.concatenate([p[k] for p in parts]) for k in range(3))
    return _coalesce(rows, cells, values, n_cells)


def _finish(
    parts: list[_Triples], lo: int, hi: int, n_cells: int, dtype: np.dtype[Any]
) -> sparse.COO:
    rows, cells, values = _merge(parts, lo, hi, n_cells)
    return coo_rows(rows - lo, cells, values.astype(dtype, copy=False), hi - lo, n_cells)


def aggregate_sparse(
    values: da.Array,
    ancestors: npt.NDArray[np.integer[Any]],
    out_chunks: tuple[int, ...],
    name: str,
    *,
    split_every: int = 8,
) -> da.Array:
    """Row sums by group of a sparse array, lazily: output row ``j`` is the sum of the
    rows ``i`` of ``values`` with ``ancestors[i] == j``.

    :func:`~dpdask.store._aggregate.aggregate_rows` for ``sparse.COO`` blocks:
    the same graph (each input chunk sums its rows by ancestor, partial sums aimed at
    one output chunk are added ``split_every`` at a time, one task per output chunk),
    with every intermediate sparse, so nothing grows with units x cells.

    Parameters
    ----------
    values : dask.array.Array
        Shape ``(len(ancestors), n_cells)``, chunked along the first axis; blocks
        are 2-D :class:`sparse.COO` (dense NumPy blocks are accepted too).
    ancestors : ndarray of int
        The output row of each input row (sorted is cheapest).
    out_chunks : tuple of int
        Chunk sizes of the output's first axis; they add up to the number of outputs.
    name : str
        Key prefix: tasks are ``<name>-partial``, ``<name>-combine`` and ``<name>``
        (letters and dashes keep dashboard labels whole).
    split_every : int
        How many partial sums one task adds at most (>= 2).

    Returns
    -------
    dask.array.Array
        Shape ``(sum(out_chunks), n_cells)``, blocks ``sparse.COO`` with coordinates
        sorted row-major and no zero entries; int64 for integer input, float64
        otherwise. Rows no input row maps to are empty.

    Raises
    ------
    dpdask.errors.ShapeError
        If ``values`` is not 2-D, or ``ancestors`` does not match its rows or points
        outside the output.
    dpdask.errors.ArgumentError
        If ``split_every < 2``.

    Examples
    --------
    >>> import dask.array as da, numpy as np, sparse
    >>> x = da.from_array(sparse.COO.from_numpy(np.array([[1, 0], [0, 2], [3, 0]])), chunks=(2, 2))
    >>> y = aggregate_sparse(x, np.array([0, 0, 1]), (1, 1), "agg")
    >>> y.compute().todense().tolist()
    [[1, 2], [3, 0]]
    """
    if split_every < 2:
        raise ArgumentError(f"split_every must be at least 2, got {split_every}")
    if values.ndim != 2:
        raise ShapeError(f"values must be 2-D (units, cells), got shape {values.shape}")
    anc_all = np.asarray(ancestors, dtype=np.int64)
    if anc_all.shape != (values.shape[0],):
        raise ShapeError(f"{ancestors.size} ancestors for {values.shape[0]} rows")
    out_bounds = np.concatenate([[0], np.cumsum(np.asarray(out_chunks, dtype=np.int64))])
    if anc_all.size and (anc_all.min() < 0 or anc_all.max() >= out_bounds[-1]):
        raise ShapeError(f"an ancestor index is outside 0..{int(out_bounds[-1]) - 1}")
    if values.numblocks[1] > 1:
        wide: Any = values  # dask's rechunk is untyped
        values = wide.rechunk({1: -1})
    n_cells = int(values.shape[1])
    in_bounds = np.concatenate([[0], np.cumsum(values.chunks[0], dtype=np.int64)])
    dtype = _acc_dtype(values.dtype)
    token = tokenize(values.name, anc_all, out_bounds, split_every, "sparse")
    pname, cname, oname = f"{name}-partial-{token}", f"{name}-combine-{token}", f"{name}-{token}"
    dsk: dict[Any, Any] = {}
    feeds: list[list[tuple[Any, ...]]] = [[] for _ in range(out_bounds.size - 1)]
    for i in range(in_bounds.size - 1):
        anc = anc_all[in_bounds[i] : in_bounds[i + 1]]
        dsk[(pname, i)] = (_partial, (values.name, i, 0), anc, dtype)
        for j in np.unique(np.searchsorted(out_bounds, anc, side="right") - 1):
            feeds[j].append((pname, i))
    for j, keys in enumerate(feeds):
        lo, hi = int(out_bounds[j]), int(out_bounds[j + 1])
        depth = 0
        while len(keys) > split_every:
            grouped = [keys[k : k + split_every] for k in range(0, len(keys), split_every)]
            keys = []
            for g, group in enumerate(grouped):
                dsk[(cname, j, depth, g)] = (_merge, group, lo, hi, n_cells)
                keys.append((cname, j, depth, g))
            depth += 1
        dsk[(oname, j, 0)] = (_finish, keys, lo, hi, n_cells, dtype)
    chunks = (tuple(int(c) for c in out_chunks), (n_cells,))
    return graph_array(oname, dsk, values, chunks, dtype, sparse_meta(dtype))


def _dense_block(block: sparse.COO | npt.NDArray[Any], tail: tuple[int, ...]) -> npt.NDArray[Any]:
    dense = np.asarray(block.todense() if isinstance(block, sparse.COO) else block)
    return dense.reshape((dense.shape[0], *tail))


def densify(x: da.Array, shape: Sequence[int] | None = None, *, name: str = "densify") -> da.Array:
    """Dense blocks from a sparse ``(n_units, n_cells)`` array, cells optionally unflattened.

    Parameters
    ----------
    x : dask.array.Array
        2-D, blocks :class:`sparse.COO` (or already dense).
    shape : sequence of int, optional
        The domain's shape: the output is ``(n_units, *shape)`` (default: 2-D).
    name : str
        Key prefix (letters and dashes).

    Returns
    -------
    dask.array.Array
        NumPy blocks, the same first-axis chunks.
    """
    if x.ndim != 2:
        raise ShapeError(f"x must be 2-D (units, cells), got shape {x.shape}")
    tail = (int(x.shape[1]),) if shape is None else tuple(int(s) for s in shape)
    if int(np.prod(tail, dtype=object)) != x.shape[1]:
        raise ShapeError(f"shape {tail} does not hold {x.shape[1]} cells")
    if x.numblocks[1] > 1:
        wide: Any = x  # dask's rechunk is untyped
        x = wide.rechunk({1: -1})
    oname = f"{name}-{tokenize(x.name, tail)}"
    zeros = (0,) * len(tail)
    dsk = {(oname, i, *zeros): (_dense_block, (x.name, i, 0), tail) for i in range(x.numblocks[0])}
    chunks = (x.chunks[0], *((s,) for s in tail))
    return graph_array(oname, dsk, x, chunks, x.dtype, np.empty(zeros, x.dtype))


def _sparse_block(block: npt.NDArray[Any], dtype: np.dtype[Any]) -> sparse.COO:
    rows, cells, values = _triples(np.asarray(block))
    n_cells = int(np.prod(block.shape[1:], dtype=np.int64))
    return coo_rows(rows, cells, values.astype(dtype, copy=False), block.shape[0], n_cells)


def sparsify(
    x: da.Array, *, dtype: npt.DTypeLike | None = None, name: str = "sparsify"
) -> da.Array:
    """Sparse ``(n_units, n_cells)`` blocks from a dense ``(n_units, *shape)`` array.

    Parameters
    ----------
    x : dask.array.Array
        At least 1-D, chunked along the first axis (other axes are merged).
    dtype : dtype, optional
        Dtype of the entries (default: that of ``x``).
    name : str
        Key prefix (letters and dashes).

    Returns
    -------
    dask.array.Array
        Blocks :class:`sparse.COO`, the same first-axis chunks.
    """
    if x.ndim < 1:
        raise ShapeError("x must have a first (units) axis")
    out_dtype = np.dtype(x.dtype if dtype is None else dtype)
    if any(n > 1 for n in x.numblocks[1:]):
        wide: Any = x  # dask's rechunk is untyped
        x = wide.rechunk({i: -1 for i in range(1, x.ndim)})
    n_cells = int(np.prod(x.shape[1:], dtype=np.int64))
    oname = f"{name}-{tokenize(x.name, out_dtype)}"
    zeros = (0,) * (x.ndim - 1)
    dsk = {
        (oname, i, 0): (_sparse_block, (x.name, i, *zeros), out_dtype)
        for i in range(x.numblocks[0])
    }
    chunks = (x.chunks[0], (n_cells,))
    return graph_array(oname, dsk, x, chunks, out_dtype, sparse_meta(out_dtype))
