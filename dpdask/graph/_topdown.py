"""Top-down estimation of a release: each parent's estimate split among its children.

``reconstruct="topdown"`` (issue 24), a step of a :class:`dpdask.graph.Release` run
(:func:`topdown_graph`, run by :func:`measure_topdown`). Levels are chunked so that no
family (the children of one parent) spans two chunks
(:func:`~dpdask.graph._levels.level_chunks` with ``whole_families``), and sized by
the level's strategy rows, not its cells. One Dask graph then runs, level by
level:

* the top level (tasks ``measure-reconstruct-<level>``): each chunk measured with its
  keyed noise and fitted non-negative per unit
  (:func:`~dpdask.graph._topdown_blocks.top_block`);
* every finer level (tasks ``measure-reconstruct-<level>``): each chunk of whole
  families measured and fitted, family by family, inside the parent's final estimate
  (:func:`~dpdask.graph._topdown_blocks.family_block`): non-negative children that
  add up to the parent cell by cell, zero off the parent's support;
* every chunk's estimate, a :class:`sparse.COO` block, is written to the run's work
  folder (``checkpoint-<level>``, :func:`~dpdask.graph._checkpoint.write_sparse`) and
  marked done.

The counts of every level are read sparse where the store is sparse
(:meth:`~dpdask.store.DataStore.to_sparse`, summed up the hierarchy without
densifying) and dense otherwise; the measure step takes either. Measurements live only
inside their task: memory and disk grow with the estimates' entries and the strategy
rows of one chunk, not with cells times geographies.

A resumed run loads the chunks marked done and measures the others again, with the same
noise (the same stream of the same chunk), so its output is the uninterrupted run's.
With ``integer=True`` the top level is rounded to the nearest non-negative integers and
every family by the controlled rounding (children add up exactly to their integer
parent, each within 1 of the fractional fit).
"""

from __future__ import annotations

import pathlib
import zipfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from dpdask.graph._blocks import ChunkContext
from dpdask.graph._checkpoint import read_sparse, write_sparse
from dpdask.graph._graph import level_data
from dpdask.graph._multipass import multipass_task, passes_token
from dpdask.graph._run import level_charge
from dpdask.graph._spine import spine_task
from dpdask.graph._state import RunState
from dpdask.graph._subtree import subtree_tasks, wants_below
from dpdask.graph._topdown_blocks import family_block, parent_chunks, top_block
from dpdask.graph._unbiased import Unbiased, unbiased_levels
from dpdask.publish import marker
from dpdask.store import level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = [
    "LevelShared",
    "fit_task",
    "level_shared",
    "measure_topdown",
    "sparse_entries",
    "topdown_counts",
    "topdown_graph",
]


def sparse_entries(folder: pathlib.Path | str, k: int) -> int:
    """The number of entries of sparse chunk ``k`` in ``folder``, from its file's header."""
    path = pathlib.Path(folder) / f"{k}.npz"
    with zipfile.ZipFile(path) as z, z.open("values.npy") as f:
        version = np.lib.format.read_magic(f)
        reader = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _, _ = reader(f)
    return int(shape[0])


def topdown_counts(rel: Release) -> list[Any]:
    """Every released level's counts, lazily, chunked as the level chunks: sparse
    blocks for a sparse store, dense ones otherwise."""
    if getattr(rel.store, "layout", "dense") != "sparse":
        return level_data(rel)
    from dpdask.store import aggregate_sparse

    arrays = [rel.store.to_sparse(rel.lc.chunks[-1])]
    for i in range(len(rel.levels) - 1, 0, -1):
        name = f"aggregate-{level_key(rel.levels[i - 1])}"
        arrays.insert(
            0, aggregate_sparse(arrays[0], rel.lc.parents[i - 1], rel.lc.chunks[i - 1], name)
        )
    return arrays


def measure_topdown(rel: Release, run: RunState, client: Any, progress: bool) -> list[pathlib.Path]:
    """Measure and fit every chunk not yet checkpointed in ``work`` (module notes);
    return each level's folder of sparse chunks."""
    from dpdask.graph._progress import compute_items

    folders, todo = topdown_graph(rel, run)
    if todo is not None:
        items = [todo]
        if progress:  # one result per chunk's checkpoint, counted per level
            layer = todo.dask.layers[todo.key]
            ours = [k for k in layer if isinstance(k, tuple) and k[0].startswith("checkpoint-")]
            items = [Delayed(k, todo.dask, layer=todo.key) for k in ours]  # type: ignore[no-untyped-call]
        words = {level_key(L.name): L.name for L in rel.released}
        compute_items(items, client, progress, "measure-reconstruct", words)
    return folders


@dataclass(frozen=True)
class LevelShared:
    """What every fit task of a level shares, in the graph once rather than in each
    task (a level's passes hold dense query rows: tens of MB a task on ``pl94-full``,
    which a worker holds for every task queued on it).

    Attributes
    ----------
    token : str
        Identifies the level's fit in a worker's caches (strategy, noise, passes).
    plan : str
        The key of the level's plan (whose caches can be large).
    unbiased : str or None
        The key of the level's :class:`~dpdask.graph._unbiased.Unbiased`, or None.
    passes : str or None
        The key of the level's passes (a multi-pass release), or None.
    """

    token: str
    plan: str
    unbiased: str | None = None
    passes: str | None = None


def level_shared(
    dsk: dict[Any, Any], rel: Release, i: int, unbiased: Unbiased | None, tok: str
) -> LevelShared:
    """Put level ``i``'s shared values in ``dsk`` once (keys ``plan-<level>``,
    ``unbiased-queries-<level>`` and ``passes-<level>`` with ``tok``) and say how its
    fit tasks refer to them."""
    L = rel.released[i]
    word = level_key(L.name)
    token = tokenize(L.plan.strategy, L.plan.row_variance)
    plan = f"plan-{word}-{tok}"
    dsk[plan] = L.plan
    ukey = pkey = None
    if unbiased is not None:
        ukey = f"unbiased-queries-{word}-{tok}"
        dsk[ukey] = unbiased
    if rel.passes is not None:
        token = passes_token(token, rel.passes[L.name])
        pkey = f"passes-{word}-{tok}"
        dsk[pkey] = tuple(rel.passes[L.name])
    return LevelShared(token, plan, ukey, pkey)


def fit_task(
    rel: Release,
    i: int,
    L: Any,
    bounds: np.ndarray,
    block: Any,
    sk: Any,
    prev: tuple[str, np.ndarray] | None,
    k: int,
    ctx: ChunkContext,
    shared: LevelShared,
    reports: str | None,
    measure: Any = None,
    below: str | None = None,
) -> tuple[Any, ...]:
    """The task that measures and fits chunk ``k`` of level ``i`` (``L``, its chunks'
    ``bounds``): its counts ``block`` (a key), its stream key ``sk``, and ``prev``, the
    level above's task name and chunk starts (None at the top); ``shared``: the level's
    values in the graph (:func:`level_shared`). A multi-pass release's tasks are
    :func:`~dpdask.graph._multipass.multipass_task`'s (``below``: the key of the levels
    below's subtree sums, :mod:`~dpdask.graph._subtree`)."""
    spine, measure = spine_task(rel, i, bounds, prev, k, measure)  # :mod:`._spine`
    if spine is not None:
        return spine
    ub = shared.unbiased
    if rel.passes is not None:
        return multipass_task(
            rel, i, L, bounds, block, sk, prev, k, ctx, shared, reports, measure, below,
        )  # fmt: skip
    if prev is None:
        return (top_block, block, sk, shared.plan, ctx, k, rel.integer, reports, ub, measure)
    p = rel.lc.parents[i - 1][bounds[k] : bounds[k + 1]]
    keys, starts = parent_chunks(p, *prev)
    return (
        family_block, block, sk, keys, starts,
        p, shared.plan, ctx, k, shared.token, rel.integer, reports, ub, measure,
    )  # fmt: skip


def topdown_graph(rel: Release, run: RunState) -> tuple[list[pathlib.Path], Any]:
    """The levels' folders, and the graph that fills them (a ``Delayed`` returning the
    number of entries written; None when every chunk is done)."""
    from dpdask.measure import stream_key

    work, key = run.work, run.key
    raw, markers, reports = work / "raw", work / "done", str(work / "reports")
    for folder in (markers, work / "reports"):
        folder.mkdir(parents=True, exist_ok=True)
    counts = topdown_counts(rel)
    dsk: dict[Any, Any] = {}
    outputs: list[Any] = []
    folders: list[pathlib.Path] = []
    prev: tuple[str, np.ndarray] | None = None  # the level above: its name, chunk starts
    tok = tokenize(
        rel.release_id, rel.run_id, rel.integer, rel.passes is not None, [x.name for x in counts]
    )
    unbiased = unbiased_levels(rel, work)

    def context(i: int) -> ChunkContext:
        L = rel.released[i]
        return ChunkContext(
            rel.release_id, L.name, rel.run_id, level_charge(run, L), rel.noise, rel.test_mode,
            rel.max_total,
        )  # fmt: skip

    def stream(i: int, k: int) -> Any:
        lv = rel.released[i].name
        return (
            None
            if key is None
            else stream_key(key, (rel.release_id, lv, k, "strategy"), rel.run_id)
        )

    def block(i: int, k: int) -> Any:
        return (counts[i].name, k, *(0,) * (counts[i].ndim - 1))

    shared = [level_shared(dsk, rel, i, unbiased[i], tok) for i in range(len(rel.released))]
    below = None
    if wants_below(rel) and not all(
        marker(markers, L.name, k).exists() for L in rel.released for k in range(len(L.chunks))
    ):
        below = subtree_tasks(rel, dsk, block, stream, context, tok, [s.plan for s in shared])
    for i, L in enumerate(rel.released):
        folder = raw / L.name
        folder.mkdir(parents=True, exist_ok=True)
        folders.append(folder)
        word = level_key(L.name)
        name, ck = f"measure-reconstruct-{word}-{tok}", f"checkpoint-{word}-{tok}"
        ctx = context(i)
        bounds = np.cumsum((0, *L.chunks))
        for k in range(len(L.chunks)):
            done = marker(markers, L.name, k)
            if done.exists():
                dsk[(name, k)] = (read_sparse, str(folder), k)
                continue
            dsk[(name, k)] = fit_task(
                rel, i, L, bounds, block(i, k), stream(i, k), prev, k, ctx, shared[i],
                reports, below=below,
            )  # fmt: skip
            dsk[(ck, k)] = (write_sparse, (name, k), folder, k, done)
            outputs.append((ck, k))
        prev = (name, bounds[:-1])
    if not outputs:
        return folders, None
    final = f"checkpoint-done-{tok}"
    dsk[final] = (sum, outputs)
    graph = HighLevelGraph.from_collections(final, dsk, dependencies=counts)
    return folders, Delayed(final, graph)  # type: ignore[no-untyped-call]
