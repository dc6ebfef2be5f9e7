"""The published release: per level, estimates, workload answers and their variances.

The layout is in :mod:`dpdask.graph._release`; the labels in
:mod:`dpdask.publish`. Every per-geography array is chunked along the geography axis in
regular chunks of about :data:`OUTPUT_CHUNK_BYTES` (:func:`output_rows`), at least one
row; the level's Dask chunks (uneven, aligned to parents) are rechunked to them before
the store, so every write task writes whole zarr chunks and none shares one. A row per
zarr chunk would make a file per geography and array: millions at the block level.

Every array carries zarr v3 ``dimension_names``, so that xarray opens a release
(``xr.open_datatree(path, engine="zarr")``, one group per level) with its
coordinates. Per level group::

    geography          str (geography,)               unit ids (the index coordinate)
    ids                str (geography,)               the same ids (kept for older readers)
    parent             int64 (geography,)             parent index in the level above
    parent_id          str (geography,)               the parent's id          (not the top)
    workload_query     str (workload_query,)          workload row labels, e.g. race-single_003
    query_description  str (workload_query,)          what each row counts
    <attr>             str (<attr>,)                  each attribute's category names, where
                                                      the coding is known (the index, so that
                                                      ``sel(votingage="18 years and over")``)
    <attr>_code        int64 (<attr>,)                their values 0..n-1
    <attr>             int64 (<attr>,)                the values 0..n-1 of an attribute whose
                                                      coding is unknown (no ``_code``)
    estimate           float64 (geography, *attrs)    consistent estimates (persons)
    answers            float64 (geography, workload_query)  workload answers (persons)
    variance           float64 (geography, workload_query)  their variances (persons^2)

The workload's dimension is ``workload_query``, not ``query``, which would shadow
:meth:`xarray.Dataset.query` (releases written before are renamed by
:func:`dpdask.open_release`, as is their ``<attr>_label`` coordinate).

and, for the PL94 workload, the P.L. 94-171 tables P1-P4 computed from the same
estimates (:func:`~dpdask.publish.published_tables`)::

    table_query        str (table_query,)             P1_001 .. P4_073
    table_description  str (table_query,)             the Census's line labels
    table_answers      float64 (geography, table_query)
    table_variance     float64 (geography, table_query)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask.domain import Domain
from dpdask.graph._blocks import answer_block
from dpdask.graph._uncertainty import LINEAR, estimator_label, uncertainty_attrs
from dpdask.publish import (
    CODE_SUFFIX,
    FLAT_KEYS,
    QUERY_DIM,
    category_labels,
    published_tables,
    query_descriptions,
    query_labels,
)
from dpdask.store import level_key

__all__ = [
    "OUTPUT_CHUNK_BYTES",
    "LevelGroup",
    "add_array",
    "level_group",
    "level_outputs",
    "output_rows",
]

OUTPUT_CHUNK_BYTES = 4 * 2**20
"""Target size of a published array's zarr chunk (uncompressed)."""


def output_rows(n_rows: int, row_bytes: int, target: int = OUTPUT_CHUNK_BYTES) -> int:
    """Rows per zarr chunk: about ``target`` bytes, at least one row, at most ``n_rows``.

    Examples
    --------
    >>> output_rows(700_000, 252 * 8), output_rows(3143, 492_660 * 8), output_rows(5, 8)
    (2080, 1, 5)
    """
    return max(1, min(int(n_rows), int(target) // max(1, int(row_bytes))))


_RESERVED = frozenset(
    {"geography", "ids", "parent", "parent_id", "query", "workload_query",
     "query_description", "estimate",
     "answers", "variance", "table_query", "table_description", "table_answers",
     "table_variance"}
)  # fmt: skip


def _strings(g: zarr.Group, name: str, values: Any, dim: str, long_name: str) -> None:
    values = np.asarray(values, dtype=str)
    g.create_array(
        name, shape=values.shape, dtype=str, dimension_names=(dim,),
        attributes={"long_name": long_name},
    )[:] = values  # fmt: skip


def _coordinates(domain: Domain | None) -> dict[str, Any]:
    """The per-attribute coordinate arrays: the category names (where known) as the
    index and the values ``0..n-1`` as ``<attr>_code``; the values as the index otherwise."""
    if domain is None:
        return {}
    out: dict[str, Any] = {}
    for attr, names in category_labels(domain).items():
        if attr in _RESERVED or f"{attr}{CODE_SUFFIX}" in _RESERVED:
            continue
        codes = np.arange(domain[attr], dtype=np.int64)
        if names is None or len(set(names)) < len(names) or f"{attr}{CODE_SUFFIX}" in domain.attrs:
            out[attr] = codes
        else:
            out[attr] = np.asarray(names, dtype=str)
            out[f"{attr}{CODE_SUFFIX}"] = codes
    return out


def table_variances(plan: Any, queries: Any, domain: Domain) -> np.ndarray | None:
    """Variances of further queries of a level's estimates for a unit of variance (as a
    level plan's :meth:`~dpdask.strategy.Plan.query_variances` for the workload), or
    None if not computable."""
    from dpdask.strategy.analysis import ErrorAnalysis

    base = getattr(plan, "base", None)
    if base is None or getattr(base, "groups", None) is not None:
        return None
    try:
        ev = ErrorAnalysis(queries, base.strategy, domain.shape).variances()
    except (ValueError, NotImplementedError):
        return None
    out: np.ndarray = np.asarray(ev, dtype=float) * plan.row_variance
    return out


@dataclass
class LevelGroup:
    """One level's group of the output, with what its arrays share (:func:`level_group`)."""

    group: zarr.Group
    attrs: tuple[str, ...]  # the estimate's attribute dimensions
    coords: list[str]  # the non-index coordinates, for CF ``coordinates`` attributes
    workload: Any
    tables: tuple[Any, ...] | None  # (labels, descriptions, queries) of the published tables
    table_variances: np.ndarray | None  # their variances for the level's noise


def level_group(
    root: zarr.Group,
    i: int,
    levels: Sequence[tuple[str, Any, float]],
    ids: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    domain: Domain | None,
    cell_shape: tuple[int, ...],
    labelled: dict[int, tuple[Any, ...]],
) -> LevelGroup:
    """Create level ``i``'s group with its ids, parents, query labels and attribute
    coordinates (everything but the per-geography arrays); ``labelled`` caches the
    labels per workload (per-level plans may share one)."""
    name, plan, _ = levels[i]
    dom = domain if domain is not None else getattr(plan, "domain", None)
    if dom is not None and dom.shape != tuple(cell_shape):
        dom = None
    attrs = (
        tuple(dom.attrs)
        if dom is not None and not set(dom.attrs) & _RESERVED
        else tuple(f"dim_{k}" for k in range(len(cell_shape)))
    )
    g = root.create_group(name)
    level_ids = np.asarray(ids[i])
    for array in ("geography", "ids"):
        g.create_array(
            array, shape=level_ids.shape,
            dtype=level_ids.dtype.str if level_ids.dtype.kind != "U" else str,
            dimension_names=("geography",),
            attributes={"long_name": f"{name} id"},
        )[:] = level_ids  # fmt: skip
    coords = ["ids"]
    if i > 0:
        p = parents[i - 1]
        g.create_array(
            "parent", shape=p.shape, dtype="int64", dimension_names=("geography",),
            attributes={"long_name": f"index of the {levels[i - 1][0]} containing the unit"},
        )[:] = p  # fmt: skip
        _strings(g, "parent_id", np.asarray(ids[i - 1])[p], "geography",
                 f"id of the {levels[i - 1][0]} containing the unit")  # fmt: skip
        coords += ["parent", "parent_id"]
    W = plan.workload
    if id(W) not in labelled:
        tables = published_tables(W, dom)
        labelled[id(W)] = (
            query_labels(W, dom),
            query_descriptions(W, dom) if dom is not None else [""] * W.shape[0],
            tables,
        )
    labels, descriptions, tables = labelled[id(W)]
    _strings(g, QUERY_DIM, labels, QUERY_DIM, "workload query")
    _strings(g, "query_description", descriptions, QUERY_DIM, "what the query counts")
    coords.append("query_description")
    if dom is not None and attrs == tuple(dom.attrs):
        for cname, values in _coordinates(dom).items():
            attr = cname.removesuffix(CODE_SUFFIX) if cname not in dom.attrs else cname
            if values.dtype.kind == "U":
                _strings(g, cname, values, attr, f"{attr} category")
            else:
                g.create_array(
                    cname, shape=values.shape, dtype="int64", dimension_names=(attr,),
                    attributes={"long_name": f"{attr} value"},
                )[:] = values  # fmt: skip
                if cname != attr:
                    coords.append(cname)
    tv = None if tables is None or dom is None else table_variances(plan, tables[2], dom)
    if tables is not None and tv is not None:
        t_labels, t_descriptions, _ = tables
        _strings(g, "table_query", t_labels, "table_query", "Census table cell")
        _strings(g, "table_description", t_descriptions, "table_query",
                 "the Census's label of the cell")  # fmt: skip
        coords.append("table_description")
    else:
        tables = None
    return LevelGroup(g, attrs, coords, W, tables, tv)


def add_array(
    lg: LevelGroup,
    name: str,
    arr: Any,
    dims: tuple[str, ...],
    units: str,
    long_name: str,
    *,
    dtype: str = "float64",
    compressed: bool = True,
    rows: int | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> tuple[Any, zarr.Array[Any]] | None:
    """Create array ``name`` in the level's group (further attributes ``attrs``); a
    NumPy ``arr`` is written at once (returns None), a Dask one is rechunked to the
    array's regular chunks and returned with its target for :func:`dask.array.store`."""
    g = lg.group
    if rows is None:
        rows = output_rows(arr.shape[0], np.dtype(dtype).itemsize * int(np.prod(arr.shape[1:])))
    z = g.create_array(
        name, shape=arr.shape, dtype=dtype, chunks=(rows, *arr.shape[1:]),
        compressors="auto" if compressed else None,
        chunk_key_encoding=FLAT_KEYS, dimension_names=dims,  # type: ignore[arg-type]
        attributes={
            "units": units, "long_name": long_name,
            # CF: the non-index coordinates xarray attaches to the variable
            "coordinates": " ".join(c for c in lg.coords if set(_dims(g, c)) <= set(dims)),
            **(attrs or {}),
        },
    )  # fmt: skip
    if isinstance(arr, np.ndarray):
        z[...] = arr
        return None
    return arr.rechunk({0: rows}), z


def level_outputs(
    root: zarr.Group,
    levels: Sequence[tuple[str, Any, float]],
    estimates: Sequence[da.Array],
    variances: Sequence[np.ndarray],
    ids: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    domain: Domain | None = None,
    sparse_estimates: bool = False,
    reconstruct: str = "ls",
    extra: Callable[[int, LevelGroup], list[tuple[Any, Any]]] | None = None,
) -> tuple[list[da.Array], list[zarr.Array[Any]]]:
    """Create every level's group in ``root`` and pair its lazy arrays with their targets.

    Parameters
    ----------
    root : zarr.Group
        The output group (empty).
    levels : sequence of (name, plan, unit variance)
        Coarsest first; the plan gives the workload and its query variances for a unit
        of variance ``unit variance``.
    estimates : sequence of dask.array.Array
        Each level's final estimates ``(n_units, *domain.shape)``.
    variances : sequence of ndarray
        Each level's per-unit variance scalars ``(n_units,)``.
    ids, parents : sequence of ndarray
        Each level's unit ids, and each level's parent index below the top.
    domain : Domain, optional
        The data domain: names the estimate's axes and labels the queries (default: the
        plan's domain; axes ``dim_0``, ``dim_1``, ... without one).
    sparse_estimates : bool
        The estimates are mostly zeros (a non-negative estimator): compress them too.
        Noisy least-squares estimates do not compress, so by default they are stored
        raw; every other array is always compressed.
    reconstruct : str
        The estimator: labels what the variances are of
        (:mod:`dpdask.graph._uncertainty`).
    extra : callable, optional
        ``extra(i, level_group)`` adds further arrays to level ``i``'s group (a
        non-linear estimator's unbiased answers) and returns their lazy (source,
        target) pairs.

    Returns
    -------
    list of dask.array.Array, list of zarr.Array
        Sources and targets for :func:`dask.array.store`; the labels, ``ids`` and
        ``parent`` are written at once.
    """
    sources: list[da.Array] = []
    targets: list[zarr.Array[Any]] = []
    labelled: dict[int, tuple[Any, ...]] = {}  # per workload (per-level plans may share one)
    for i, ((name, plan, unit_variance), est) in enumerate(zip(levels, estimates, strict=True)):
        lg = level_group(root, i, levels, ids, parents, domain, tuple(est.shape[1:]), labelled)
        W = lg.workload
        answers = est.map_blocks(
            answer_block, W, chunks=(est.chunks[0], (W.shape[0],)),  # type: ignore[arg-type]
            drop_axis=list(range(2, est.ndim)), dtype=np.float64,
            name=f"answer-{level_key(name)}-{tokenize(est, W)}", meta=np.empty((0, 0)),
        )  # fmt: skip
        qv = plan.query_variances()
        scale = variances[i] / unit_variance
        variance = da.from_array(scale[:, None], chunks=(est.chunks[0], 1)) * qv[None, :]  # type: ignore[no-untyped-call]
        outputs = [
            ("estimate", est, ("geography", *lg.attrs), "persons",
             "consistent estimate of each cell's count", sparse_estimates),
            ("answers", answers, ("geography", QUERY_DIM), "persons", "workload answer", True),
            ("variance", variance, ("geography", QUERY_DIM), "persons^2",
             "variance of the workload answer", True),
        ]  # fmt: skip
        if lg.tables is not None and lg.table_variances is not None:
            Q = lg.tables[2]
            t_answers = est.map_blocks(
                answer_block, Q, chunks=(est.chunks[0], (Q.shape[0],)),  # type: ignore[arg-type]
                drop_axis=list(range(2, est.ndim)), dtype=np.float64,
                name=f"answer-{level_key(name)}-{tokenize(est, Q)}", meta=np.empty((0, 0)),
            )  # fmt: skip
            tv = lg.table_variances
            t_variance = da.from_array(scale[:, None], chunks=(est.chunks[0], 1)) * tv[None, :]  # type: ignore[no-untyped-call]
            outputs += [
                ("table_answers", t_answers, ("geography", "table_query"), "persons",
                 "P.L. 94-171 table cell, from the consistent estimates", True),
                ("table_variance", t_variance, ("geography", "table_query"), "persons^2",
                 "variance of the table cell", True),
            ]  # fmt: skip
        label = uncertainty_attrs(
            estimator_label(reconstruct), plan, describes_published=reconstruct in LINEAR
        )
        for array, arr, dims, units, long_name, compressed in outputs:
            # noisy float estimates do not compress; skip the codec's time
            pair = add_array(
                lg, array, arr, dims, units, long_name, compressed=compressed,
                attrs=label if array.endswith("variance") else None,
            )  # fmt: skip
            if pair is not None:
                sources.append(pair[0])
                targets.append(pair[1])
        for source, target in extra(i, lg) if extra is not None else []:
            sources.append(source)
            targets.append(target)
    return sources, targets


def _dims(g: zarr.Group, name: str) -> tuple[str, ...]:
    meta: Any = g[name].metadata  # an array's (zarr v3): it has dimension names
    return tuple(meta.dimension_names or ())
