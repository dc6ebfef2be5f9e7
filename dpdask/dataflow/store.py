"""The data store: one zarr v3 group holding a release's input counts.

Layout of a store at ``path`` (a local directory)::

    path/                       zarr group; attributes["dpdask"] describe the store
      counts                    int array (n_geographies, *domain.shape), chunked along
                                geography only; dimension names ("geography", *domain.attrs)
      geography/<level>/ids     str array: unit ids of that level (sorted)
      geography/<level>/parent  int64 array: index of each unit's parent in the level
                                above (every level but the coarsest)

``attributes["dpdask"]`` holds ``format`` (``"dpdask-counts"``), ``format_version``, the
domain as ``[[name, size], ...]``, the geography level names coarsest first, the number
of units per level, a free-text ``source`` and the dpdask version that wrote it. Rows of
``counts`` are the finest-level units in the order of ``geography/<finest>/ids``.

Stores are written once, under a temporary name, and renamed into place only when
complete (:mod:`dpdask.publish`).
"""

from __future__ import annotations

import datetime
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask.domain import Domain, Geography
from dpdask.publish import check_target, publishing

__all__ = [
    "DataStore",
    "adopt_array",
    "default_geo_chunk",
    "open_store",
    "read_store",
    "write_store",
]

FORMAT = "dpdask-counts"
FORMAT_VERSION = 1
_CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True, eq=False)
class DataStore:
    """An opened data store.

    Attributes
    ----------
    path : pathlib.Path
        Location of the zarr group.
    counts : zarr.Array
        The counts, shape ``(n_geographies, *domain.shape)``.
    domain : Domain
        The attributes of each geography's histogram.
    geography : Geography
        The hierarchy; ``counts`` has one row per finest-level unit.
    attrs : dict
        The store's ``dpdask`` attributes.
    """

    path: pathlib.Path
    counts: zarr.Array
    domain: Domain
    geography: Geography
    attrs: dict

    def to_dask(self) -> da.Array:
        """The counts as a Dask array, one chunk per zarr chunk (keys ``ingest-counts-...``)."""
        token = tokenize(str(self.path), self.attrs.get("created"), self.counts.shape)
        return da.from_zarr(self.counts, chunks=self.counts.chunks, name=f"ingest-counts-{token}")

    def __repr__(self) -> str:
        return f"DataStore({str(self.path)!r}, {self.domain!r}, {self.geography!r})"


def default_geo_chunk(domain: Domain, dtype: np.dtype | str = "int64") -> int:
    """Geographies per chunk so that one chunk holds about 64 MiB."""
    return max(1, _CHUNK_BYTES // (domain.size * np.dtype(dtype).itemsize))


def _check_integer_dtype(dtype: np.dtype, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        raise ValueError(f"{what} has dtype {dtype}; counts must be integers")
    return dtype


def _check_shape(shape: tuple[int, ...], domain: Domain, geography: Geography, what: str) -> None:
    expected = (geography.n_units(), *domain.shape)
    if tuple(shape) != expected:
        raise ValueError(
            f"{what} has shape {tuple(shape)}; {geography.n_units():,} finest units "
            f"({geography.levels[-1]!r}) x {domain!r} need {expected}"
        )


_NEGATIVE, _TOO_LARGE = 1, 2


def _first_bad_row(block: np.ndarray, dtype: np.dtype) -> tuple[int, int]:
    """``(row, problem)`` of the first row with a negative count or one too large for
    ``dtype``; ``(-1, 0)`` if there is none."""
    if block.size and block.dtype.kind == "i" and block.min() < 0:
        return int(np.argwhere(block < 0)[0][0]), _NEGATIVE
    if block.size and block.max() > np.iinfo(dtype).max:
        return int(np.argwhere(block > np.iinfo(dtype).max)[0][0]), _TOO_LARGE
    return -1, 0


def _raise_bad_row(row: int, problem: int, dtype: np.dtype) -> None:
    if problem == _NEGATIVE:
        raise ValueError(f"counts hold a negative value at geography row {row}")
    if problem == _TOO_LARGE:
        top = np.iinfo(dtype).max
        raise ValueError(f"counts hold a value above {top} ({dtype}) at geography row {row}")


def _store_block(
    block: np.ndarray, target: zarr.Array, block_info: dict | None = None
) -> np.ndarray:
    """Write one geography chunk unless it holds a bad count; return ``[[row, problem]]``.

    Never raises on bad counts, so that every writer has finished before the caller
    raises and the temporary store is removed.
    """
    start, stop = block_info[0]["array-location"][0]
    row, problem = _first_bad_row(block, target.dtype)
    if not problem:
        target[start:stop] = block.astype(target.dtype, copy=False)
    return np.array([[row + start if problem else -1, problem]], dtype=np.int64)


def _store_checked(x: da.Array, target: zarr.Array) -> None:
    """Write ``x`` (chunked like ``target`` along geography); raise on the first bad row."""
    flags = x.map_blocks(
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
        _raise_bad_row(int(row), int(problem), target.dtype)


def _write_layout(
    root: pathlib.Path,
    domain: Domain,
    geography: Geography,
    dtype: np.dtype,
    geo_chunk: int,
    source: str,
) -> zarr.Array:
    """Create the group, its attributes, the geography arrays and an empty counts array."""
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
    counts = group.create_array(
        "counts",
        shape=(geography.n_units(), *domain.shape),
        dtype=dtype,
        chunks=(geo_chunk, *domain.shape),
        fill_value=0,
        dimension_names=("geography", *domain.attrs),
    )
    group.attrs["dpdask"] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "domain": [[k, v] for k, v in domain.items()],
        "geography_levels": list(geography.levels),
        "n_units": {lv: len(ids) for lv, ids in zip(geography.levels, geography.ids, strict=True)},
        "source": source,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "dpdask_version": __version__,
    }
    return counts


def _publish_store(
    path: str | os.PathLike,
    domain: Domain,
    geography: Geography,
    dtype: np.dtype,
    geo_chunk: int | None,
    overwrite: bool,
    source: str,
    fill: Callable[[zarr.Array], None],
) -> DataStore:
    geo_chunk = default_geo_chunk(domain, dtype) if geo_chunk is None else int(geo_chunk)
    if geo_chunk < 1:
        raise ValueError(f"geo_chunk must be a positive integer, got {geo_chunk}")
    geo_chunk = min(geo_chunk, geography.n_units())
    with publishing(path, overwrite) as tmp:
        counts = _write_layout(tmp, domain, geography, dtype, geo_chunk, source)
        fill(counts)
    return open_store(path)


def write_store(
    path: str | os.PathLike,
    counts: np.ndarray | da.Array,
    domain: Domain,
    geography: Geography,
    *,
    geo_chunk: int | None = None,
    dtype: np.dtype | str | None = None,
    overwrite: bool = False,
    source: str = "",
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
        Geographies per chunk (default: about 64 MiB per chunk).
    dtype : dtype, optional
        Integer dtype of the stored counts (default: that of ``counts``).
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    source : str
        Free text recorded in the attributes (where the counts came from).

    Returns
    -------
    DataStore

    Raises
    ------
    ValueError
        If the shape does not match domain and geography, the counts are not
        integers or a count is negative; nothing is left at ``path``.
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.
    """
    check_target(path, overwrite)
    _check_shape(counts.shape, domain, geography, "counts")
    _check_integer_dtype(counts.dtype, "counts")
    dtype = _check_integer_dtype(counts.dtype if dtype is None else dtype, "dtype")
    if isinstance(counts, np.ndarray):
        _raise_bad_row(*_first_bad_row(counts, dtype), dtype)

    def fill(target: zarr.Array) -> None:
        x = da.asarray(counts) if not isinstance(counts, da.Array) else counts
        x = x.rechunk((target.chunks[0], *(-1,) * len(domain)))
        _store_checked(x, target)

    return _publish_store(path, domain, geography, dtype, geo_chunk, overwrite, source, fill)


def adopt_array(
    source: Any,
    domain: Domain | None = None,
    geography: Geography | None = None,
    store: str | os.PathLike | None = None,
    *,
    geo_chunk: int | None = None,
    overwrite: bool = False,
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

    Returns
    -------
    DataStore

    Raises
    ------
    ValueError
        If ``source`` is not an integer array of the expected shape or holds a
        negative count; nothing is left at ``store``.
    """
    if store is None:
        raise ValueError("adopt_array needs store=, the directory of the new store")
    check_target(store, overwrite)
    if hasattr(source, "array") and hasattr(source, "geography"):
        domain = source.domain if domain is None else domain
        geography = source.geography if geography is None else geography
        source = source.array
    if not isinstance(source, zarr.Array):
        try:
            source = zarr.open_array(str(source), mode="r")
        except (FileNotFoundError, zarr.errors.NodeTypeValidationError) as exc:
            raise ValueError(f"{source} is not a zarr array: {exc}") from None
    if domain is None:
        recorded = dict(source.attrs).get("dpdask", {}).get("domain")
        if not isinstance(recorded, dict | list):
            raise ValueError("the source array records no domain; pass domain=")
        domain = Domain(recorded)
    if geography is None:
        raise ValueError("pass geography=: the rows' geography hierarchy")
    _check_shape(source.shape, domain, geography, "the source array")
    dtype = _check_integer_dtype(source.dtype, "the source array")
    x = da.from_zarr(source, chunks=source.chunks, name=f"adopt-{tokenize(source.store_path)}")
    return write_store(
        store,
        x,
        domain,
        geography,
        geo_chunk=source.chunks[0] if geo_chunk is None else geo_chunk,
        dtype=dtype,
        overwrite=overwrite,
        source=f"adopted from {source.store_path}",
    )


def open_store(path: str | os.PathLike) -> DataStore:
    """Open a data store and check its layout.

    Raises
    ------
    FileNotFoundError
        If nothing is at ``path``.
    ValueError
        If ``path`` is not a dpdask data store or its parts disagree (the message
        says which).
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no data store at {path}")
    try:
        group = zarr.open_group(str(path), mode="r", zarr_format=3)
    except (FileNotFoundError, zarr.errors.NodeTypeValidationError, ValueError) as exc:
        raise ValueError(f"{path} is not a zarr v3 group: {exc}") from None
    meta = dict(group.attrs).get("dpdask")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dpdask data store (no dpdask.format={FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: store format version {meta.get('format_version')} is not supported "
            f"(this dpdask reads version {FORMAT_VERSION})"
        )
    domain = Domain([(str(k), int(v)) for k, v in meta["domain"]])
    levels = tuple(meta["geography_levels"])
    try:
        ids = tuple(tuple(group[f"geography/{lv}/ids"][:].tolist()) for lv in levels)
        parents = tuple(group[f"geography/{lv}/parent"][:] for lv in levels[1:])
        counts = group["counts"]
    except KeyError as exc:
        raise ValueError(f"{path}: data store is missing {exc}") from None
    geography = Geography(levels, ids, parents)
    _check_shape(counts.shape, domain, geography, f"{path}/counts")
    _check_integer_dtype(counts.dtype, f"{path}/counts")
    if tuple(counts.chunks[1:]) != domain.shape:
        raise ValueError(f"{path}/counts is chunked along more than the geography axis")
    return DataStore(path, counts, domain, geography, meta)


def read_store(
    path: str | os.PathLike, lazy: bool = True
) -> tuple[da.Array | zarr.Array, Domain, Geography]:
    """Read a data store as ``(counts, domain, geography)``.

    Parameters
    ----------
    path : str or path-like
        The store.
    lazy : bool
        Return the counts as a Dask array chunked like the store (default) or as
        the zarr array itself.

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
    counts = store.to_dask() if lazy else store.counts
    return counts, store.domain, store.geography
