"""Counts of a coarser geography level as the sum of their children, lazily in Dask.

The data of a unit at level L is the sum of the rows of its descendants at a finer
level. :func:`aggregate` builds that sum as a Dask graph that never holds more than a
few chunks at once:

* ``aggregate-<level>-partial``: one task per input chunk sums its rows by ancestor,
  giving the (sorted) ancestor indices it touches and their partial sums;
* ``aggregate-<level>-combine``: partial sums aimed at the same output chunk are
  added ``split_every`` at a time (a tree, only when an output chunk draws on more
  than ``split_every`` input chunks);
* ``aggregate-<level>``: one task per output chunk adds the last partials into a
  dense block.

When units are in the canonical order of :class:`~dpdask.Geography` (children of a
unit contiguous) each input chunk touches few ancestors, so every task is small.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeAlias

import dask.array as da
import numpy as np
import numpy.typing as npt
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from dpdask.domain import Geography
from dpdask.errors import ArgumentError, ShapeError

__all__ = ["aggregate", "aggregate_rows", "level_key"]

# (sorted unique ancestor indices, their sums)
_Partial: TypeAlias = tuple[npt.NDArray[np.int64], npt.NDArray[Any]]


def level_key(level: str) -> str:
    """A level name as a task-key word: letters only, other runs become one dash."""
    word = re.sub(r"[^A-Za-z]+", "-", level).strip("-").lower()
    return word or "level"


def _acc_dtype(dtype: npt.DTypeLike) -> np.dtype[np.int64 | np.float64]:
    """What sums are kept in: int64 for counts, float64 for estimates."""
    return np.dtype(np.int64) if np.dtype(dtype).kind in "biu" else np.dtype(np.float64)


def graph_array(
    name: str,
    dsk: Mapping[Any, Any],
    dependency: da.Array,
    chunks: tuple[tuple[int, ...], ...],
    dtype: npt.DTypeLike,
    meta: Any = None,
) -> da.Array:
    """The Dask array of tasks ``dsk`` (keys ``(name, ...)``) over ``dependency``'s."""
    deps: list[Any] = [dependency]  # dask.array.Array is a collection; its stubs disagree
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
    out: da.Array = da.Array(graph, name, chunks=chunks, dtype=dtype, meta=meta)  # type: ignore[no-untyped-call]
    return out


def _partial(block: npt.NDArray[Any], ancestors: npt.NDArray[np.int64]) -> _Partial:
    """Sum the rows of ``block`` by their ancestor index."""
    acc = _acc_dtype(block.dtype)
    if ancestors.size > 1 and (np.diff(ancestors) < 0).any():
        order = np.argsort(ancestors, kind="stable")
        ancestors, block = ancestors[order], block[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ancestors)) + 1])
    if starts.size <= 32:  # few runs: a sum per run is about twice as fast as reduceat
        stops = [*starts[1:].tolist(), block.shape[0]]
        sums = np.stack(
            [block[a:b].sum(axis=0, dtype=acc) for a, b in zip(starts, stops, strict=True)]
        )
    else:
        sums = np.add.reduceat(block.astype(acc, copy=False), starts, axis=0)
    return ancestors[starts], sums


def _restrict(part: _Partial, lo: int, hi: int) -> _Partial:
    idx, sums = part
    a, b = np.searchsorted(idx, [lo, hi])
    return idx[a:b], sums[a:b]


def _add_into(
    out: npt.NDArray[Any], positions: npt.NDArray[np.int64], sums: npt.NDArray[Any]
) -> None:
    """``out[positions] += sums`` for sorted unique positions, in place (slices when contiguous)."""
    if positions.size and positions[-1] - positions[0] + 1 == positions.size:
        out[positions[0] : positions[-1] + 1] += sums
    elif positions.size:
        out[positions] += sums


def _combine(parts: list[_Partial], lo: int, hi: int) -> _Partial:
    """Add partial sums, keeping only ancestors in ``[lo, hi)``."""
    parts = [_restrict(p, lo, hi) for p in parts]
    union = np.unique(np.concatenate([p[0] for p in parts]))
    out = np.zeros((union.size, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
    for idx, sums in parts:
        _add_into(out, np.searchsorted(union, idx), sums)
    return union, out


def _finish(
    parts: list[_Partial], lo: int, hi: int, tail: tuple[int, ...], dtype: np.dtype[Any]
) -> npt.NDArray[Any]:
    """Dense sums of ancestors ``lo .. hi-1`` from partial sums (zero for a childless one)."""
    parts = [_restrict(p, lo, hi) for p in parts]
    if len(parts) == 1 and parts[0][0].size == hi - lo:
        return parts[0][1]  # sorted, unique and complete: already the dense block
    out = np.zeros((hi - lo, *tail), dtype=dtype)
    for idx, sums in parts:
        _add_into(out, idx - lo, sums)
    return out


def aggregate(
    counts: da.Array | npt.NDArray[Any],
    geography: Geography,
    level: str,
    *,
    of: str | None = None,
    chunks: int | None = None,
    split_every: int = 8,
) -> da.Array:
    """Counts of every unit at ``level``: the sums of their descendants' rows, lazily.

    Parameters
    ----------
    counts : dask.array.Array or ndarray
        Counts of the units at level ``of``, shape ``(n_units(of), *domain.shape)``,
        chunked along the first axis (other axes are merged into one chunk).
    geography : Geography
        The hierarchy.
    level : str
        The level to aggregate to (``of`` itself or coarser).
    of : str, optional
        The level of ``counts`` (default: the finest).
    chunks : int, optional
        Units of ``level`` per output chunk (default: the first-axis length of the
        first input chunk).
    split_every : int
        How many partial sums one task adds at most (>= 2).

    Returns
    -------
    dask.array.Array
        Shape ``(n_units(level), *domain.shape)``, int64 (float64 for float input),
        one chunk per ``chunks``
        units, keys ``aggregate-<level>-<token>``. ``counts`` itself if ``level`` is
        ``of``.

    Raises
    ------
    dpdask.errors.ShapeError
        If the first axis of ``counts`` does not match the units of ``of``.
    dpdask.errors.ArgumentError
        If ``split_every < 2`` or ``level`` is finer than ``of`` (from
        :meth:`~dpdask.Geography.ancestor_index`; a :class:`~dpdask.errors.DomainError`
        if it is not a level of ``geography``).

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask import Geography
    >>> g = Geography.from_geoids(["11", "12", "21"], {"state": 1, "county": 2})
    >>> x = np.arange(6).reshape(3, 2)
    >>> aggregate(x, g, "state").compute().tolist()
    [[2, 4], [4, 5]]
    """
    if split_every < 2:
        raise ArgumentError(f"split_every must be at least 2, got {split_every}")
    source = geography.levels[geography.level_index(of)]
    ancestors = geography.ancestor_index(level, of=source)
    if isinstance(counts, da.Array):
        lazy = counts
    else:
        first = (chunks or max(1, counts.shape[0]), *counts.shape[1:])
        lazy = da.asarray(counts, chunks=first)  # type: ignore[no-untyped-call]
    if lazy.ndim < 1 or lazy.shape[0] != ancestors.size:
        raise ShapeError(
            f"counts have {lazy.shape[0] if lazy.ndim else 0} rows but level {source!r} "
            f"has {ancestors.size} units"
        )
    if level == source:
        return lazy
    n_out = geography.n_units(level)
    step = int(chunks or lazy.chunks[0][0])
    out_bounds = np.unique(np.arange(0, n_out + step, step).clip(max=n_out))
    return aggregate_rows(
        lazy,
        ancestors,
        tuple(np.diff(out_bounds).tolist()),
        f"aggregate-{level_key(level)}",
        split_every=split_every,
    )


def aggregate_rows(
    values: da.Array,
    ancestors: npt.NDArray[np.integer[Any]],
    out_chunks: tuple[int, ...],
    name: str,
    *,
    split_every: int = 8,
) -> da.Array:
    """Row sums by group, lazily: output row ``j`` is the sum of the rows ``i`` of
    ``values`` with ``ancestors[i] == j``.

    The engine of :func:`aggregate`, also used by the release for the levels of a
    geography (counts, estimates, partial sums of estimates).

    Parameters
    ----------
    values : dask.array.Array
        Shape ``(len(ancestors), ...)``, chunked along the first axis.
    ancestors : ndarray of int
        The output row of each input row (sorted is cheapest: each input chunk then
        touches few outputs).
    out_chunks : tuple of int
        Chunk sizes of the output's first axis; they add up to the number of outputs.
    name : str
        Key prefix: tasks are ``<name>-partial``, ``<name>-combine`` and ``<name>``.
    split_every : int
        How many partial sums one task adds at most (>= 2).

    Returns
    -------
    dask.array.Array
        Shape ``(sum(out_chunks), *values.shape[1:])``; int64 for integer input,
        float64 otherwise. Rows no input row maps to are zero.
    """
    if split_every < 2:
        raise ArgumentError(f"split_every must be at least 2, got {split_every}")
    counts = values
    if any(len(c) > 1 for c in counts.chunks[1:]):
        wide: Any = counts  # dask's rechunk is untyped
        counts = wide.rechunk({i: -1 for i in range(1, counts.ndim)})
    ancestors = np.asarray(ancestors)
    out_bounds = np.concatenate([[0], np.cumsum(out_chunks, dtype=np.int64)])
    in_bounds = np.concatenate([[0], np.cumsum(counts.chunks[0])])
    dtype = _acc_dtype(counts.dtype)
    token = tokenize(counts.name, ancestors, out_bounds, split_every)
    pname, cname, oname = f"{name}-partial-{token}", f"{name}-combine-{token}", f"{name}-{token}"
    tail = (0,) * (counts.ndim - 1)
    shape_tail = tuple(counts.shape[1:])
    dsk: dict[Any, Any] = {}
    feeds: list[list[tuple[Any, ...]]] = [[] for _ in range(out_bounds.size - 1)]
    for i in range(in_bounds.size - 1):
        anc = ancestors[in_bounds[i] : in_bounds[i + 1]]
        dsk[(pname, i)] = (_partial, (counts.name, i, *tail), anc)
        for j in np.unique(np.searchsorted(out_bounds, anc, side="right") - 1):
            feeds[j].append((pname, i))
    for j, keys in enumerate(feeds):
        lo, hi = int(out_bounds[j]), int(out_bounds[j + 1])
        depth = 0
        while len(keys) > split_every:
            grouped = [keys[k : k + split_every] for k in range(0, len(keys), split_every)]
            keys = []
            for g, group in enumerate(grouped):
                key = (cname, j, depth, g)
                dsk[key] = (_combine, group, lo, hi)
                keys.append(key)
            depth += 1
        dsk[(oname, j, *tail)] = (_finish, keys, lo, hi, shape_tail, dtype)
    chunks = (tuple(int(c) for c in out_chunks), *((int(s),) for s in counts.shape[1:]))
    return graph_array(oname, dsk, counts, chunks, dtype)
