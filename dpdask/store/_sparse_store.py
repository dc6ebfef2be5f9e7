"""A sparse data store from (unit, cell, count) triples, checked before anything is written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr

from dpdask.domain import Domain, Geography
from dpdask.errors import DataError
from dpdask.publish import check_target
from dpdask.store._attributes import check_unit_attributes
from dpdask.store._entries import write_sorted
from dpdask.store._sparse import _coalesce
from dpdask.store._store import DataStore, open_store
from dpdask.store._store_write import _publish_store, check_integer_dtype

__all__ = ["write_sparse_store"]


def _vector(values: npt.ArrayLike, name: str) -> npt.NDArray[np.int64]:
    """``values`` as a 1-D integer array; NaN and non-integer dtypes are refused."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)  # an empty list is float64 to NumPy
    if arr.dtype.kind in "fc":
        nan = np.flatnonzero(np.isnan(arr))
        if nan.size:
            raise DataError(f"{name} hold NaN at position {int(nan[0])} ({nan.size:,} NaNs)")
    if arr.dtype.kind not in "iu":
        raise DataError(f"{name} have dtype {arr.dtype}; they must be integers")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        pos = int(np.argmax(arr > np.iinfo(np.int64).max))
        raise DataError(f"{name} hold {arr[pos]} at position {pos}, beyond int64")
    return arr.astype(np.int64, copy=False)


def _check_range(arr: npt.NDArray[np.int64], top: int, name: str, what: str) -> None:
    """Every value in ``0 .. top-1``, or an error naming the first that is not."""
    if not arr.size:
        return
    bad = (arr < 0) | (arr >= top)
    if bad.any():
        pos = int(np.argmax(bad))
        raise DataError(f"{name} hold {arr[pos]} at position {pos}, outside {what} 0..{top - 1}")


def write_sparse_store(
    path: str | os.PathLike[str],
    units: npt.ArrayLike,
    cells: npt.ArrayLike,
    counts: npt.ArrayLike,
    domain: Domain,
    geography: Geography,
    *,
    dtype: npt.DTypeLike | None = None,
    overwrite: bool = False,
    source: str = "",
    geo_chunk: int | None = None,
    unit_attributes: Mapping[str, npt.NDArray[Any]] | None = None,
) -> DataStore:
    """Write a sparse data store (format 2) from ``(unit, cell, count)`` triples.

    Memory grows with the number of triples, never with units x cells: a store on a
    domain of a billion cells with a handful of persons is a few bytes per person.

    Parameters
    ----------
    path : str or path-like
        Directory of the new store.
    units : array-like of int
        Row of each triple: the index of a finest-level unit (``0 ..
        geography.n_units() - 1``, in the order of the finest level's ids).
    cells : array-like of int
        Flat cell of each triple, C order over ``domain.shape`` (``0 ..
        domain.size - 1``; ``numpy.ravel_multi_index`` makes it from codes).
    counts : array-like of int
        Count of each triple, non-negative. Triples may come in any order;
        repeated (unit, cell) pairs are added up and zero counts are dropped.
    domain : Domain
        The histogram's attributes.
    geography : Geography
        The hierarchy; rows are its finest units.
    dtype : dtype, optional
        Integer dtype of the stored counts (default: that of ``counts``).
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    source : str
        Free text recorded in the attributes.
    geo_chunk : int, optional
        Rows per chunk of :meth:`~dpdask.store.DataStore.to_dask` (default:
        about 64 MiB of dense counts).
    unit_attributes : mapping of str to ndarray, optional
        Public per-unit attributes, as in :func:`~dpdask.store.write_store`.

    Returns
    -------
    DataStore
        The new store (``layout == "sparse"``).

    Raises
    ------
    dpdask.errors.DataError
        If the three arrays are not 1-D integer arrays of one length, hold NaN, a
        negative count, a unit outside the geography or a cell outside the domain,
        or a summed count does not fit ``dtype``, or a unit attribute is malformed;
        the message names the array and the position. Nothing is written.
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.

    Examples
    --------
    >>> import tempfile
    >>> from dpdask import Domain, Geography
    >>> d, g = Domain(a=2, b=3), Geography.flat(["x", "y", "z"])
    >>> s = write_sparse_store(tempfile.mkdtemp() + "/s", [2, 0, 2], [5, 1, 5], [1, 4, 2], d, g)
    >>> s.layout, s.nnz, s.to_dask().compute()[:, 1].tolist()
    ('sparse', 2, [[0, 0, 0], [0, 0, 0], [0, 0, 3]])
    """
    check_target(path, overwrite)
    raw_dtype = np.asarray(counts).dtype if np.size(counts) else np.dtype(np.int64)
    u, c, k = _vector(units, "units"), _vector(cells, "cells"), _vector(counts, "counts")
    if not u.size == c.size == k.size:
        raise DataError(
            f"units, cells and counts must have one length, got {u.size}, {c.size}, {k.size}"
        )
    stored = check_integer_dtype(raw_dtype if dtype is None else dtype, "dtype")
    if k.size and k.min() < 0:
        pos = int(np.argmax(k < 0))
        raise DataError(f"counts hold a negative value {k[pos]} at position {pos}")
    n = geography.n_units()
    _check_range(u, n, "units", f"the {n:,} finest units ({geography.levels[-1]!r})")
    _check_range(c, domain.size, "cells", f"the cells of {domain!r},")
    attributes = check_unit_attributes(unit_attributes, n)
    u, c, k = _coalesce(u, c, k, domain.size)
    top = np.iinfo(stored).max
    if k.size and k.max() > top:
        pos = int(np.argmax(k > top))
        raise DataError(
            f"the counts of unit {u[pos]} ({geography.ids[-1][u[pos]]!r}), cell {c[pos]} add "
            f"up to {k[pos]}, above {top} ({stored})"
        )

    def fill(root: Any, group: zarr.Group) -> int:
        return write_sorted(group, u, c, k, n, stored)

    args = (path, domain, geography, stored, geo_chunk, overwrite, source, fill)
    _publish_store(*args, layout="sparse", unit_attributes=attributes)
    return open_store(path)
