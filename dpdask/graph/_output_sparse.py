"""The published top-down release: estimates as entries, answers per geography, variances once.

A top-down release (:mod:`dpdask.graph._topdown`) checkpoints every level as sparse
chunks. Each level's group (:func:`~dpdask.graph._output.level_group`: ids, parents,
query labels, attribute coordinates) then holds::

    answers            float64 (geography, workload_query)  workload answers (persons)
    variance           float64 (workload_query,)        their variances, the same for
                                                        every unit of the level
    table_answers      float64 (geography, table_query) P.L. 94-171 tables (PL94 only)
    table_variance     float64 (table_query,)

and the estimates, dense where that is small (at most :data:`DENSE_ESTIMATE_CELLS`
cells: the top levels), as entries otherwise::

    estimate           float64 (geography, *attrs)      dense levels
    estimate           float64 (entry,)                 sparse levels: the non-zero cells,
    entry_geography    int64 (entry,)                   sorted by geography index,
    entry_cell         int64 (entry,)                   then flat cell (C order of attrs)
    entry_offsets      int64 (geography_bound,)         entries of unit u: offsets[u]:offsets[u+1]

so that memory and disk grow with the estimates' entries, not with cells times
geographies. :func:`dpdask.open_release` shows a sparse level's ``estimate`` as a lazy
``(geography, *attrs)`` array of :class:`sparse.COO` chunks.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask.array as da
import numpy as np
import sparse
import zarr
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from dpdask.domain import Domain
from dpdask.graph._blocks import tune_allocator
from dpdask.graph._checkpoint import read_sparse
from dpdask.graph._output import LevelGroup, add_array, level_group
from dpdask.graph._uncertainty import uncertainty_attrs
from dpdask.linalg import apply_rows
from dpdask.publish import QUERY_DIM
from dpdask.store import level_key

__all__ = ["DENSE_ESTIMATE_CELLS", "sparse_level_outputs"]

DENSE_ESTIMATE_CELLS = 2**24
"""Levels of at most this many cells (units times cells per unit) publish a dense estimate."""


def _answers(block: sparse.COO, W: Any) -> np.ndarray:
    tune_allocator()
    return apply_rows(W, block)


def _dense(block: sparse.COO, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(block.todense(), dtype=np.float64).reshape((block.shape[0], *shape))


def _part(block: sparse.COO, what: str, start: int) -> np.ndarray:
    rows, cells = block.coords
    if what == "rows":
        return np.asarray(rows, dtype=np.int64) + start
    if what == "cells":
        return np.asarray(cells, dtype=np.int64)
    return np.asarray(block.data, dtype=np.float64)


def _row_counts(block: sparse.COO) -> np.ndarray:
    return np.bincount(np.asarray(block.coords[0]), minlength=block.shape[0]).astype(np.int64)


def _from_blocks(
    func: Any, src: Any, chunks: tuple[Any, ...], dtype: Any, name: str, *args: Any
) -> da.Array:
    """A Dask array whose block ``k`` is ``func(block k of src, *args)`` (``src``: the
    level's loaded chunks, one block per chunk)."""
    zeros = (0,) * (len(chunks) - 1)
    dsk: dict[Any, Any] = {
        (name, k, *zeros): (func, (src.name, k, 0), *args) for k in range(src.numblocks[0])
    }
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[src])
    return da.Array(graph, name, chunks, dtype)  # type: ignore[no-untyped-call]


def _loaded(folder: pathlib.Path, chunks: tuple[int, ...], n: int, name: str) -> da.Array:
    """The level's checkpointed sparse chunks as a Dask array of :class:`sparse.COO` blocks."""
    dsk: dict[Any, Any] = {(name, k, 0): (read_sparse, str(folder), k) for k in range(len(chunks))}
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    meta = sparse.COO.from_numpy(np.empty((0, 0)))
    return da.Array(graph, name, (tuple(chunks), (n,)), np.float64, meta=meta)  # type: ignore[no-untyped-call]


def _entries(
    src: Any, what: str, starts: np.ndarray, nnz: tuple[int, ...], dtype: Any, word: str
) -> da.Array:
    """One part of the level's entries (``rows``, ``cells`` or ``values``), a block per chunk."""
    name = f"entries-{what}-{word}-{tokenize(src)}"
    dsk: dict[Any, Any] = {
        (name, k): (_part, (src.name, k, 0), what, int(starts[k])) for k in range(len(nnz))
    }
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[src])
    return da.Array(graph, name, (nnz,), dtype)  # type: ignore[no-untyped-call]


def sparse_level_outputs(
    root: zarr.Group,
    levels: Sequence[tuple[str, Any, float]],
    folders: Sequence[pathlib.Path],
    chunks: Sequence[tuple[int, ...]],
    entries: Sequence[Sequence[int]],
    ids: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    domain: Domain,
    label: Mapping[str, Any] | None = None,
    extra: Callable[[int, LevelGroup], list[tuple[Any, Any]]] | None = None,
) -> tuple[list[da.Array], list[zarr.Array[Any]]]:
    """Create every level's group and pair its lazy arrays with their targets.

    Parameters
    ----------
    root : zarr.Group
        The output group (empty).
    levels : sequence of (name, plan, unit variance)
        Coarsest first.
    folders : sequence of path
        Each level's checkpointed sparse chunks.
    chunks, entries : sequence of tuple of int
        Each level's chunk sizes (units) and the entries of each chunk.
    ids, parents : sequence of ndarray
        Each level's unit ids, and each level's parent index below the top.
    domain : Domain
        The data domain.
    label : mapping, optional
        What the variances are of (:func:`~dpdask.graph._uncertainty.estimator_label`),
        added to each level's by :func:`~dpdask.graph._uncertainty.uncertainty_attrs`.
    extra : callable, optional
        ``extra(i, level_group)`` adds further arrays to level ``i``'s group (the
        unbiased answers, the simulated RMSE) and returns their lazy (source, target)
        pairs.

    Returns
    -------
    list of dask.array.Array, list of zarr.Array
        Sources and targets for :func:`dask.array.store`; they share one load of each
        checkpointed chunk (tasks ``estimate-<level>``).
    """
    sources: list[da.Array] = []
    targets: list[zarr.Array[Any]] = []
    labelled: dict[int, tuple[Any, ...]] = {}
    shape, n = tuple(domain.shape), int(domain.size)
    for i, (name, plan, _) in enumerate(levels):
        lg = level_group(root, i, levels, ids, parents, domain, shape, labelled)
        word = level_key(name)
        src = _loaded(
            folders[i], chunks[i], n,
            f"estimate-{word}-{tokenize(str(folders[i]), chunks[i], entries[i])}",
        )  # fmt: skip
        starts = np.cumsum((0, *chunks[i]))[:-1]
        lazy: list[tuple[Any, ...]] = []
        W = lg.workload
        answers = _from_blocks(
            _answers, src, (chunks[i], (W.shape[0],)), np.float64,
            f"answer-{word}-{tokenize(src, W)}", W,
        )  # fmt: skip
        lazy.append(("answers", answers, ("geography", QUERY_DIM), "persons", "workload answer"))
        variance = np.asarray(plan.query_variances(), dtype=np.float64)
        label_attrs = uncertainty_attrs(
            str((label or {}).get("what", "")),
            plan,
            bool((label or {}).get("describes_published", False)),
        )
        add_array(lg, "variance", variance, (QUERY_DIM,), "persons^2",
                  "variance of the workload answer (every unit of the level)",
                  attrs=label_attrs)  # fmt: skip
        if lg.tables is not None and lg.table_variances is not None:
            Q = lg.tables[2]
            t_answers = _from_blocks(
                _answers, src, (chunks[i], (Q.shape[0],)), np.float64,
                f"answer-{word}-{tokenize(src, Q)}", Q,
            )  # fmt: skip
            lazy.append(("table_answers", t_answers, ("geography", "table_query"), "persons",
                         "P.L. 94-171 table cell, from the estimates"))  # fmt: skip
            add_array(lg, "table_variance", np.asarray(lg.table_variances, dtype=np.float64),
                      ("table_query",), "persons^2", "variance of the table cell",
                      attrs=label_attrs)  # fmt: skip
        n_units = int(sum(chunks[i]))
        if n_units * n <= DENSE_ESTIMATE_CELLS:
            est = _from_blocks(
                _dense, src, (chunks[i], *((s,) for s in shape)), np.float64,
                f"estimate-dense-{word}-{tokenize(src)}", shape,
            )  # fmt: skip
            lazy.append(("estimate", est, ("geography", *lg.attrs), "persons",
                         "estimate of each cell's count"))  # fmt: skip
        else:
            nnz = tuple(int(e) for e in entries[i])
            counts = _from_blocks(
                _row_counts, src, (chunks[i],), np.int64, f"entries-{word}-{tokenize(src)}"
            )
            offsets = da.concatenate([da.zeros(1, dtype=np.int64), da.cumsum(counts)])  # type: ignore[no-untyped-call]
            lazy.append(
                (
                    "entry_offsets",
                    offsets,
                    ("geography_bound",),
                    "1",
                    "the entries of unit u are entry_offsets[u]:entry_offsets[u + 1]",
                )
            )
            for what, array, dtype, long_name in (
                ("rows", "entry_geography", np.int64, "index of the entry's geography"),
                ("cells", "entry_cell", np.int64, "flat index of the entry's cell (C order)"),
                ("values", "estimate", np.float64, "estimate of the cell's count (non-zero)"),
            ):
                part = _entries(src, what, starts, nnz, dtype, word)
                lazy.append((array, part, ("entry",),
                             "persons" if what == "values" else "1", long_name))  # fmt: skip
        for array, arr, dims, units, long_name in lazy:
            stored = "int64" if arr.dtype == np.int64 else "float64"
            rows = None
            if dims[0] in ("entry", "geography_bound"):
                rows = max(1, min(int(arr.shape[0]), 2**19))
            pair = add_array(lg, array, arr, dims, units, long_name, dtype=stored, rows=rows)
            if pair is not None:
                sources.append(pair[0])
                targets.append(pair[1])
        for pair in extra(i, lg) if extra is not None else []:
            sources.append(pair[0])
            targets.append(pair[1])
        lg.group.attrs["estimate_layout"] = (
            "dense" if n_units * n <= DENSE_ESTIMATE_CELLS else "entries"
        )
        lg.group.attrs["cells"] = math.prod(shape)
    return sources, targets
