"""Top-down estimation of a release, lazily: each parent's estimate split among its children.

``reconstruct="topdown"`` (issue 24): every level is measured and reconstructed by
least squares (``z``, checkpointed as for the other estimators); then

* the top level is fitted non-negative in the metric of its strategy
  (:func:`~dpdask.dataflow._blocks.nonnegative_block`, tasks ``topdown-<level>``);
* level by level, the children of each parent are fitted jointly
  (:func:`dpdask.reconstruct.topdown.children_fitter`): non-negative, summing cell by
  cell to the parent's final estimate, zero where the parent is zero (tasks
  ``topdown-<level>``, one per group of whole families).

The children's objective is their least-squares fit to their measurements ``y``; it is
computed from ``z`` (the weighted least-squares estimate): ``||A x - y||_W^2 = ||A (x -
z)||_W^2 + ||A z - y||_W^2`` for every ``x``, so the minimiser is the same, and the
measurements never need to be kept
(``from_estimates`` of :func:`~dpdask.reconstruct.topdown.children_fitter`, which also
starts each fit from ``z`` projected onto the parent's cells).

With ``integer=True`` the top level is rounded to the nearest non-negative integers
and every family with the largest-remainder controlled rounding
(:func:`dpdask.reconstruct.topdown.round_children`): integer children that add up
exactly, cell by cell, to their integer parent, each within 1 of the fractional fit.

Families are never split across tasks: the level's chunks are merged where a parent's
children span two of them (:func:`family_chunks`).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from dpdask.dataflow._aggregate import level_key
from dpdask.dataflow._blas import task_blas
from dpdask.dataflow._blocks import nonnegative_block, tune_allocator
from dpdask.dataflow._levels import LevelChunks
from dpdask.linalg import LinearQuery
from dpdask.reconstruct.topdown import children_fitter, round_children, round_top

__all__ = ["family_chunks", "topdown_levels"]

_FITTERS: dict[str, Any] = {}  # per worker process: what a level's fits share


def family_chunks(chunks: Sequence[int], parents: np.ndarray) -> tuple[int, ...]:
    """Chunks of a level, merged so that no parent's children span two chunks."""
    bounds = np.cumsum((0, *chunks))
    # a boundary may stay where the parent changes across it
    keep = [0]
    for b in bounds[1:-1]:
        if parents[b] != parents[b - 1]:
            keep.append(int(b))
    keep.append(int(bounds[-1]))
    return tuple(int(d) for d in np.diff(keep))


def _fitter(A: LinearQuery, weight: float, token: str) -> Any:
    fit = _FITTERS.get(token)
    if fit is None:
        fit = _FITTERS[token] = children_fitter(A, weight)
    return fit


def _families_block(
    z: np.ndarray,
    parent_est: np.ndarray,
    parents: np.ndarray,
    A: LinearQuery,
    weight: float,
    token: str,
    integer: bool,
    report_dir: str | None,
    level: str,
    block_info: dict | None = None,
) -> np.ndarray:
    """The children of every family in this chunk, fitted inside their parents."""
    tune_allocator()
    loc = block_info[0]["array-location"][0] if block_info else (0, z.shape[0])
    local = parents[loc[0] : loc[1]]
    local = local - local[0]
    shape = z.shape
    Z = np.asarray(z, dtype=np.float64).reshape(shape[0], -1)
    P = np.asarray(parent_est, dtype=np.float64).reshape(parent_est.shape[0], -1)
    out = np.empty_like(Z)
    fit = _fitter(A, weight, token)
    failed = []
    with task_blas():
        starts = np.flatnonzero(np.r_[True, local[1:] != local[:-1]])
        for a, b in zip(starts, [*starts[1:], len(local)], strict=True):
            p = P[local[a]]
            est = fit.from_estimates(Z[a:b], p)
            X = np.asarray(est.x).reshape(b - a, -1)
            out[a:b] = round_children(X, np.rint(p).astype(np.int64)) if integer else X
            if not est.report.converged:
                failed.append({"parent": int(local[a]), **est.report.to_dict()})
    if failed and report_dir is not None:
        chunk = block_info[0]["chunk-location"][0] if block_info else 0
        info = {"level": level, "chunk": chunk, **failed[0], "families": len(failed)}
        path = pathlib.Path(report_dir) / f"{level}-{chunk}.json"
        path.write_text(json.dumps(info, default=str))
    return out.reshape(shape)


def _parents_of_chunks(parent: da.Array, chunks: Sequence[int], p: np.ndarray) -> da.Array:
    """Block ``k``: the parent rows of the children in chunk ``k`` (contiguous)."""
    bounds = np.cumsum((0, *chunks))
    first, last = p[bounds[:-1]], p[bounds[1:] - 1]
    pieces = [parent[int(f) : int(l) + 1] for f, l in zip(first, last, strict=True)]
    return da.concatenate(pieces, axis=0).rechunk({0: tuple(int(n) for n in last - first + 1)})


def topdown_levels(
    estimates: Sequence[da.Array],
    lc: LevelChunks,
    plans: Sequence[Any],
    reports: str,
    integer: bool = False,
) -> list[da.Array]:
    """Top-down non-negative (optionally integer) estimates of every level, lazily.

    Parameters
    ----------
    estimates : sequence of dask.array.Array
        Each level's least-squares estimates ``z`` (unit by unit), coarsest first.
    lc : LevelChunks
        The release's level chunks and parents.
    plans : sequence
        Each level's plan: its measured ``strategy`` and ``row_variance``.
    reports : str
        Folder for the reports of fits that stop before converging.
    integer : bool
        Round to integers that add up exactly (module notes).
    """
    top = estimates[0]
    plan = plans[0]
    word = level_key(lc.levels[0])
    fitted = top.map_blocks(
        nonnegative_block, plan.strategy, 1.0 / plan.row_variance, reports, lc.levels[0],
        dtype=np.float64, name=f"topdown-{word}-{tokenize(top, plan.strategy, integer)}",
        meta=np.empty((0,) * top.ndim),
    )  # fmt: skip
    out = [fitted.map_blocks(round_top, dtype=np.float64) if integer else fitted]
    for lvl in range(1, len(estimates)):
        z, plan, p = estimates[lvl], plans[lvl], lc.parents[lvl - 1]
        chunks = family_chunks(z.chunks[0], p)
        zf = z.rechunk({0: chunks})
        parent = _parents_of_chunks(out[lvl - 1], chunks, p)
        A = plan.strategy
        token = tokenize(A, plan.row_variance)
        word = level_key(lc.levels[lvl])
        est = da.map_blocks(
            _families_block, zf, parent, p, A, 1.0 / plan.row_variance, token, integer,
            reports, lc.levels[lvl],
            dtype=np.float64, chunks=zf.chunks,
            name=f"topdown-{word}-{tokenize(zf, parent, token, integer)}",
            meta=np.empty((0,) * z.ndim),
        )  # fmt: skip
        out.append(est.rechunk({0: z.chunks[0]}))
    return [o.astype(np.float64) for o in out]
