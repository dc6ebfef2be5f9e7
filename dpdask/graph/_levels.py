"""Geography levels as Dask arrays: aligned chunking, aggregation, tree consistency.

Every level of a release is a Dask array whose first axis runs over that level's
units. Units are sorted so that the children of each parent are contiguous (the
store's GEOID order guarantees it; :func:`level_chunks` checks it). The chunks of
the levels are *aligned*: a chunk boundary of a child level only falls between
the children of different parents, and every boundary of the parent level
induces one in the child level. So each child chunk's parents lie in one
contiguous range, which is what lets aggregation (children to parent) and the
top-down pass of the consistency step run chunk by chunk, with no task ever
holding a whole level.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from dpdask.domain import Geography
from dpdask.errors import ArgumentError, DataError, DomainError
from dpdask.graph._blocks import nonnegative_block
from dpdask.linalg import LinearQuery
from dpdask.reconstruct.consistency import (
    children_sum,
    down_variances,
    project_children,
    up_weights,
)
from dpdask.store import aggregate_rows, level_key

_FIT_CELLS = 2**19  # cells per nonnegative-<level> task

__all__ = [
    "LevelChunks",
    "aggregate_level",
    "bottom_up",
    "level_chunks",
    "nonneg_down",
    "nonneg_fit_up",
    "partial_rows",
    "partial_sum_block",
    "top_down",
]


@dataclass(frozen=True)
class LevelChunks:
    """Aligned chunk sizes for each released level (coarsest first)."""

    levels: tuple[str, ...]
    chunks: tuple[tuple[int, ...], ...]
    # for each level but the first: the index of each unit's parent in the previous *released* level
    parents: tuple[np.ndarray, ...]

    def of(self, level: str) -> tuple[int, ...]:
        return self.chunks[self.levels.index(level)]

    def parent_ranges(self, i: int) -> tuple[int, ...]:
        """For released level ``i > 0``: how many parents each of its chunks covers."""
        bounds = np.cumsum((0, *self.chunks[i]))
        p = self.parents[i - 1]
        firsts = p[bounds[:-1]]
        lasts = p[bounds[1:] - 1]
        return tuple(int(n) for n in lasts - firsts + 1)


def _released_parents(geo: Geography, levels: Sequence[str]) -> list[np.ndarray]:
    """Parent index of each unit of ``levels[i]`` in ``levels[i - 1]`` (skipping levels between)."""
    out = []
    for upper, lower in itertools.pairwise(levels):
        iu, il = geo.level_index(upper), geo.level_index(lower)
        if iu >= il:
            raise DomainError(
                f"levels must go from coarse to fine: {upper!r} is not above {lower!r}"
            )
        idx = np.arange(geo.n_units(lower), dtype=np.int64)
        for j in range(il, iu, -1):
            idx = geo.parents[j - 1][idx]
        if idx.size > 1 and (np.diff(idx) < 0).any():
            raise DataError(
                f"units of level {lower!r} are not sorted by their {upper!r} parent; "
                "the data store must list children of each parent contiguously"
            )
        out.append(idx)
    return out


def level_chunks(
    geo: Geography,
    levels: Sequence[str],
    cells: int,
    target_bytes: int = 128 * 2**20,
    *,
    row_bytes: Sequence[int] | None = None,
    whole_families: bool = False,
) -> LevelChunks:
    """Choose aligned chunks for each released level.

    Parameters
    ----------
    geo : Geography
        The hierarchy; the finest released level must be the store's finest level.
    levels : sequence of str
        The released levels, coarsest first.
    cells : int
        Cells per unit (the domain size), to size chunks.
    target_bytes : int
        Rough memory of one chunk of float64 estimates.
    row_bytes : sequence of int, optional
        Bytes of one unit of each level (default ``8 * cells`` for every level): a
        chunk of level ``i`` holds about ``target_bytes / row_bytes[i]`` units.
    whole_families : bool
        Never split the children of one parent over two chunks (a parent with more
        children than fit in one chunk gets a chunk of its own): what the top-down
        estimator needs, which fits the children of a parent together.

    Notes
    -----
    Child chunks end preferably where the parent changes; a parent with more
    children than fit in one chunk has its children split over several chunks, and
    its sum is then assembled from their partial sums (unless ``whole_families``).
    """
    levels = tuple(levels)
    if not levels:
        raise DomainError("a release needs at least one geography level")
    if levels[-1] != geo.levels[-1]:
        raise DomainError(
            f"the finest released level must be the data's level {geo.levels[-1]!r}, "
            f"got {levels[-1]!r}"
        )
    sizes = [8 * cells] * len(levels) if row_bytes is None else [int(b) for b in row_bytes]
    if len(sizes) != len(levels) or min(sizes) < 1:
        raise ArgumentError(f"row_bytes needs a positive size per level, got {row_bytes}")
    parents = _released_parents(geo, levels)
    per_chunk = max(1, target_bytes // sizes[0])
    chunks: list[tuple[int, ...]] = [_split(np.array([0, geo.n_units(levels[0])]), per_chunk)]
    for i in range(1, len(levels)):
        per_chunk = max(1, target_bytes // sizes[i])
        p = parents[i - 1]
        group_starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        allowed = np.r_[group_starts, p.size]
        parent_bounds = np.cumsum((0, *chunks[-1]))
        forced = np.searchsorted(p, parent_bounds, side="left")
        pieces: list[int] = []
        for a, b in itertools.pairwise(forced):
            pieces.extend(
                _split(allowed[(allowed >= a) & (allowed <= b)], per_chunk, whole_families)
            )
        chunks.append(tuple(pieces))
    return LevelChunks(levels, tuple(chunks), tuple(parents))


def _split(allowed: np.ndarray, per_chunk: int, whole: bool = False) -> tuple[int, ...]:
    """Chunks from ``allowed[0]`` to ``allowed[-1]`` of about ``per_chunk`` units.

    Chunks end at ``allowed`` boundaries where possible; a gap between two allowed
    boundaries longer than ``per_chunk`` is cut into equal pieces (unless ``whole``:
    then it is one chunk).
    """
    sizes: list[int] = []
    start = last = int(allowed[0])
    for b in (int(v) for v in allowed[1:]):
        if b - start > per_chunk and last > start:
            sizes.append(last - start)
            start = last
        if b - start > per_chunk and not whole:  # one group too big for a chunk: cut it
            k = -(-(b - start) // per_chunk)
            sizes.extend(len(c) for c in np.array_split(np.arange(start, b), k))
            start = b
        last = b
    if last > start:
        sizes.append(last - start)
    return tuple(sizes)


def _local_parents(p: np.ndarray, block_info: dict[Any, Any] | None) -> np.ndarray:
    loc = block_info[0]["array-location"][0] if block_info else (0, p.size)
    sub = p[loc[0] : loc[1]]
    local: np.ndarray = sub - sub[0]
    return local


def _chunk_parents(lc: LevelChunks, i: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last parent (in level ``i - 1``) of each chunk of level ``i``."""
    bounds = np.cumsum((0, *lc.chunks[i]))
    p = lc.parents[i - 1]
    return p[bounds[:-1]], p[bounds[1:] - 1]


def partial_sum_block(block: np.ndarray, lc: LevelChunks, i: int, k: int) -> np.ndarray:
    """Sums of chunk ``k`` of level ``i`` by parent: rows ``first_k .. last_k`` of level
    ``i - 1`` (see :func:`partial_rows`)."""
    start = int(np.cumsum((0, *lc.chunks[i]))[k])
    p = lc.parents[i - 1][start : start + block.shape[0]]
    local = p - p[0]
    out = children_sum(block.reshape(block.shape[0], -1), local, int(local[-1]) + 1)
    return out.reshape((-1, *block.shape[1:]))


def partial_rows(lc: LevelChunks, i: int) -> np.ndarray:
    """The parent (in level ``i - 1``) of each row of the chunk-by-chunk partial sums of
    level ``i`` (:func:`partial_sum_block` of every chunk, stacked): sorted, with a parent
    repeated where its children span several chunks."""
    first, last = _chunk_parents(lc, i)
    return np.concatenate([np.arange(f, l + 1) for f, l in zip(first, last, strict=True)])


def aggregate_level(child: da.Array, lc: LevelChunks, i: int, name: str) -> da.Array:
    """Level ``i - 1`` from level ``i`` (children summed), chunked as ``lc.chunks[i - 1]``;
    keys ``<name>-partial``, ``<name>``. Counts stay int64, estimates float64."""
    return aggregate_rows(child, lc.parents[i - 1], lc.chunks[i - 1], name)


def _parent_aligned(parent_arr: da.Array, lc: LevelChunks, i: int) -> da.Array:
    """Parent rows ``first_k..last_k`` as block ``k``: the parents of child chunk ``k``."""
    first, last = _chunk_parents(lc, i)
    rows: da.Array = da.concatenate(  # type: ignore[no-untyped-call]
        [parent_arr[int(f) : int(l) + 1] for f, l in zip(first, last, strict=True)], axis=0
    ).rechunk({0: lc.parent_ranges(i)})
    return rows


def bottom_up(
    estimates: Sequence[da.Array],
    variances: Sequence[np.ndarray],
    lc: LevelChunks,
    name: str,
    bottom_sums: da.Array | None = None,
) -> tuple[list[da.Array], list[np.ndarray], list[da.Array], list[np.ndarray]]:
    """The bottom-up pass of :func:`dpdask.reconstruct.tree_consistent`, lazily.

    ``variances`` are small per-unit arrays (``inf`` for an unmeasured unit, whose
    estimate is then ignored). ``bottom_sums``, when given, is the sum of the finest
    level's estimates per parent, already computed (so that the finest level, the
    largest, is not read for it). Returns ``(z, var_z, child_sum_z, child_sum_var)``.
    """
    L = len(estimates)
    z: list[da.Array] = [None] * L  # type: ignore[list-item]
    vz: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    cz: list[da.Array] = [None] * L  # type: ignore[list-item]
    cv: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    z[-1], vz[-1] = estimates[-1], np.asarray(variances[-1], dtype=float)
    for lvl in range(L - 2, -1, -1):
        if bottom_sums is not None and lvl == L - 2:
            s = bottom_sums
        else:
            s = aggregate_level(z[lvl + 1], lc, lvl + 1, f"{name}-{level_key(lc.levels[lvl])}")
        w = children_sum(vz[lvl + 1][:, None], lc.parents[lvl], s.shape[0])[:, 0]
        a_u, b_u, vz[lvl] = up_weights(variances[lvl], w)
        est = estimates[lvl]
        nd = est.ndim
        ch = (est.chunks[0],) + ((1,),) * (nd - 1)
        a = da.from_array(_col(a_u, nd), chunks=ch)  # type: ignore[no-untyped-call]
        b = da.from_array(_col(b_u, nd), chunks=ch)  # type: ignore[no-untyped-call]
        z[lvl] = da.where(a == 0, 0.0, a * est) + b * s
        cz[lvl], cv[lvl] = s, w
    return z, vz, cz, cv


def _col(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((-1,) + (1,) * (ndim - 1))


def _down_block(
    zc: np.ndarray,
    share: np.ndarray,
    resid: np.ndarray,
    p: np.ndarray,
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    """``zc + share * resid[parent]`` row by row (no temporaries of the block's size)."""
    local = _local_parents(p, block_info)
    out = np.array(zc, dtype=np.result_type(zc, resid), copy=True)
    flat, res = out.reshape(len(local), -1), resid.reshape(resid.shape[0], -1)
    row = np.empty(flat.shape[1], dtype=out.dtype)
    for i, (j, c) in enumerate(zip(local, np.ravel(share), strict=True)):
        np.multiply(res[j], c, out=row)
        flat[i] += row
    return out


def top_down(
    z: Sequence[da.Array],
    vz: Sequence[np.ndarray],
    cz: Sequence[da.Array],
    cv: Sequence[np.ndarray],
    lc: LevelChunks,
    name: str,
) -> tuple[list[da.Array], list[np.ndarray]]:
    """The top-down pass: consistent estimates (lazy) and per-unit variances."""
    final = [z[0]]
    fvar = [np.asarray(vz[0])]
    for lvl in range(1, len(z)):
        p = lc.parents[lvl - 1]
        share, fv = down_variances(vz[lvl], cv[lvl - 1][p], fvar[lvl - 1][p])
        resid = _parent_aligned(final[lvl - 1] - cz[lvl - 1], lc, lvl)
        nd = z[lvl].ndim
        share_d = da.from_array(_col(share, nd), chunks=(z[lvl].chunks[0],) + ((1,),) * (nd - 1))  # type: ignore[no-untyped-call]
        final.append(
            da.map_blocks(  # type: ignore[no-untyped-call]
                _down_block,
                z[lvl],
                share_d,
                resid,
                p,
                dtype=z[lvl].dtype,
                chunks=z[lvl].chunks,
                name=f"{name}-{level_key(lc.levels[lvl])}-{tokenize(z[lvl], resid, share)}",
                meta=np.empty((0,) * nd, dtype=z[lvl].dtype),
            )
        )
        fvar.append(fv)
    return final, fvar


def n_chunks(lc: LevelChunks) -> dict[str, int]:
    """How many chunks each level has (for progress reports)."""
    return {lv: len(c) for lv, c in zip(lc.levels, lc.chunks, strict=True)}


def _project_block(
    children: np.ndarray,
    totals: np.ndarray,
    p: np.ndarray,
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    return project_children(children, _local_parents(p, block_info), totals)


def nonneg_down(final: Sequence[da.Array], lc: LevelChunks, name: str) -> list[da.Array]:
    """Non-negative estimates that stay consistent, top-down and lazily.

    The top level is clipped at zero; then, level by level, each unit's children
    are projected (cell by cell) onto the non-negative vectors that add up to the
    unit's already non-negative value (:func:`dpdask.reconstruct.project_children`).
    """
    out = [da.maximum(final[0], 0.0)]
    for lvl in range(1, len(final)):
        parents = _parent_aligned(out[lvl - 1], lc, lvl)
        child = final[lvl]
        out.append(
            da.map_blocks(  # type: ignore[no-untyped-call]
                _project_block,
                child,
                parents,
                lc.parents[lvl - 1],
                dtype=child.dtype,
                chunks=child.chunks,
                name=f"{name}-{level_key(lc.levels[lvl])}-{tokenize(child, parents)}",
                meta=np.empty((0,) * child.ndim, dtype=child.dtype),
            )
        )
    return out


def nonneg_fit_up(
    final: Sequence[da.Array],
    lc: LevelChunks,
    M: LinearQuery,
    weights: float | None,
    reports: str | None,
) -> list[da.Array]:
    """Non-negative estimates that stay consistent, fitted at the finest level and summed up.

    The finest level's consistent estimates are fitted with non-negative ones in the
    metric of ``M`` with row ``weights`` (:func:`~dpdask.graph._blocks.nonnegative_block`,
    tasks ``nonnegative-<level>`` of about ``2^19`` cells: one unit of the CPH domain,
    whose solve takes a fraction of a second to a second, so that chunks of several
    such units do not leave workers idle at the end; thousands of small units); every
    coarser level is the sum of its children, so children add up to parents and every
    estimate is non-negative by construction. Non-convergence is reported in ``reports``.
    """
    last = len(final) - 1
    word = level_key(lc.levels[last])
    est = final[last]
    per_task = max(1, _FIT_CELLS // math.prod(est.shape[1:]))
    fitted = est.rechunk({0: per_task}).map_blocks(  # type: ignore[no-untyped-call]
        nonnegative_block, M, weights, reports, lc.levels[last],
        dtype=np.float64, name=f"nonnegative-{word}-{tokenize(est, M, weights)}",
        meta=np.empty((0,) * est.ndim),
    )  # fmt: skip
    out = list(final)
    out[last] = fitted.rechunk({0: est.chunks[0]})
    for lvl in range(last, 0, -1):
        out[lvl - 1] = aggregate_level(
            out[lvl], lc, lvl, f"nonnegative-{level_key(lc.levels[lvl - 1])}"
        )
    return out
