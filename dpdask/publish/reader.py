"""Reading a published release: as an xarray tree, or as a long table of answers.

A release (:mod:`dpdask.dataflow.release`) is a zarr v3 group with one group per
geography level; every array names its dimensions, so xarray opens it directly::

    import xarray as xr
    tree = xr.open_datatree("out/pl94-providence.zarr", engine="zarr")

:func:`open_release` does the same, checks that the store is a dpdask release, and
adds each level's 90% margins of error, ``moe90 = 1.645 * sqrt(variance)`` (as the
American Community Survey publishes them; normal approximation of the noise)::

    tree = dpdask.open_release("out/pl94-providence.zarr")
    tract = tree["tract"].dataset
    tract.table_answers.sel(geography="44007000101", table_query="P1_001")  # total persons
    tract.table_moe90.sel(geography="44007000101", table_query="P1_001")
    tract.answers.sel(geography="44007000101", query="race-single_001")

Each level's dataset has the dimensions ``geography`` (coordinates: the unit ids,
``parent`` and ``parent_id`` below the top), ``query`` (the workload rows, labelled
``{part}_{j:03d}`` with ``query_description``), one dimension per domain attribute
(``estimate``'s axes: values ``0..n-1`` and, where the Census coding is known,
``<attr>_label``), and for the PL94 workload ``table_query``, the cells of the
P.L. 94-171 tables P1-P4 (``P1_001`` is the total population; the labels are
described in :mod:`dpdask.publish`). ``ds.query`` is
:meth:`xarray.Dataset.query`: reach the labels as ``ds["query"]`` (``.sel(query=...)``
works as usual).

:func:`release_table` and :func:`export_release` (``dpdask export``) flatten a level
into one row per geography and query: ``geography``, ``parent``, ``query``,
``answer``, ``variance`` and ``moe90``.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import xarray as xr

__all__ = [
    "COLUMNS",
    "MOE90_Z",
    "entry_rows",
    "export_release",
    "open_release",
    "release_table",
]

MOE90_Z = 1.645
"""Normal quantile of a 90% margin of error: ``moe90 = 1.645 * sqrt(variance)`` (as ACS)."""

COLUMNS: tuple[str, ...] = ("geography", "parent", "query", "answer", "variance", "moe90")
"""Columns of :func:`release_table` and of ``dpdask export``."""

_ROWS_PER_BATCH = 1_000_000  # rows of the long table built in memory at once


def _check(path: str | os.PathLike) -> pathlib.Path:
    from dpdask.publish import release_attributes

    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no release at {path}")
    if release_attributes(path) is None:
        raise ValueError(f"{path} is not a dpdask release (no dpdask release attributes)")
    return path


def open_release(path: str | os.PathLike, *, chunks: Any = None) -> xr.DataTree:
    """Open a published release as an :class:`xarray.DataTree`, one child per level.

    Parameters
    ----------
    path : str or path-like
        The release (a zarr v3 group written by :meth:`dpdask.dataflow.release.Release.to_zarr`).
    chunks : optional
        As :func:`xarray.open_datatree`: ``None`` (default) reads lazily, loading what is
        indexed; ``{}`` gives Dask arrays chunked as stored (one geography unit per chunk).

    Returns
    -------
    xarray.DataTree
        Root attributes: the release's record (``release``, ``run_id``, ``dataset``,
        ``workload``, ``strategy``, ``budget``, ``levels`` and the full ``dpdask``
        record). Each level's dataset has ``estimate``, ``answers``, ``variance``,
        ``moe90`` (``1.645 * sqrt(variance)``) and, for the PL94 workload,
        ``table_answers``, ``table_variance`` and ``table_moe90``, with the coordinates
        of the module notes.

    Raises
    ------
    FileNotFoundError
        If nothing is at ``path``.
    ValueError
        If ``path`` is not a dpdask release.

    Examples
    --------
    >>> tree = open_release("out/pl94-providence.zarr")  # doctest: +SKIP
    >>> tract = tree["tract"].dataset  # doctest: +SKIP
    >>> tract.table_answers.sel(geography="44007000101", table_query="P1_001")  # doctest: +SKIP
    """
    import xarray as xr

    path = _check(path)
    tree = xr.open_datatree(str(path), engine="zarr", chunks=chunks)
    # the levels coarsest first (the consolidated metadata lists groups alphabetically)
    order = [lv for lv in tree.attrs.get("levels", []) if lv in tree.children]
    order += [lv for lv in tree.children if lv not in order]
    nodes: dict[str, xr.Dataset] = {"/": tree.to_dataset()}
    for lv in order:
        ds = tree[lv].to_dataset()
        if "entry_offsets" in ds:
            ds = _with_sparse_estimate(path / lv, ds)
        for prefix in ("", "table_"):
            var = f"{prefix}variance"
            if var in ds:
                moe = MOE90_Z * np.sqrt(ds[var])
                moe.attrs = {
                    "units": "persons",
                    "long_name": "90% margin of error (1.645 standard deviations)",
                }
                ds[f"{prefix}moe90"] = moe
        nodes[f"/{lv}"] = ds
    return xr.DataTree.from_dict(nodes)


_GEOGRAPHIES_PER_CHUNK = 4096  # units per chunk of a sparse level's estimate


def entry_rows(group: Any, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Units ``a..b-1`` of a level published as entries (a zarr group with
    ``entry_offsets``): their entries' unit indices (from ``a``), flat cells and values,
    read from those entries only.

    Parameters
    ----------
    group : zarr.Group
        The level's group.
    a, b : int
        The range of unit indices.

    Returns
    -------
    ndarray, ndarray, ndarray
        ``rows - a`` (int64), ``cells`` (int64, flat in C order of the attributes) and
        ``values`` (float64), sorted by unit, then cell.
    """
    lo, hi = (int(v) for v in group["entry_offsets"][[a, b]])
    rows = np.asarray(group["entry_geography"][lo:hi], dtype=np.int64) - a
    cells = np.asarray(group["entry_cell"][lo:hi], dtype=np.int64)
    return rows, cells, np.asarray(group["estimate"][lo:hi], dtype=np.float64)


def _entries_block(path: str, a: int, b: int, shape: tuple[int, ...]) -> Any:
    """Units ``a..b-1`` of a sparse level's estimate: a :class:`sparse.COO` of shape
    ``(b - a, *shape)`` read from the entries they own (``entry_offsets``)."""
    import sparse
    import zarr

    rows, cells, values = entry_rows(zarr.open_group(path, mode="r"), a, b)
    coords = np.vstack([rows[None], np.vstack(np.unravel_index(cells, shape))])
    return sparse.COO(coords, values, shape=(b - a, *shape), sorted=True, has_duplicates=False)


def _with_sparse_estimate(path: pathlib.Path, ds: xr.Dataset) -> xr.Dataset:
    """A sparse level's dataset with ``estimate`` as a lazy ``(geography, *attrs)`` Dask
    array of :class:`sparse.COO` chunks (the stored entries kept as ``entry_*``)."""
    import dask.array as da
    import sparse
    import xarray as xr
    import zarr
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    g = zarr.open_group(str(path), mode="r")
    attrs = [d for d in ds.dims if d not in ("geography", "query", "table_query", "entry",
                                              "geography_bound")]  # fmt: skip
    shape = tuple(int(ds.sizes[d]) for d in attrs)
    n_units = int(ds.sizes["geography"])
    bounds = [*list(range(0, n_units, _GEOGRAPHIES_PER_CHUNK)), n_units]
    name = f"release-estimate-{tokenize(str(path), n_units)}"
    zeros = (0,) * len(shape)
    dsk = {
        (name, k, *zeros): (_entries_block, str(path), a, b, shape)
        for k, (a, b) in enumerate(itertools.pairwise(bounds))
    }
    chunks = (tuple(np.diff(bounds).tolist()), *((s,) for s in shape))
    meta = sparse.COO.from_numpy(np.empty((0,) * (1 + len(shape))))
    arr = da.Array(HighLevelGraph.from_collections(name, dsk, ()), name, chunks, np.float64,
                   meta=meta)  # fmt: skip
    entries = ds["estimate"].rename("entry_estimate")
    ds = ds.drop_vars("estimate").assign(entry_estimate=entries)
    est = xr.DataArray(arr, dims=("geography", *attrs), attrs=dict(g["estimate"].attrs))
    est.attrs["long_name"] = "estimate of each cell's count (sparse: zero off the entries)"
    return ds.assign(estimate=est)


def _labels(group: Any, name: str) -> np.ndarray:
    if name not in group:
        return np.array([], dtype=str)
    return np.array(np.asarray(group[name][:]).tolist(), dtype=str)  # from numpy's StringDType


def _select(
    wanted: Sequence[str] | None, available: Sequence[np.ndarray], what: str
) -> list[np.ndarray]:
    """Indices into each label array of the labels wanted (all if ``None``), in their order."""
    if wanted is None:
        return [np.arange(a.size) for a in available]
    picks: list[list[int]] = [[] for _ in available]
    where = {}
    for k, a in enumerate(available):
        for i, lab in enumerate(a.tolist()):
            where.setdefault(lab, (k, i))
    missing = [w for w in wanted if w not in where]
    if missing:
        raise ValueError(f"unknown {what}(s) {missing[:5]}")
    for w in dict.fromkeys(wanted):
        k, i = where[w]
        picks[k].append(i)
    return [np.asarray(p, dtype=np.int64) for p in picks]


def _batches(
    path: str | os.PathLike,
    level: str,
    queries: Sequence[str] | None,
    geographies: Sequence[str] | None,
) -> Iterator[pd.DataFrame]:
    import pandas as pd
    import zarr

    path = _check(path)
    root = zarr.open_group(str(path), mode="r")
    levels = [name for name, _ in root.groups()]
    if level not in levels:
        raise ValueError(f"the release has no level {level!r}; its levels are {sorted(levels)}")
    g = root[level]
    ids = _labels(g, "ids")
    parent = _labels(g, "parent_id") if "parent_id" in g else None
    # the workload rows, then the Census table cells (their labels never overlap)
    spaces = [("query", "answers", "variance"), ("table_query", "table_answers", "table_variance")]
    spaces = [s for s in spaces if s[0] in g]
    picks = _select(queries, [_labels(g, s[0]) for s in spaces], "query label")
    (units,) = _select(geographies, [ids], f"{level} id")
    n_q = sum(p.size for p in picks)
    step = max(1, _ROWS_PER_BATCH // max(1, n_q))
    for start in range(0, units.size, step):
        u = units[start : start + step]
        frames = []
        for (label, ans, var), q in zip(spaces, picks, strict=True):
            if not q.size:
                continue
            a = np.asarray(g[ans].get_orthogonal_selection((u, q)))
            if g[var].ndim == 1:  # one variance per query for every unit of the level
                v = np.broadcast_to(np.asarray(g[var].get_orthogonal_selection((q,))), a.shape)
            else:
                v = np.asarray(g[var].get_orthogonal_selection((u, q)))
            frames.append(
                pd.DataFrame(
                    {
                        "geography": np.repeat(ids[u], q.size),
                        "parent": np.repeat(parent[u], q.size) if parent is not None else None,
                        "query": np.tile(_labels(g, label)[q], u.size),
                        "answer": a.ravel(),
                        "variance": v.ravel(),
                        "moe90": MOE90_Z * np.sqrt(v.ravel()),
                    }
                )
            )
        if frames:
            df = pd.concat(frames, ignore_index=True)
            # unit by unit, queries in the order asked (workload rows before table cells)
            yield df.sort_values("geography", kind="stable", key=_order(ids[u]))


def _order(ids: np.ndarray):
    rank = {v: i for i, v in enumerate(ids.tolist())}
    return lambda s: s.map(rank)


def release_table(
    path: str | os.PathLike,
    level: str,
    *,
    queries: Sequence[str] | None = None,
    geographies: Sequence[str] | None = None,
) -> pd.DataFrame:
    """A level's answers as a long table: one row per geography unit and query.

    Parameters
    ----------
    path : str or path-like
        The release.
    level : str
        The geography level (a group of the release).
    queries : sequence of str, optional
        Query labels (workload rows such as ``race-single_003``, or P.L. 94-171 cells
        such as ``P1_001``); default every workload row and table cell.
    geographies : sequence of str, optional
        Unit ids of the level; default all.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`: ``geography`` (id), ``parent`` (the parent's id;
        missing at the top level), ``query``, ``answer``, ``variance`` and ``moe90``
        (``1.645 * sqrt(variance)``, the 90% margin of error).

    Raises
    ------
    ValueError
        If the level, a query label or a geography id is unknown, or ``path`` is not a
        dpdask release.
    """
    import pandas as pd

    frames = list(_batches(path, level, queries, geographies))
    if not frames:
        return pd.DataFrame({c: [] for c in COLUMNS})
    return pd.concat(frames, ignore_index=True)[list(COLUMNS)]


def export_release(
    path: str | os.PathLike,
    level: str,
    out: str | os.PathLike,
    format: str = "parquet",
    *,
    queries: Sequence[str] | None = None,
    geographies: Sequence[str] | None = None,
    overwrite: bool = False,
) -> int:
    """Write :func:`release_table` to a Parquet or CSV file, in batches of units.

    Parameters
    ----------
    path : str or path-like
        The release.
    level : str
        The geography level.
    out : str or path-like
        The file to write (written under a temporary name and renamed when complete);
        ``"-"`` writes CSV to standard output.
    format : {"parquet", "csv"}
        The file format.
    queries, geographies : sequence of str, optional
        As :func:`release_table`.
    overwrite : bool
        Replace an existing ``out``.

    Returns
    -------
    int
        The number of rows written.

    Raises
    ------
    ValueError
        For an unknown format, level, query or geography (nothing is written).
    dpdask.dataflow.StoreExistsError
        If ``out`` exists and ``overwrite`` is false (a ``FileExistsError`` and a
        ``ValueError``).
    """
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpdask.publish import StoreExistsError

    if format not in ("parquet", "csv"):
        raise ValueError(f"format {format!r} is not one of parquet, csv")
    if str(out) == "-" and format != "csv":
        raise ValueError("only csv can be written to standard output")
    batches = _batches(path, level, queries, geographies)
    if str(out) == "-":
        n, header = 0, True
        for df in batches:
            df[list(COLUMNS)].to_csv(sys.stdout, index=False, header=header)
            n, header = n + len(df), False
        if header:
            print(",".join(COLUMNS))
        return n
    target = pathlib.Path(out)
    if target.exists() and not overwrite:
        raise StoreExistsError(f"{target} exists; choose another --out (or --overwrite)")
    schema = pa.schema(
        [("geography", pa.string()), ("parent", pa.string()), ("query", pa.string()),
         ("answer", pa.float64()), ("variance", pa.float64()), ("moe90", pa.float64())]
    )  # fmt: skip
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    n = 0
    try:
        if format == "parquet":
            with pq.ParquetWriter(tmp, schema) as writer:
                for df in batches:
                    table = pa.Table.from_pandas(df[list(COLUMNS)], schema=schema,
                                                 preserve_index=False)  # fmt: skip
                    writer.write_table(table)
                    n += len(df)
        else:
            with open(tmp, "w", newline="") as f:
                f.write(",".join(COLUMNS) + "\n")
                for df in batches:
                    df[list(COLUMNS)].to_csv(f, index=False, header=False)
                    n += len(df)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n
