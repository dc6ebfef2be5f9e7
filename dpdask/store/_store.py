"""The data store: one zarr v3 group holding a release's input counts.

Layout of a store at ``path`` (a local directory), dense (format 1)::

    path/                       zarr group; attributes["dpdask"] describe the store
      counts                    int array (n_geographies, *domain.shape), chunked along
                                geography only; dimension names ("geography", *domain.attrs)
      geography/<level>/ids     str array: unit ids of that level (sorted)
      geography/<level>/parent  int64 array: index of each unit's parent in the level
                                above (every level but the coarsest)

or sparse (format 2), where ``counts`` gives way to the non-zero counts as entries
(chunked along the entry axis, dimension names ``("entry",)`` and
``("geography_edge",)``; see :mod:`dpdask.store._entries`)::

      entries/unit              int64 (nnz,): finest-unit row, non-decreasing
      entries/cell              int64 (nnz,): flat cell (C order over domain.shape),
                                strictly increasing within a unit
      entries/count             integer (nnz,): positive counts (zeros are never stored)
      entries/offsets           int64 (n_units + 1,): the entries of unit u are
                                offsets[u]:offsets[u+1]

``attributes["dpdask"]`` holds ``format`` (``"dpdask-counts"``), ``format_version``, the
domain as ``[[name, size], ...]``, the geography level names coarsest first, the number
of units per level, a free-text ``source`` and the dpdask version that wrote it; a
sparse store adds ``layout`` (``"sparse"``), ``nnz`` and ``geo_chunk`` (the rows per
chunk of :meth:`DataStore.to_dask`). Rows are the finest-level units in the order of
``geography/<finest>/ids``. Writers choose the smaller layout by default
(``layout="auto"``): memory and disk then grow with the persons, not with cells x
geographies.

Stores are written once, under a temporary name, and renamed into place only when
complete (:mod:`dpdask.publish`).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import dask.array as da
import numpy as np
import numpy.typing as npt
import zarr
from dask.base import tokenize

from dpdask.domain import Domain, Geography
from dpdask.errors import ArgumentError, DataError
from dpdask.publish import check_target
from dpdask.store import _attributes as attributes_
from dpdask.store._entries import (
    SparseCounts,
    array_at,
    dense_to_sparse,
    open_entries,
    row_bounds,
)
from dpdask.store._store_write import (
    DENSE_VERSION,
    FORMAT,
    SPARSE_VERSION,
    _publish_store,
    check_integer_dtype,
    check_layout,
    check_shape,
    choose_layout,
    count_nonzero,
    default_geo_chunk,
    dense_entries_filler,
    first_bad_row,
    raise_bad_row,
    store_dense,
)

__all__ = [
    "DataStore",
    "SparseCounts",
    "adopt_array",
    "default_geo_chunk",
    "open_store",
    "read_store",
    "write_store",
]


@dataclass(frozen=True, eq=False)
class DataStore:
    """An opened data store, dense or sparse.

    Attributes
    ----------
    path : pathlib.Path
        Location of the zarr group.
    counts : zarr.Array or SparseCounts
        The counts, shape ``(n_geographies, *domain.shape)``: the zarr array of a
        dense store; for a sparse store a :class:`SparseCounts` view whose rows
        (``counts[r]``, ``counts[a:b]``) read densely from the entries.
    domain : Domain
        The attributes of each geography's histogram.
    geography : Geography
        The hierarchy; ``counts`` has one row per finest-level unit.
    attrs : dict
        The store's ``dpdask`` attributes.
    """

    path: pathlib.Path
    counts: zarr.Array[Any] | SparseCounts
    domain: Domain
    geography: Geography
    attrs: dict[str, Any]

    @property
    def layout(self) -> str:
        """``"dense"`` (format 1, a ``counts`` array) or ``"sparse"`` (format 2, entries)."""
        return "sparse" if isinstance(self.counts, SparseCounts) else "dense"

    @property
    def nnz(self) -> int | None:
        """Stored entries of a sparse store; ``None`` for a dense one (not counted)."""
        return self.counts.nnz if isinstance(self.counts, SparseCounts) else None

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of the stored counts."""
        return np.dtype(self.counts.dtype)

    def rows(self, start: int, stop: int) -> npt.NDArray[Any]:
        """Dense counts of rows ``start .. stop-1``, shape ``(stop - start, *domain.shape)``.

        Reads only those rows (their chunks of a dense store, their entries of a
        sparse one).
        """
        if isinstance(self.counts, SparseCounts):
            return self.counts.rows(start, stop)
        if not 0 <= start <= stop <= self.counts.shape[0]:
            raise IndexError(f"rows {start}:{stop} are outside 0:{self.counts.shape[0]}")
        return np.asarray(self.counts[start:stop])

    @property
    def unit_attribute_names(self) -> tuple[str, ...]:
        """The public per-unit attributes the store carries (``units/<name>``), sorted."""
        return tuple(self.attrs.get("unit_attributes", ()))

    def unit_attribute(self, name: str, level: str | None = None) -> npt.NDArray[np.int64]:
        """The int64 values of unit attribute ``name``, one row per finest unit (in the
        order of the counts' rows), or summed to the units of ``level``.

        Raises
        ------
        dpdask.errors.DataError
            If the store has no such attribute (the message lists those it has).
        dpdask.errors.DomainError
            If ``level`` is not a level of the geography.
        """
        group = zarr.open_group(str(self.path), mode="r", zarr_format=3)
        n = self.geography.n_units()
        values = attributes_.read_unit_attribute(group, self.unit_attribute_names, name, n)
        return attributes_.attribute_at(values, self.geography, level)

    def _token(self, *extra: Any) -> str:
        return tokenize(str(self.path), self.attrs.get("created"), self.counts.shape, *extra)

    def to_dask(self) -> da.Array:
        """The dense counts ``(n_geographies, *domain.shape)`` as a Dask array.

        One chunk per zarr chunk of a dense store; a sparse store's chunks of
        ``attrs["geo_chunk"]`` rows are densified from their entries. Keys are
        ``ingest-counts-...``.
        """
        if not isinstance(self.counts, SparseCounts):
            name = f"ingest-counts-{self._token()}"
            arr: da.Array = da.from_zarr(self.counts, chunks=self.counts.chunks, name=name)  # type: ignore[no-untyped-call]
            return arr
        return self.counts.to_dask(f"ingest-counts-{self._token('dense')}")

    def to_sparse(self, chunks: Sequence[int] | None = None) -> da.Array:
        """The counts as sparse blocks: ``(n_geographies, domain.size)``, cells flattened.

        Parameters
        ----------
        chunks : sequence of int, optional
            Rows per block, adding up to the number of finest units (any sizes,
            e.g. a release's level chunks). By default about 4 million entries per
            block of a sparse store, one block per zarr chunk of a dense one.

        Returns
        -------
        dask.array.Array
            2-D, blocks :class:`sparse.COO` of int64 counts with coordinates sorted
            row-major (meta ``sparse.COO``), keys ``ingest-sparse-...``. A block of
            a sparse store reads only the entries of its rows; nothing is densified.

        Raises
        ------
        dpdask.errors.ArgumentError
            If ``chunks`` are not integers; a :class:`~dpdask.errors.ShapeError` if they
            do not add up to the number of units.
        """
        n = self.geography.n_units()
        if isinstance(self.counts, SparseCounts):
            bounds = self.counts.bounds() if chunks is None else row_bounds(chunks, n)
            return self.counts.to_sparse(f"ingest-sparse-{self._token('sparse', bounds)}", bounds)
        if chunks is None:
            bounds = np.array([*range(0, n, self.counts.chunks[0]), n], dtype=np.int64)
        else:
            bounds = row_bounds(chunks, n)
        return dense_to_sparse(
            self.counts, f"ingest-sparse-{self._token('sparse', bounds)}", bounds
        )

    def __repr__(self) -> str:
        return f"DataStore({str(self.path)!r}, {self.domain!r}, {self.geography!r})"


def write_store(
    path: str | os.PathLike[str],
    counts: npt.NDArray[np.integer[Any]] | da.Array,
    domain: Domain,
    geography: Geography,
    *,
    geo_chunk: int | None = None,
    dtype: npt.DTypeLike | None = None,
    overwrite: bool = False,
    source: str = "",
    layout: str = "auto",
    unit_attributes: Mapping[str, npt.NDArray[Any]] | None = None,
) -> DataStore:
    """Write counts of every finest geography unit as a data store.

    Parameters
    ----------
    path : str or path-like
        Directory of the new store (local file system).
    counts : ndarray or dask.array.Array
        Integer counts of shape ``(geography.n_units(), *domain.shape)``, rows in the
        order of the finest level's ids.
    domain : Domain
        The histogram's attributes.
    geography : Geography
        The hierarchy.
    geo_chunk : int, optional
        Geographies per chunk of a dense store, or per chunk of ``to_dask()`` of a
        sparse one (default: about 64 MiB of dense counts per chunk).
    dtype : dtype, optional
        Integer dtype of the stored counts (default: that of ``counts``).
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    source : str
        Free text recorded in the attributes (where the counts came from).
    layout : {"auto", "dense", "sparse"}
        ``"dense"`` writes the ``counts`` array (format 1), ``"sparse"`` the non-zero
        counts as entries (format 2), ``"auto"`` whichever is smaller (for a Dask
        input that costs one more pass over it to count the non-zero values).
    unit_attributes : mapping of str to ndarray, optional
        Public per-unit attributes (:mod:`dpdask.store._attributes`: e.g.
        ``housing_units``, ``gq_population``), first axis the finest units in the
        order of the counts' rows; written as ``units/<name>`` (int64).

    Returns
    -------
    DataStore

    Raises
    ------
    dpdask.errors.DataError
        If the shape does not match domain and geography, the counts are not
        integers, a count is negative, or a unit attribute is not a non-negative
        integer array with one row per unit; nothing is left at ``path``.
    dpdask.errors.ArgumentError
        If ``layout`` or ``geo_chunk`` is not one it can use.
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.
    """
    check_target(path, overwrite)
    check_layout(layout)
    check_shape(counts.shape, domain, geography, "counts")
    check_integer_dtype(counts.dtype, "counts")
    stored = check_integer_dtype(counts.dtype if dtype is None else dtype, "dtype")
    attributes = attributes_.check_unit_attributes(unit_attributes, geography.n_units())
    if not isinstance(counts, np.ndarray | da.Array):
        counts = da.asarray(counts)
    if isinstance(counts, np.ndarray):
        raise_bad_row(*first_bad_row(counts, stored), stored)
    n = geography.n_units()
    layout = choose_layout(
        layout, count_nonzero(counts) if layout == "auto" else 0, n, domain, stored
    )
    if layout == "sparse":
        chunk = default_geo_chunk(domain, stored) if geo_chunk is None else geo_chunk
        fill_entries = dense_entries_filler(counts, stored, max(1, min(int(chunk), n)))
        args = (path, domain, geography, stored, geo_chunk, overwrite, source, fill_entries)
        _publish_store(*args, layout="sparse", unit_attributes=attributes)
        return open_store(path)

    def fill(target: zarr.Array[Any]) -> None:
        x: Any = counts if isinstance(counts, da.Array) else da.asarray(counts)  # type: ignore[no-untyped-call]
        x = x.rechunk((target.chunks[0], *(-1,) * len(domain)))
        store_dense(x, target)

    _publish_store(
        path, domain, geography, stored, geo_chunk, overwrite, source, fill,
        unit_attributes=attributes,
    )  # fmt: skip
    return open_store(path)


def adopt_array(
    source: Any,
    domain: Domain | None = None,
    geography: Geography | None = None,
    store: str | os.PathLike[str] | None = None,
    *,
    geo_chunk: int | None = None,
    overwrite: bool = False,
    layout: str = "auto",
) -> DataStore:
    """Bring an existing ``(n_geo, *domain.shape)`` zarr array into the store layout.

    The array (for instance one written by ``dpdask.datasets.synthetic_persons``) is
    copied chunk by chunk, out of core, into a new store with the geography beside it;
    the source is only read.

    Parameters
    ----------
    source : zarr.Array, path, or SyntheticPersons
        The array, the path of a zarr array, or the result of
        :func:`dpdask.datasets.synthetic_persons` (which brings its own domain and
        geography).
    domain : Domain, optional
        The histogram's attributes (default: ``source.domain``, else the domain
        recorded in the array's ``attrs["dpdask"]["domain"]``).
    geography : Geography, optional
        Rows are its finest units in order (default: ``source.geography``).
    store : str or path-like
        Directory of the new store (required).
    geo_chunk : int, optional
        Geographies per chunk of the new store (default: the source's first-axis
        chunk length).
    overwrite : bool
        Replace an existing store at ``store``.
    layout : {"auto", "dense", "sparse"}
        As in :func:`write_store` (``"auto"`` reads the source twice).

    Returns
    -------
    DataStore

    Raises
    ------
    dpdask.errors.DataError
        If ``source`` is not an integer array of the expected shape or holds a
        negative count; nothing is left at ``store``.
    dpdask.errors.ArgumentError
        If ``store`` or the geography is not given.
    """
    if store is None:
        raise ArgumentError("adopt_array needs store=, the directory of the new store")
    check_target(store, overwrite)
    check_layout(layout)
    if hasattr(source, "array") and hasattr(source, "geography"):
        domain = source.domain if domain is None else domain
        geography = source.geography if geography is None else geography
        source = source.array
    if not isinstance(source, zarr.Array):
        try:
            source = zarr.open_array(str(source), mode="r")
        except (FileNotFoundError, zarr.errors.NodeTypeValidationError) as exc:
            raise DataError(f"{source} is not a zarr array: {exc}") from None
    if domain is None:
        recorded = dict(source.attrs).get("dpdask", {}).get("domain")
        if not isinstance(recorded, dict | list):
            raise ArgumentError("the source array records no domain; pass domain=")
        domain = Domain(recorded)
    if geography is None:
        raise ArgumentError("pass geography=: the rows' geography hierarchy")
    check_shape(source.shape, domain, geography, "the source array")
    dtype = check_integer_dtype(source.dtype, "the source array")
    name = f"adopt-{tokenize(source.store_path)}"
    x = da.from_zarr(source, chunks=source.chunks, name=name)  # type: ignore[no-untyped-call]
    return write_store(
        store,
        x,
        domain,
        geography,
        geo_chunk=source.chunks[0] if geo_chunk is None else geo_chunk,
        dtype=dtype,
        overwrite=overwrite,
        source=f"adopted from {source.store_path}",
        layout=layout,
    )


def open_store(path: str | os.PathLike[str]) -> DataStore:
    """Open a data store and check its layout.

    Raises
    ------
    FileNotFoundError
        If nothing is at ``path``.
    dpdask.errors.DataError
        If ``path`` is not a dpdask data store or its parts disagree (the message
        says which).
    """
    where = pathlib.Path(path)
    if not where.exists():
        raise FileNotFoundError(f"no data store at {where}")
    path = where
    try:
        group = zarr.open_group(str(path), mode="r", zarr_format=3)
    except (FileNotFoundError, zarr.errors.NodeTypeValidationError, ValueError) as exc:
        raise DataError(f"{path} is not a zarr v3 group: {exc}") from None
    meta: Any = dict(group.attrs).get("dpdask")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{path} is not a dpdask data store (no dpdask.format={FORMAT!r})")
    version = meta.get("format_version")
    if version not in (DENSE_VERSION, SPARSE_VERSION):
        raise DataError(
            f"{path}: store format version {version} is not supported (this dpdask reads "
            f"versions {DENSE_VERSION} (dense) and {SPARSE_VERSION} (sparse))"
        )
    domain = Domain([(str(k), int(v)) for k, v in meta["domain"]])
    levels = tuple(meta["geography_levels"])
    try:
        ids = tuple(
            tuple(np.asarray(array_at(group, f"geography/{lv}/ids")[:]).tolist()) for lv in levels
        )
        parents = tuple(
            np.asarray(array_at(group, f"geography/{lv}/parent")[:]) for lv in levels[1:]
        )
        counts = array_at(group, "counts") if version == DENSE_VERSION else None
    except KeyError as exc:
        raise DataError(f"{path}: data store is missing {exc}") from None
    except DataError as exc:  # a group where an array belongs
        raise DataError(f"{path}: {exc}") from None
    geography = Geography(levels, ids, parents)
    attributes_.check_listed(group, meta, geography.n_units(), path)
    if counts is None:
        try:
            entries = open_entries(group, meta, (geography.n_units(), *domain.shape))
        except ValueError as exc:
            raise DataError(f"{path}: {exc}") from None
        return DataStore(path, entries, domain, geography, meta)
    check_shape(counts.shape, domain, geography, f"{path}/counts")
    check_integer_dtype(counts.dtype, f"{path}/counts")
    if tuple(counts.chunks[1:]) != domain.shape:
        raise DataError(f"{path}/counts is chunked along more than the geography axis")
    return DataStore(path, counts, domain, geography, meta)


@overload
def read_store(
    path: str | os.PathLike[str], lazy: Literal[True] = ...
) -> tuple[da.Array, Domain, Geography]: ...
@overload
def read_store(
    path: str | os.PathLike[str], lazy: Literal[False]
) -> tuple[zarr.Array[Any] | SparseCounts, Domain, Geography]: ...
@overload
def read_store(
    path: str | os.PathLike[str], lazy: bool = ...
) -> tuple[da.Array | zarr.Array[Any] | SparseCounts, Domain, Geography]: ...


def read_store(
    path: str | os.PathLike[str], lazy: bool = True
) -> tuple[da.Array | zarr.Array[Any] | SparseCounts, Domain, Geography]:
    """Read a data store as ``(counts, domain, geography)``.

    Parameters
    ----------
    path : str or path-like
        The store.
    lazy : bool
        Return the counts as a Dask array chunked like the store (default) or as
        ``store.counts`` (the zarr array, or the :class:`SparseCounts` view of a
        sparse store).

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from dpdask import Domain, Geography
    >>> d, g = Domain(a=2, b=3), Geography.from_geoids(["11", "12", "21"], {"s": 1, "c": 2})
    >>> path = tempfile.mkdtemp() + "/store"
    >>> _ = write_store(path, np.ones((3, 2, 3), dtype=np.int64), d, g)
    >>> counts, domain, geography = read_store(path)
    >>> counts.shape, domain == d, geography == g
    ((3, 2, 3), True, True)
    """
    store = open_store(path)
    counts: da.Array | zarr.Array[Any] | SparseCounts = store.to_dask() if lazy else store.counts
    return counts, store.domain, store.geography
