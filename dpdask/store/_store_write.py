"""Writing data stores: checks, the group and its attributes, both layouts, publication.

Every writer checks its input first, builds the store in a temporary directory
(:func:`dpdask.publish.publishing`) and renames it into place only when complete. A
dense store (format 1) holds ``counts``; a sparse one (format 2) holds the entry
arrays of :mod:`dpdask.store._entries`. Which one is smaller is
:func:`~dpdask.store._sparse.prefer_dense` of the number of non-zero counts.
"""

from __future__ import annotations

import datetime
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, cast

import dask.array as da
import numpy as np
import numpy.typing as npt
import zarr
from dask.base import tokenize
from dask.delayed import delayed

from dpdask.domain import Domain, Geography
from dpdask.errors import ArgumentError, DataError
from dpdask.publish import publishing
from dpdask.store._attributes import unit_attribute_names, write_unit_attributes
from dpdask.store._entries import write_parts, write_sorted
from dpdask.store._sparse import prefer_dense

__all__ = ["FORMAT", "LAYOUTS", "default_geo_chunk"]

FORMAT = "dpdask-counts"
DENSE_VERSION, SPARSE_VERSION = 1, 2
LAYOUTS = ("auto", "dense", "sparse")
_CHUNK_BYTES = 64 * 2**20


def default_geo_chunk(domain: Domain, dtype: npt.DTypeLike = "int64") -> int:
    """Geographies per chunk so that one chunk holds about 64 MiB."""
    return max(1, _CHUNK_BYTES // (domain.size * np.dtype(dtype).itemsize))


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def choose_layout(layout: str, nnz: int, n_units: int, domain: Domain, dtype: npt.DTypeLike) -> str:
    """``layout``, with ``"auto"`` resolved: sparse when the entries take less room."""
    if check_layout(layout) != "auto":
        return layout
    return (
        "dense" if prefer_dense(nnz, n_units, domain.size, np.dtype(dtype).itemsize) else "sparse"
    )


def check_integer_dtype(dtype: npt.DTypeLike, what: str) -> np.dtype[Any]:
    checked = np.dtype(dtype)
    if checked.kind not in "iu":
        raise DataError(f"{what} has dtype {checked}; counts must be integers")
    return checked


def check_shape(shape: tuple[int, ...], domain: Domain, geography: Geography, what: str) -> None:
    expected = (geography.n_units(), *domain.shape)
    if tuple(shape) != expected:
        raise DataError(
            f"{what} has shape {tuple(shape)}; {geography.n_units():,} finest units "
            f"({geography.levels[-1]!r}) x {domain!r} need {expected}"
        )


NEGATIVE, TOO_LARGE = 1, 2


def first_bad_row(block: npt.NDArray[Any], dtype: np.dtype[Any]) -> tuple[int, int]:
    """``(row, problem)`` of the first row with a negative count or one too large for
    ``dtype``; ``(-1, 0)`` if there is none."""
    if block.size and block.dtype.kind == "i" and block.min() < 0:
        return int(np.argwhere(block < 0)[0][0]), NEGATIVE
    if block.size and block.max() > np.iinfo(dtype).max:
        return int(np.argwhere(block > np.iinfo(dtype).max)[0][0]), TOO_LARGE
    return -1, 0


def raise_bad_row(row: int, problem: int, dtype: np.dtype[Any]) -> None:
    if problem == NEGATIVE:
        raise DataError(f"counts hold a negative value at geography row {row}")
    if problem == TOO_LARGE:
        top = np.iinfo(dtype).max
        raise DataError(f"counts hold a value above {top} ({dtype}) at geography row {row}")


def _store_block(
    block: npt.NDArray[Any],
    target: zarr.Array[Any],
    block_info: dict[Any, Any] | None = None,
) -> npt.NDArray[np.int64]:
    """Write one geography chunk unless it holds a bad count; return ``[[row, problem]]``.

    Never raises on bad counts, so that every writer has finished before the caller
    raises and the temporary store is removed.
    """
    start, stop = block_info[0]["array-location"][0]  # type: ignore[index]
    row, problem = first_bad_row(block, target.dtype)
    if not problem:
        target[start:stop] = block.astype(target.dtype, copy=False)
    return np.array([[row + start if problem else -1, problem]], dtype=np.int64)


def store_dense(x: da.Array, target: zarr.Array[Any]) -> None:
    """Write ``x`` (chunked like ``target`` along geography); raise on the first bad row."""
    arr: Any = x  # dask's map_blocks is untyped
    flags = arr.map_blocks(
        _store_block,
        target,
        dtype=np.int64,
        chunks=((1,) * x.numblocks[0], (2,)),
        drop_axis=list(range(2, x.ndim)),
        name=f"store-counts-{tokenize(x, str(target.store_path))}",
        meta=np.empty((0, 0), dtype=np.int64),
    ).compute()
    bad = flags[flags[:, 1] > 0]
    if bad.size:
        row, problem = bad[np.argmin(bad[:, 0])]
        raise_bad_row(int(row), int(problem), target.dtype)


def _block_entries(block: npt.NDArray[Any], lo: int, dtype: np.dtype[Any]) -> Any:
    """The entries of dense rows ``lo ..`` (unit, cell, count), or ``(row, problem)``."""
    row, problem = first_bad_row(block, dtype)
    if problem:
        return lo + row, problem
    flat = block.reshape(block.shape[0], int(np.prod(block.shape[1:], dtype=np.int64)))
    rows, cells = np.nonzero(flat)
    return rows + lo, cells, flat[rows, cells].astype(dtype, copy=False)


def dense_entries_filler(
    counts: npt.NDArray[Any] | da.Array, dtype: np.dtype[Any], geo_chunk: int
) -> Callable[[pathlib.Path, zarr.Group], int]:
    """A sparse ``fill`` writing the non-zero counts of a dense array (checked first)."""

    def fill(root: pathlib.Path, group: zarr.Group) -> int:
        n = counts.shape[0]
        if isinstance(counts, np.ndarray):
            units, cells, values = _block_entries(counts, 0, dtype)
            return write_sorted(group, units, cells, values, n, dtype)
        lazy: Any = counts  # dask's rechunk is untyped
        x = lazy.rechunk((geo_chunk, *(-1,) * (counts.ndim - 1)))
        bounds = np.concatenate([[0], np.cumsum(x.chunks[0])]).tolist()
        blocks = x.to_delayed().ravel()
        name = f"store-sparsify-{tokenize(x.name, dtype)}"
        entries = delayed(_block_entries, pure=True)
        parts = [
            (bounds[i], bounds[i + 1], entries(b, bounds[i], dtype, dask_key_name=(name, i)))
            for i, b in enumerate(blocks)
        ]
        return write_parts(root, group, parts, n, dtype, lambda r, p: raise_bad_row(r, p, dtype))

    return fill


def count_nonzero(counts: npt.NDArray[Any] | da.Array) -> int:
    """The non-zero counts of a dense array (a pass over a Dask array)."""
    if isinstance(counts, np.ndarray):
        return int(np.count_nonzero(counts))
    return int(da.count_nonzero(counts).compute())


def _write_group(
    root: pathlib.Path, domain: Domain, geography: Geography, source: str
) -> zarr.Group:
    """Create the group, its format-1 attributes and the geography arrays."""
    from dpdask import __version__

    group = zarr.open_group(str(root), mode="w-", zarr_format=3)
    for i, level in enumerate(geography.levels):
        sub = group.require_group(f"geography/{level}")
        ids = np.asarray(geography.ids[i], dtype=str)
        arr = sub.create_array("ids", shape=ids.shape, dtype=str, chunks=(max(1, ids.size),))
        arr[:] = ids
        if i:
            parent = np.asarray(geography.parents[i - 1], dtype=np.int64)
            par = sub.create_array(
                "parent", shape=parent.shape, dtype=np.int64, chunks=(max(1, parent.size),)
            )
            par[:] = parent
    group.attrs["dpdask"] = {
        "format": FORMAT,
        "format_version": DENSE_VERSION,
        "domain": [[k, v] for k, v in domain.items()],
        "geography_levels": list(geography.levels),
        "n_units": {lv: len(ids) for lv, ids in zip(geography.levels, geography.ids, strict=True)},
        "source": source,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "dpdask_version": __version__,
    }
    return group


def _publish_store(
    path: str | os.PathLike[str],
    domain: Domain,
    geography: Geography,
    dtype: np.dtype[Any],
    geo_chunk: int | None,
    overwrite: bool,
    source: str,
    fill: Callable[..., Any],
    layout: str = "dense",
    unit_attributes: Mapping[str, npt.NDArray[np.int64]] | None = None,
) -> None:
    """Build the store in a temporary directory, then rename it to ``path``.

    ``fill(counts)`` fills the dense ``counts`` array; for ``layout="sparse"``,
    ``fill(root, group)`` writes the entries and returns their number. ``geo_chunk``
    is the geography chunk of the dense array, or of ``to_dask()`` of a sparse store.
    ``unit_attributes`` (checked) are written as ``units/<name>``; the attributes
    list every array under ``units/`` (a sparse ``fill`` may write some itself).
    """
    geo_chunk = default_geo_chunk(domain, dtype) if geo_chunk is None else int(geo_chunk)
    if geo_chunk < 1:
        raise ArgumentError(f"geo_chunk must be a positive integer, got {geo_chunk}")
    geo_chunk = max(1, min(geo_chunk, geography.n_units()))
    if layout not in ("dense", "sparse"):
        raise ArgumentError(f"layout must be 'dense' or 'sparse' here, got {layout!r}")
    with publishing(path, overwrite) as tmp:
        group = _write_group(tmp, domain, geography, source)
        if layout == "dense":
            counts = group.create_array(
                "counts",
                shape=(geography.n_units(), *domain.shape),
                dtype=dtype,
                chunks=(geo_chunk, *domain.shape),
                fill_value=0,
                dimension_names=("geography", *domain.attrs),
            )
            fill(counts)
        else:
            nnz = fill(tmp, group)
            meta = dict(cast(Mapping[str, Any], group.attrs["dpdask"]))
            meta.update(format_version=SPARSE_VERSION, layout="sparse", nnz=int(nnz))
            meta["geo_chunk"] = geo_chunk
            group.attrs["dpdask"] = meta
        write_unit_attributes(group, unit_attributes or {})
        names = unit_attribute_names(group)
        if names:
            group.attrs["dpdask"] = {
                **cast(Mapping[str, Any], group.attrs["dpdask"]),
                "unit_attributes": names,
            }
