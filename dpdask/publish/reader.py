"""Reading a published release: as an xarray tree, or as a long table of answers.

A release (:mod:`dpdask.graph`) is a zarr v3 group with one group per
geography level; every array names its dimensions, so xarray opens it directly::

    import xarray as xr
    tree = xr.open_datatree("out/pl94-providence.zarr", engine="zarr")

:func:`open_release` does the same, checks that the store is a dpdask release, lists
the levels coarsest first (the order of the root attribute ``levels``; plain xarray
lists a zarr group's children alphabetically), brings releases written by older
versions to the current names, and adds each level's 90% margins of error,
``moe90 = 1.645 * sqrt(variance)`` (as the American Community Survey publishes them;
normal approximation of the noise). Each says what it is the margin of, as its
variance does: ``uncertainty_of`` (the estimator), ``describes_published`` (false
where the published estimate is not that estimator's: top-down, NNLS, ADMM, integer
rounding) and ``noise`` (the noise drawn). A level of such a non-linear estimator
adds, labelled, ``simulated_rmse`` by ``query_group`` ("RMSE by simulation around the
published estimate, K trials") and a child ``unbiased`` with the unbiased
least-squares answers of its own measurements and their exact variances and margins::

    tree = dpdask.open_release("out/pl94-providence.zarr")
    tract = tree["tract"].dataset
    tract.table_answers.sel(geography="44007000101", table_query="P1_001")  # total persons
    tract.table_moe90.sel(geography="44007000101", table_query="P1_001")
    tract.answers.sel(geography="44007000101", workload_query="race-single_001")
    tract.estimate.sel(votingage="18 years and over", hisp="Hispanic or Latino")

Each level's dataset has the dimensions ``geography`` (coordinates: the unit ids,
``parent`` and ``parent_id`` below the top), ``workload_query`` (the workload rows,
labelled ``{part}_{j:03d}`` with ``query_description``), one dimension per domain
attribute (``estimate``'s axes: the category names where the Census coding is known,
with the values ``0..n-1`` as ``<attr>_code``; the values otherwise), and for the PL94
workload ``table_query``, the cells of the P.L. 94-171 tables P1-P4 (``P1_001`` is the
total population; the labels are described in :mod:`dpdask.publish`).

No dimension or coordinate is named like an attribute of :class:`xarray.Dataset`, so
``ds.<name>`` always means the coordinate: releases written before this version name the
workload's dimension ``query`` (:meth:`xarray.Dataset.query`) and keep the category
names in ``<attr>_label``; :func:`open_release` renames ``query`` to ``workload_query``,
makes ``<attr>_label`` the index and keeps the values as ``<attr>_code``. Any other
dimension or coordinate named like a Dataset attribute (a domain attribute called
``count``, say) is shown as ``<name>_attr``.

:func:`release_table` and :func:`export_release` (``dpdask export``) flatten a level
into one row per geography and query (:mod:`dpdask.publish._export`).
"""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np

from dpdask.publish._export import (
    COLUMNS,
    MOE90_Z,
    check_release,
    export_release,
    provenance,
    query_spaces,
    release_table,
)
from dpdask.publish._labels import CODE_SUFFIX, QUERY_DIM

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

__all__ = [
    "COLUMNS",
    "MOE90_Z",
    "ReleaseChunks",
    "entry_rows",
    "export_release",
    "level_order",
    "open_release",
    "provenance",
    "query_spaces",
    "release_table",
    "shown_name",
]

#: how :func:`open_release` may chunk: as :func:`xarray.open_datatree` takes it (one
#: size, ``"auto"``, or a size per dimension; ``None`` reads lazily without Dask)
ReleaseChunks: TypeAlias = (
    int | str | tuple[int, ...] | Mapping[str, int | str | tuple[int, ...] | None] | None
)

_OLD_QUERY_DIM = "query"  # the workload's dimension in releases written before
_OLD_LABEL_SUFFIX = "_label"  # their category names' coordinate


def open_release(path: str | os.PathLike[str], *, chunks: ReleaseChunks = None) -> xr.DataTree:
    """Open a published release as an :class:`xarray.DataTree`, one child per level.

    Parameters
    ----------
    path : str or path-like
        The release (a zarr v3 group written by :meth:`dpdask.graph.Release.to_zarr`).
    chunks : int, str, tuple of int or mapping of str to those, optional
        As :func:`xarray.open_datatree` (:data:`ReleaseChunks`): ``None`` (default) reads
        lazily, loading what is indexed; ``{}`` gives Dask arrays chunked as stored (one
        geography unit per chunk).

    Returns
    -------
    xarray.DataTree
        Root attributes: the release's record (``release``, ``run_id``, ``dataset``,
        ``workload``, ``strategy``, ``budget``, ``levels`` and the full ``dpdask``
        record). Each level's dataset has ``estimate``, ``answers``, ``variance``,
        ``moe90`` (``1.645 * sqrt(variance)``) and, for the PL94 workload,
        ``table_answers``, ``table_variance`` and ``table_moe90``, with the coordinates
        of the module notes. Every variance and margin says what it is of (attributes
        ``uncertainty_of``, ``describes_published``, ``noise``). A level of a non-linear
        estimator (top-down, NNLS, WNNLS, ADMM) also has ``simulated_rmse`` by
        ``query_group`` and a child ``unbiased``: the unbiased
        least-squares answers of its measurements (``estimate``, ``variance``,
        ``moe90`` by ``unbiased_query``).

    Raises
    ------
    FileNotFoundError
        If nothing is at ``path``.
    dpdask.errors.ArgumentError
        If ``path`` is not a dpdask release (a ``ValueError``).

    Examples
    --------
    >>> tree = open_release("out/pl94-providence.zarr")  # doctest: +SKIP
    >>> tract = tree["tract"].dataset  # doctest: +SKIP
    >>> tract.table_answers.sel(geography="44007000101", table_query="P1_001")  # doctest: +SKIP
    >>> tract.answers.sel(workload_query="votingage_002")  # doctest: +SKIP
    >>> tract.estimate.sel(votingage="18 years and over")  # doctest: +SKIP
    """
    import xarray as xr

    path = check_release(path)
    tree = xr.open_datatree(str(path), engine="zarr", chunks=chunks)
    nodes: dict[str, xr.Dataset] = {"/": _current_names(tree.to_dataset())}
    for lv in level_order(tree.attrs, tree.children):
        ds = tree[lv].to_dataset()
        if "entry_offsets" in ds:
            ds = _with_sparse_estimate(path / lv, ds, _domain_order(tree.attrs))
        ds = _current_names(ds)
        nodes[f"/{lv}"] = _with_margins(ds)
        if "unbiased" in tree[lv].children:  # a top-down level: its unbiased answers
            nodes[f"/{lv}/unbiased"] = _with_margins(tree[lv]["unbiased"].to_dataset())
        if "marginals" in tree[lv].children:  # a marginal release: one table per marginal
            for name, node in tree[lv]["marginals"].children.items():
                nodes[f"/{lv}/marginals/{name}"] = node.to_dataset()
    return xr.DataTree.from_dict(nodes)


_UNCERTAINTY_KEYS = ("uncertainty_of", "describes_published", "noise", "estimator")


def _with_margins(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with ``moe90`` (and ``table_moe90``) beside each variance, saying what
    they are the margins of as the variance does (``uncertainty_of``, ``noise``)."""
    for prefix in ("", "table_"):
        var = f"{prefix}variance"
        if var in ds:
            moe = cast("xr.DataArray", MOE90_Z * np.sqrt(ds[var]))  # a ufunc keeps the type
            moe.attrs = {
                "units": "persons",
                "long_name": "90% margin of error (1.645 standard deviations)",
                **{k: ds[var].attrs[k] for k in _UNCERTAINTY_KEYS if k in ds[var].attrs},
            }
            ds[f"{prefix}moe90"] = moe
    return ds


def level_order(attrs: Mapping[Any, Any], groups: Iterable[str]) -> list[str]:
    """A release's levels coarsest first: as its root attribute ``levels`` lists them,
    then any other group, in the order given.

    Parameters
    ----------
    attrs : mapping
        The release's root attributes.
    groups : iterable of str
        The names of the release's groups (zarr and plain xarray list them alphabetically).

    Returns
    -------
    list of str

    Examples
    --------
    >>> level_order({"levels": ["state", "county", "tract"]}, ["county", "state", "tract"])
    ['state', 'county', 'tract']
    """
    groups = list(groups)
    order = [lv for lv in attrs.get("levels") or [] if isinstance(lv, str) and lv in groups]
    return order + [g for g in groups if g not in order]


def shown_name(name: str) -> str:
    """The name :func:`open_release` shows for a stored dimension or coordinate name.

    ``query`` (the workload's dimension in older releases) is ``workload_query``; any
    other name of an attribute of :class:`xarray.Dataset` gets the suffix ``_attr``, so
    that ``ds.<name>`` is never a method; every other name is kept.

    Examples
    --------
    >>> shown_name("query"), shown_name("count"), shown_name("votingage")
    ('workload_query', 'count_attr', 'votingage')
    """
    import xarray as xr

    if name == _OLD_QUERY_DIM:
        return QUERY_DIM
    return f"{name}_attr" if hasattr(xr.Dataset, name) else name


def _current_names(ds: xr.Dataset) -> xr.Dataset:
    """A level's dataset with the current names: category names as the attribute's
    index and its values as ``<attr>_code`` (older releases: ``<attr>_label``), and no
    dimension or coordinate named like a Dataset attribute (:func:`shown_name`)."""
    for attr in list(ds.dims):
        old = f"{attr}{_OLD_LABEL_SUFFIX}"
        if old not in ds.variables or ds[old].dims != (attr,):
            continue
        names = np.array(np.asarray(ds[old].values).tolist(), dtype=str)
        if len(set(names.tolist())) != names.size:  # not an index: leave as stored
            continue
        codes = ds[attr].values if attr in ds.variables else np.arange(names.size)
        ds = ds.drop_vars([old, *([attr] if attr in ds.variables else [])])
        ds = ds.assign_coords({attr: names, f"{attr}{CODE_SUFFIX}": (attr, codes)})
    shown = set(ds.dims) | set(ds.coords)
    renames = {n: shown_name(str(n)) for n in shown if shown_name(str(n)) != n}
    return ds.rename(renames) if renames else ds


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


def _domain_order(attrs: Mapping[Any, Any]) -> list[str]:
    record = attrs.get("dpdask")
    domain = record.get("domain") if isinstance(record, Mapping) else None
    return [str(a) for a in domain] if isinstance(domain, Mapping) else []


def _with_sparse_estimate(path: pathlib.Path, ds: xr.Dataset, order: list[str]) -> xr.Dataset:
    """A sparse level's dataset with ``estimate`` as a lazy ``(geography, *attrs)`` Dask
    array of :class:`sparse.COO` chunks (the stored entries kept as ``entry_*``), its
    attribute axes in the domain's order ``order`` (the entries' flat cells are in its C
    order; the dataset lists dimensions as the store lists arrays, alphabetically)."""
    import dask.array as da
    import sparse
    import xarray as xr
    import zarr
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    g = zarr.open_group(str(path), mode="r")
    not_attrs = (
        "geography", _OLD_QUERY_DIM, QUERY_DIM, "table_query", "entry", "geography_bound",
        "query_group",
    )  # fmt: skip
    attrs = [d for d in ds.dims if d not in not_attrs]
    if set(order) == set(attrs):
        attrs = list(order)
    shape = tuple(int(ds.sizes[d]) for d in attrs)
    n_units = int(ds.sizes["geography"])
    bounds = [*list(range(0, n_units, _GEOGRAPHIES_PER_CHUNK)), n_units]
    name = f"release-estimate-{tokenize(str(path), n_units)}"
    zeros = (0,) * len(shape)
    dsk: dict[Any, Any] = {
        (name, k, *zeros): (_entries_block, str(path), a, b, shape)
        for k, (a, b) in enumerate(itertools.pairwise(bounds))
    }
    chunks = (tuple(np.diff(bounds).tolist()), *((s,) for s in shape))
    meta = sparse.COO.from_numpy(np.empty((0,) * (1 + len(shape))))
    graph = HighLevelGraph.from_collections(name, dsk, ())
    arr = da.Array(graph, name, chunks, np.float64, meta=meta)  # type: ignore[no-untyped-call]
    entries = ds["estimate"].rename("entry_estimate")
    ds = ds.drop_vars("estimate").assign(entry_estimate=entries)
    est = xr.DataArray(arr, dims=("geography", *attrs), attrs=dict(g["estimate"].attrs))
    est.attrs["long_name"] = "estimate of each cell's count (sparse: zero off the entries)"
    return ds.assign(estimate=est)
