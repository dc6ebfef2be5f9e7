"""The measure-and-reconstruct graph of a release, checkpointed chunk by chunk.

A step of a :class:`dpdask.graph.Release` run (:func:`measure_graph`): the counts of
every level (``aggregate-<level>``), the per-chunk measurement and reconstruction tasks
(``measure-<level>``, ``reconstruct-<level>``, or fused
``measure-reconstruct-<level>``) with their ``streamkey-<level>`` blocks, and the
``checkpoint-<level>`` writes into the run's work folder.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import delayed

from dpdask.errors import ShapeError
from dpdask.graph import _plans
from dpdask.graph._blocks import (
    LS_FIRST,
    ChunkContext,
    estimate_block,
    measure_block,
    reconstruct_block,
)
from dpdask.graph._checkpoint import write_chunk
from dpdask.graph._levels import (
    aggregate_level,
)
from dpdask.graph._progress import compute_items
from dpdask.graph._run import level_charge
from dpdask.graph._state import Level, RunState
from dpdask.graph._unbiased import (
    Unbiased,
    first,
    unbiased_levels,
    write_unbiased_cells,
    write_unbiased_measured,
)
from dpdask.publish import marker
from dpdask.store import level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = ["estimates", "estimates_measured", "level_data", "measure_graph"]


def level_data(rel: Release) -> list[da.Array]:
    """Counts of every released level, lazily, chunked as the level chunks."""
    x = rel.store.to_dask().rechunk({0: rel.lc.chunks[-1]})  # type: ignore[no-untyped-call]
    arrays = [x]
    for i in range(len(rel.levels) - 1, 0, -1):
        name = f"aggregate-{level_key(rel.levels[i - 1])}"
        arrays.insert(0, aggregate_level(arrays[0], rel.lc, i, name))
    return arrays


def measure_graph(rel: Release, run: RunState, client: Any, progress: bool) -> list[pathlib.Path]:
    """Measure and reconstruct every chunk not yet checkpointed in ``work``; return
    each level's folder of chunks (:mod:`dpdask.graph._checkpoint`).

    Each finished chunk leaves a marker file written after its data: a resumed run
    skips exactly those.
    """
    work = run.work
    raw = work / "raw"
    markers = work / "done"
    markers.mkdir(exist_ok=True)
    reports = work / "reports"
    reports.mkdir(exist_ok=True)
    folders, pending = [], []
    data = level_data(rel)
    last = len(rel.released) - 1
    # non-linear estimators publish the unbiased least-squares answers beside theirs
    unbiased = unbiased_levels(rel, work)
    for i, (L, x) in enumerate(zip(rel.released, data, strict=True)):
        folder = raw / L.name
        folder.mkdir(parents=True, exist_ok=True)
        # the finest level's sums by parent, kept so that consistency never re-reads it
        sums = raw / f"{L.name}-sums" if i == last and i > 0 else None
        if sums is not None:
            sums.mkdir(exist_ok=True)
        folders.append(folder)
        todo = [k for k in range(len(L.chunks)) if not marker(markers, L.name, k).exists()]
        if not todo:
            continue
        est, y = estimates_measured(rel, run, L, x, str(reports))
        tok = tokenize(est.name)
        for k in todo:
            write = delayed(write_chunk, pure=False)
            pending.append(
                write(
                    _with_unbiased(est, y, unbiased[i], L, k, tok),
                    folder,
                    k,
                    marker(markers, L.name, k),
                    None if sums is None else (sums, rel.lc, i),
                    dask_key_name=f"checkpoint-{level_key(L.name)}-{tokenize(tok, k)}",
                )
            )
    if pending:
        words = {level_key(L.name): L.name for L in rel.released}
        compute_items(pending, client, progress, "measure-reconstruct", words)
    return folders


def _with_unbiased(
    est: da.Array, y: da.Array | None, u: Unbiased | None, L: Level, k: int, tok: str
) -> Any:
    """Block ``k`` of ``est``, once the unbiased answers of its chunk are checkpointed
    (from the measurements ``y``, or from least-squares ``est`` when they are fused), so
    that the chunk's marker means both are there; ``est.blocks[k]`` without ``u``."""
    if u is None:
        return est.blocks[k]
    word = level_key(L.name)
    if y is None:
        wrote = delayed(write_unbiased_cells, pure=False)(
            est.blocks[k], u, k, dask_key_name=f"unbiased-{word}-{tokenize(tok, k)}"
        )
    else:
        wrote = delayed(write_unbiased_measured, pure=False)(
            L.plan.strategy, y.blocks[k], u, k,
            dask_key_name=f"unbiased-{word}-{tokenize(tok, k)}",
        )  # fmt: skip
    return delayed(first)(est.blocks[k], wrote, dask_key_name=f"ordered-{word}-{tokenize(tok, k)}")


def estimates(rel: Release, run: RunState, L: Level, x: da.Array, reports: str) -> da.Array:
    """The level's estimates, lazily (:func:`estimates_measured` without the measurements)."""
    return estimates_measured(rel, run, L, x, reports)[0]


def estimates_measured(
    rel: Release, run: RunState, L: Level, x: da.Array, reports: str
) -> tuple[da.Array, da.Array | None]:
    """The level's estimates, lazily: fused ``measure-reconstruct-<level>`` tasks when
    the strategy allows (:func:`~dpdask.graph._plans.fused`), else ``measure-<level>`` then
    ``reconstruct-<level>``; and the measurements (None when fused).

    Keys stay on the client: the run's key (the release's secret) never enters the graph.
    Block ``k`` of ``x`` is paired with block ``k`` of the ``streamkey-<level>``
    array (``map_blocks`` pairs blocks by index and never rechunks its inputs), a
    one-element object array holding chunk ``k``'s
    :class:`~dpdask.noise.StreamKey`, which can draw only that chunk's noise (the
    task refuses a key made for another chunk)."""
    from dask.highlevelgraph import HighLevelGraph

    from dpdask.measure import stream_key

    word = level_key(L.name)
    key = run.key
    tok = tokenize(rel.release_id, rel.run_id, L.name, x, rel.reconstruct)
    cell_shape = rel.domain.shape
    keys: da.Array | None = None
    if key is not None:
        n = x.numblocks[0]
        if n != len(L.chunks) or any(nb != 1 for nb in x.numblocks[1:]):
            raise ShapeError(
                f"level {L.name!r}: the data has blocks {x.numblocks}, "
                f"expected ({len(L.chunks)}, 1, ...)"
            )
        kname = f"streamkey-{word}-{tok}"
        one = (1,) * (x.ndim - 1)
        blocks: dict[Any, Any] = {}
        for k in range(n):
            block = np.empty((1, *one), dtype=object)
            ident_k = (rel.release_id, L.name, k, "strategy")
            block.flat[0] = stream_key(key, ident_k, rel.run_id)
            blocks[(kname, k, *(0,) * len(one))] = block
        keys = da.Array(  # type: ignore[no-untyped-call]
            HighLevelGraph.from_collections(kname, blocks),
            kname,
            chunks=((1,) * n, *((1,) for _ in one)),
            dtype=object,
        )
    ctx = ChunkContext(
        rel.release_id, L.name, rel.run_id, level_charge(run, L), rel.noise, rel.test_mode,
        rel.max_total,
    )  # fmt: skip
    # NNLS and WNNLS start from least squares and are fitted after consistency
    method = "ls" if rel.reconstruct in LS_FIRST else rel.reconstruct
    pinv = _plans.structured_inverse(L.plan)
    if _plans.fused(L.plan, method):
        fused: da.Array = x.map_blocks(
            estimate_block, L.plan, pinv, keys, ctx,  # type: ignore[arg-type]
            chunks=x.chunks,
            dtype=np.float64, name=f"measure-reconstruct-{word}-{tok}",
            meta=np.empty((0,) * x.ndim),
        )  # fmt: skip
        return fused, None
    m = L.plan.strategy.shape[0]
    y = x.map_blocks(
        measure_block, L.plan, keys, ctx,  # type: ignore[arg-type]
        chunks=(x.chunks[0], (m,)), drop_axis=list(range(2, x.ndim)),
        dtype=np.float64, name=f"measure-{word}-{tok}",
        meta=np.empty((0, 0)),
    )  # fmt: skip
    est: da.Array = y.map_blocks(
        reconstruct_block, L.plan.strategy, method, cell_shape, pinv,
        reports, L.name, L.plan.drawn_scale,
        chunks=(x.chunks[0], *((s,) for s in cell_shape)),
        new_axis=list(range(2, 1 + len(cell_shape))),
        dtype=np.float64, name=f"reconstruct-{word}-{tok}",
        meta=np.empty((0,) * (1 + len(cell_shape))),
    )  # fmt: skip
    return est, y
