"""The sparse layout of a data store: counts as (unit, cell, count) entries in zarr.

Inside the store's group::

    entries/unit     int64 (nnz,)          finest-unit row, non-decreasing
    entries/cell     int64 (nnz,)          flat cell (C order over the domain), increasing
                                           within a unit
    entries/count    integer (nnz,)        positive counts, zeros never stored
    entries/offsets  int64 (n_units + 1,)  the entries of unit u are offsets[u]:offsets[u+1]

The three entry arrays are chunked alike (:data:`ENTRY_CHUNK` entries, a few MiB),
so that writers of disjoint chunk ranges never touch the same zarr chunk.

Entries are written from memory (:func:`write_sorted`, when they are already there)
or from *parts* (:func:`write_parts`): one task per range of units computes its
entries and spills them to ``.npy`` files beside the store (pass 1), then, with every
part's size known, one task per entry chunk gathers its slice of the parts and
writes it (pass 2). Memory is then bounded by a part and a chunk, whatever ``nnz``.

:class:`SparseCounts` reads them back: dense rows, :class:`sparse.COO` rows, and the
tasks of :meth:`dpdask.store.DataStore.to_sparse`.
"""

from __future__ import annotations

import itertools
import pathlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, TypeAlias

import dask.array as da
import numpy as np
import numpy.typing as npt
import sparse
import zarr
from dask.base import compute, tokenize
from dask.delayed import delayed

from dpdask.errors import ArgumentError, ArgumentTypeError, DataError, ShapeError
from dpdask.store._sparse import coo_rows, sparse_meta

__all__ = [
    "ENTRY_CHUNK",
    "SparseCounts",
    "Spilled",
    "create_entries",
    "write_parts",
    "write_sorted",
]

ENTRY_CHUNK = 2**19  # entries per zarr chunk: 4 MiB of int64
OFFSET_CHUNK = 2**20  # units per chunk of offsets: 8 MiB
BLOCK_ENTRIES = 2**22  # entries per block of to_sparse() by default (~96 MiB as COO)
_PARTS = ".parts"

# What a pass-1 task returns: the number of entries of each of its units, or, when
# its input is bad, ``None`` and ``(row, problem code)`` of the first bad row.
Spilled: TypeAlias = tuple[npt.NDArray[np.int64] | None, tuple[int, int] | None]
EntryArrays: TypeAlias = dict[str, zarr.Array[Any]]  # unit, cell, count, offsets


def array_at(group: zarr.Group, name: str) -> zarr.Array[Any]:
    """The array ``name`` of ``group``; a :class:`DataError` if it is a group."""
    node = group[name]
    if not isinstance(node, zarr.Array):
        raise DataError(f"{name} is a group, not an array")
    return node


def create_entries(group: zarr.Group, n_units: int, nnz: int, dtype: np.dtype[Any]) -> EntryArrays:
    """Create the four empty entry arrays; return them by name."""
    chunk = (max(1, min(ENTRY_CHUNK, nnz)),)
    arrays = {
        name: group.create_array(
            f"entries/{name}",
            shape=(nnz,),
            dtype=np.int64 if name != "count" else dtype,
            chunks=chunk,
            fill_value=0,
            dimension_names=("entry",),
        )
        for name in ("unit", "cell", "count")
    }
    arrays["offsets"] = group.create_array(
        "entries/offsets",
        shape=(n_units + 1,),
        dtype=np.int64,
        chunks=(min(OFFSET_CHUNK, n_units + 1),),
        fill_value=0,
        dimension_names=("geography_edge",),
    )
    return arrays


def write_sorted(
    group: zarr.Group,
    units: npt.NDArray[np.integer[Any]],
    cells: npt.NDArray[np.integer[Any]],
    counts: npt.NDArray[np.integer[Any]],
    n_units: int,
    dtype: np.dtype[Any],
) -> int:
    """Write entries held in memory, sorted by (unit, cell), unique, positive; return nnz."""
    arrays = create_entries(group, n_units, int(units.size), dtype)
    if units.size:
        arrays["unit"][:] = units
        arrays["cell"][:] = cells
        arrays["count"][:] = counts.astype(dtype, copy=False)
    arrays["offsets"][:] = np.searchsorted(units, np.arange(n_units + 1), side="left")
    return int(units.size)


def spill(
    entries: tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]] | tuple[int, int],
    lo: int,
    hi: int,
    folder: str,
    index: int,
    dtype: np.dtype[Any],
) -> Spilled:
    """Pass 1: save one part's cells and counts; return the entries per unit.

    ``entries`` are ``(units, cells, counts)`` of units ``lo .. hi-1``, sorted by
    (unit, cell), unique and positive, or ``(row, problem)`` when the input is bad:
    then nothing is saved and the problem is handed back (never raised, so that every
    task has finished before the caller raises and removes the folder).
    """
    if len(entries) == 2:
        return None, (int(entries[0]), int(entries[1]))
    units, cells, counts = entries
    base = pathlib.Path(folder)
    np.save(base / f"{index}-cell.npy", np.asarray(cells, dtype=np.int64))
    np.save(base / f"{index}-count.npy", np.asarray(counts).astype(dtype, copy=False))
    per_unit = np.bincount(np.asarray(units, dtype=np.int64) - lo, minlength=hi - lo)
    return per_unit.astype(np.int64), None


def _gather(
    arrays: EntryArrays,
    folder: str,
    pieces: list[tuple[int, int, int]],
    e0: int,
    units: tuple[int, npt.NDArray[np.int64]],
) -> int:
    """Pass 2: write entries ``e0 ..`` from the parts' slices ``(index, start, stop)``."""
    base = pathlib.Path(folder)
    cells = np.concatenate(
        [np.load(base / f"{i}-cell.npy", mmap_mode="r")[a:b] for i, a, b in pieces]
    )
    counts = np.concatenate(
        [np.load(base / f"{i}-count.npy", mmap_mode="r")[a:b] for i, a, b in pieces]
    )
    u0, bounds = units  # bounds: offsets of units u0 .. , clipped to this chunk
    rows = u0 + np.repeat(np.arange(bounds.size - 1, dtype=np.int64), np.diff(bounds))
    e1 = e0 + cells.size
    arrays["unit"][e0:e1] = rows
    arrays["cell"][e0:e1] = cells
    arrays["count"][e0:e1] = counts
    return int(cells.size)


def write_parts(
    root: pathlib.Path,
    group: zarr.Group,
    parts: Sequence[tuple[int, int, Any]],
    n_units: int,
    dtype: np.dtype[Any],
    raise_bad: Callable[[int, int], None],
    scheduler: Any = None,
) -> int:
    """Write entries computed part by part, in bounded memory; return nnz.

    Parameters
    ----------
    root, group
        The store being built (a temporary directory) and its zarr group.
    parts : sequence of (lo, hi, entries)
        Consecutive unit ranges covering ``0 .. n_units`` and, for each, a Dask
        object computing what :func:`spill` takes: the range's entries or a problem.
    raise_bad : callable
        ``raise_bad(row, problem)`` raises for the first bad row of all parts.
    scheduler
        Passed to :func:`dask.compute` (default: Dask's current one).
    """
    folder = root / _PARTS
    folder.mkdir()
    tasks = [
        delayed(spill, pure=True)(
            entries, lo, hi, str(folder), i, dtype, dask_key_name=(f"store-spill-{_token(root)}", i)
        )
        for i, (lo, hi, entries) in enumerate(parts)
    ]
    spilled: list[Spilled] = list(compute(*tasks, scheduler=scheduler))  # type: ignore[no-untyped-call]
    bad = [p for _, p in spilled if p is not None]
    if bad:
        raise_bad(*min(bad))
    per_unit = np.concatenate([np.empty(0, np.int64), *(s for s, _ in spilled if s is not None)])
    if per_unit.size != n_units:  # pragma: no cover - the parts cover every unit
        raise RuntimeError(f"parts cover {per_unit.size} units, expected {n_units}")
    offsets = np.concatenate([[0], np.cumsum(per_unit)]).astype(np.int64)
    nnz = int(offsets[-1])
    arrays = create_entries(group, n_units, nnz, dtype)
    starts = offsets[[lo for lo, _, _ in parts] + [n_units]]  # entry range of every part
    writes: list[Any] = []
    for e0 in range(0, nnz, arrays["unit"].chunks[0]):
        e1 = min(e0 + arrays["unit"].chunks[0], nnz)
        first, last = np.searchsorted(starts, [e0, e1], side="right") - 1
        pieces = [
            (int(i), int(max(e0, starts[i]) - starts[i]), int(min(e1, starts[i + 1]) - starts[i]))
            for i in range(first, min(last, len(parts) - 1) + 1)
            if min(e1, starts[i + 1]) > max(e0, starts[i])
        ]
        u0 = int(np.searchsorted(offsets, e0, side="right") - 1)
        u1 = int(np.searchsorted(offsets, e1 - 1, side="right"))
        bounds = np.clip(offsets[u0 : u1 + 1], e0, e1) - e0
        writes.append(
            delayed(_gather, pure=True)(
                arrays,
                str(folder),
                pieces,
                e0,
                (u0, bounds),
                dask_key_name=(f"store-entries-{_token(root)}", len(writes)),
            )
        )
    written = sum(compute(*writes, scheduler=scheduler))  # type: ignore[no-untyped-call]
    if written != nnz:  # pragma: no cover - pass 2 writes what pass 1 counted
        raise RuntimeError(f"wrote {written:,} entries, expected {nnz:,}")
    arrays["offsets"][:] = offsets
    shutil.rmtree(folder)
    return nnz


def _pairs(bounds: Sequence[int] | npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _token(root: pathlib.Path) -> str:
    return tokenize(str(root))


def read_coo(arrays: EntryArrays, a: int, b: int, e0: int, e1: int, n_cells: int) -> sparse.COO:
    """Rows ``a .. b-1`` as a ``(b - a, n_cells)`` int64 COO, from their entries ``e0 .. e1-1``."""
    if e1 <= e0:
        empty = np.empty(0, dtype=np.int64)
        return coo_rows(empty, empty, empty, b - a, n_cells)
    rows = np.asarray(arrays["unit"][e0:e1]) - a
    cells = np.asarray(arrays["cell"][e0:e1])
    counts = np.asarray(arrays["count"][e0:e1]).astype(np.int64, copy=False)
    return coo_rows(rows, cells, counts, b - a, n_cells)


def read_dense(
    arrays: EntryArrays,
    a: int,
    b: int,
    e0: int,
    e1: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
) -> npt.NDArray[Any]:
    """Rows ``a .. b-1`` as a dense ``(b - a, *shape)`` array of ``dtype``."""
    n_cells = int(np.prod(shape, dtype=np.int64))
    out = np.zeros((b - a) * n_cells, dtype=dtype)
    if e1 > e0:
        rows = np.asarray(arrays["unit"][e0:e1]) - a
        out[rows * n_cells + np.asarray(arrays["cell"][e0:e1])] = arrays["count"][e0:e1]
    return out.reshape((b - a, *shape))


class SparseCounts:
    """The counts of a sparse data store, read row by row.

    ``store.counts`` of a sparse store: it has the ``shape`` ``(n_units,
    *domain.shape)``, ``dtype`` and ``chunks`` (those of
    :meth:`~dpdask.store.DataStore.to_dask`) of the dense array and indexing by
    rows (``counts[r]``, ``counts[a:b]``, ``counts[a:b, ...]``) gives dense NumPy rows,
    reading only the entries of those rows. The entry arrays are ``unit``, ``cell``,
    ``count`` and ``offsets``.
    """

    def __init__(self, group: zarr.Group, shape: tuple[int, ...], geo_chunk: int) -> None:
        try:
            self.arrays: EntryArrays = {
                k: array_at(group, f"entries/{k}") for k in ("unit", "cell", "count", "offsets")
            }
        except KeyError as exc:
            raise DataError(f"sparse data store is missing {exc.args[0]}") from None
        self.shape = tuple(int(s) for s in shape)
        self.chunks = (max(1, min(int(geo_chunk), self.shape[0])), *self.shape[1:])

    unit = property(lambda self: self.arrays["unit"])
    cell = property(lambda self: self.arrays["cell"])
    count = property(lambda self: self.arrays["count"])
    offsets = property(lambda self: self.arrays["offsets"])

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of the stored counts."""
        return np.dtype(self.arrays["count"].dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.arrays["unit"].shape[0])

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))

    @cached_property
    def all_offsets(self) -> npt.NDArray[np.int64]:
        """The whole offsets array (``n_units + 1`` int64), read once."""
        return np.asarray(self.arrays["offsets"][:])

    def _bounds(self, a: int, b: int) -> tuple[int, int]:
        if "all_offsets" in self.__dict__:
            return int(self.all_offsets[a]), int(self.all_offsets[b])
        ends = np.asarray(self.arrays["offsets"].get_orthogonal_selection(np.array([a, b])))
        return int(ends[0]), int(ends[1])

    def _check_range(self, a: int, b: int) -> tuple[int, int]:
        a, b = int(a), int(b)
        if not 0 <= a <= b <= self.shape[0]:
            raise IndexError(f"rows {a}:{b} are outside 0:{self.shape[0]}")
        return a, b

    def rows(self, a: int, b: int) -> npt.NDArray[Any]:
        """Dense rows ``a .. b-1``, shape ``(b - a, *domain.shape)``."""
        a, b = self._check_range(a, b)
        return read_dense(self.arrays, a, b, *self._bounds(a, b), self.shape[1:], self.dtype)

    def coo(self, a: int, b: int) -> sparse.COO:
        """Rows ``a .. b-1`` as a ``(b - a, n_cells)`` int64 :class:`sparse.COO`."""
        a, b = self._check_range(a, b)
        return read_coo(self.arrays, a, b, *self._bounds(a, b), self.n_cells)

    def bounds(self) -> npt.NDArray[np.int64]:
        """Row bounds of blocks of about :data:`BLOCK_ENTRIES` entries each."""
        off, n = self.all_offsets, self.shape[0]
        cuts = np.searchsorted(off, np.arange(BLOCK_ENTRIES, off[-1], BLOCK_ENTRIES))
        return np.unique(np.concatenate([[0], cuts, [n]])).astype(np.int64)

    def to_sparse(self, name: str, bounds: npt.NDArray[np.int64]) -> da.Array:
        """``(n_units, n_cells)`` int64 COO blocks between row ``bounds``, keys ``name``."""
        off = self.all_offsets
        pairs = _pairs(bounds)
        dsk = {
            (name, i, 0): (read_coo, self.arrays, a, b, int(off[a]), int(off[b]), self.n_cells)
            for i, (a, b) in enumerate(pairs)
        }
        chunks = (tuple(b - a for a, b in pairs), (self.n_cells,))
        meta = sparse_meta(np.dtype(np.int64))
        return da.Array(dsk, name, chunks=chunks, dtype=np.int64, meta=meta)  # type: ignore[no-untyped-call]

    def to_dask(self, name: str) -> da.Array:
        """The dense counts, chunks of ``self.chunks[0]`` rows, keys ``name``."""
        n, tail, off = self.shape[0], self.shape[1:], self.all_offsets
        bounds = [*range(0, n, self.chunks[0]), n]
        zeros = (0,) * len(tail)
        dsk = {
            (name, i, *zeros): (
                read_dense,
                self.arrays,
                a,
                b,
                int(off[a]),
                int(off[b]),
                tail,
                self.dtype,
            )
            for i, (a, b) in enumerate(_pairs(bounds))
        }
        chunks = (tuple(np.diff(bounds).tolist()), *((s,) for s in tail))
        meta = np.empty((0,) * self.ndim, self.dtype)
        return da.Array(dsk, name, chunks=chunks, dtype=self.dtype, meta=meta)  # type: ignore[no-untyped-call]

    def __getitem__(self, key: Any) -> npt.NDArray[Any]:
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        n = self.shape[0]
        if first is Ellipsis:
            out: npt.NDArray[Any] = self.rows(0, n)[key]
            return out
        if isinstance(first, int | np.integer):
            r = int(first) + n if int(first) < 0 else int(first)
            if not 0 <= r < n:
                raise IndexError(f"row {first} is outside a store of {n} rows")
            row: npt.NDArray[Any] = self.rows(r, r + 1)[(0, *rest)]
            return row
        if not isinstance(first, slice):
            raise ArgumentTypeError(
                f"index rows of sparse counts by an int or a slice, got {first!r}"
            )
        picked = range(*first.indices(n))
        if not picked:
            return np.zeros((0, *self.shape[1:]), dtype=self.dtype)[(slice(None), *rest)]
        lo, hi = min(picked), max(picked) + 1
        stop = picked.stop - lo
        relative = slice(picked.start - lo, stop if stop >= 0 else None, picked.step)
        return self.rows(lo, hi)[(relative, *rest)]

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        out = self.rows(0, self.shape[0])
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"<SparseCounts shape={self.shape} dtype={self.dtype} nnz={self.nnz:,}>"


def row_bounds(chunks: Sequence[int], n: int) -> npt.NDArray[np.int64]:
    """``[0, c0, c0 + c1, ..., n]`` from chunk sizes, which must add up to ``n``."""
    sizes = np.asarray(tuple(chunks))
    if sizes.ndim != 1 or (sizes.size and sizes.dtype.kind not in "iu"):
        raise ArgumentError(f"chunks must be a sequence of integers, got {tuple(chunks)[:10]}")
    if (sizes < 0).any() or int(sizes.sum()) != n:
        more = " ..." if sizes.size > 10 else ""
        raise ShapeError(
            f"chunks must be non-negative and add up to the {n:,} units, got "
            f"{tuple(int(c) for c in sizes[:10])}{more} (sum {int(sizes.sum()):,})"
        )
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _dense_coo(counts: zarr.Array[Any], a: int, b: int) -> sparse.COO:
    """Rows ``a .. b-1`` of a dense ``counts`` array as a ``(b - a, n_cells)`` int64 COO."""
    n_cells = int(np.prod(counts.shape[1:], dtype=np.int64))
    flat = np.asarray(counts[a:b]).reshape(b - a, n_cells)
    rows, cells = np.nonzero(flat)
    return coo_rows(rows, cells, flat[rows, cells].astype(np.int64), b - a, n_cells)


def dense_to_sparse(counts: zarr.Array[Any], name: str, bounds: npt.NDArray[np.int64]) -> da.Array:
    """A dense store's counts as int64 COO blocks between row ``bounds``, keys ``name``."""
    n_cells = int(np.prod(counts.shape[1:], dtype=np.int64))
    pairs = _pairs(bounds)
    dsk = {(name, i, 0): (_dense_coo, counts, a, b) for i, (a, b) in enumerate(pairs)}
    chunks = (tuple(b - a for a, b in pairs), (n_cells,))
    meta = sparse_meta(np.dtype(np.int64))
    return da.Array(dsk, name, chunks=chunks, dtype=np.int64, meta=meta)  # type: ignore[no-untyped-call]


def open_entries(
    group: zarr.Group, meta: Mapping[str, Any], shape: tuple[int, ...]
) -> SparseCounts:
    """The entries of a sparse store, their shapes, dtypes and ends checked."""
    n = shape[0]
    view = SparseCounts(group, shape, int(meta.get("geo_chunk", 1)))
    nnz = meta.get("nnz")
    for name in ("unit", "cell", "count"):
        arr = view.arrays[name]
        if arr.shape != (nnz,):
            raise DataError(f"entries/{name} has shape {arr.shape}; nnz is {nnz}")
        if name != "count" and arr.dtype != np.int64:
            raise DataError(f"entries/{name} has dtype {arr.dtype}, not int64")
    if view.dtype.kind not in "iu":
        raise DataError(f"entries/count has dtype {view.dtype}; counts must be integers")
    offsets = view.arrays["offsets"]
    if offsets.shape != (n + 1,) or offsets.dtype != np.int64:
        raise DataError(
            f"entries/offsets has shape {offsets.shape} ({offsets.dtype}); "
            f"{n:,} finest units need ({n + 1},) int64"
        )
    ends = np.asarray(offsets.get_orthogonal_selection(np.array([0, n])))
    if int(ends[0]) != 0 or int(ends[1]) != nnz:
        raise DataError(f"entries/offsets run {ends[0]}..{ends[1]}, not 0..{nnz}")
    return view
