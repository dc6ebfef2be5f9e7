"""Top-down estimation of a release: each parent's estimate split among its children.

``reconstruct="topdown"`` (issue 24), part of :class:`dpdask.release._release.Release` (a
mixin). Levels are chunked so that no family (the children of one parent) spans two
chunks (:func:`~dpdask.release._levels.level_chunks` with ``whole_families``), and
sized by the level's strategy rows, not its cells. One Dask graph then runs, level by
level:

* the top level (tasks ``measure-reconstruct-<level>``): each chunk measured with its
  keyed noise and fitted non-negative per unit
  (:func:`~dpdask.release._topdown_blocks.top_block`);
* every finer level (tasks ``measure-reconstruct-<level>``): each chunk of whole
  families measured and fitted, family by family, inside the parent's final estimate
  (:func:`~dpdask.release._topdown_blocks.family_block`): non-negative children that
  add up to the parent cell by cell, zero off the parent's support;
* every chunk's estimate, a :class:`sparse.COO` block, is written to the run's work
  folder (``checkpoint-<level>``, :func:`~dpdask.release._checkpoint.write_sparse`) and
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
from typing import Any

import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from dpdask.publish import marker
from dpdask.release._blocks import ChunkContext
from dpdask.release._checkpoint import read_sparse, write_sparse
from dpdask.release._state import ReleaseState
from dpdask.release._topdown_blocks import family_block, top_block
from dpdask.store import level_key

__all__ = ["TopdownGraph", "sparse_entries"]


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


class TopdownGraph(ReleaseState):
    """The top-down steps of a :class:`~dpdask.release._release.Release` (module notes)."""

    def _topdown_counts(self) -> list[Any]:
        """Every released level's counts, lazily, chunked as the level chunks: sparse
        blocks for a sparse store, dense ones otherwise."""
        if getattr(self.store, "layout", "dense") != "sparse":
            return self._level_data()  # type: ignore[attr-defined]
        from dpdask.store import aggregate_sparse

        arrays = [self.store.to_sparse(self.lc.chunks[-1])]  # type: ignore[attr-defined]
        for i in range(len(self.levels) - 1, 0, -1):
            name = f"aggregate-{level_key(self.levels[i - 1])}"
            arrays.insert(
                0, aggregate_sparse(arrays[0], self.lc.parents[i - 1], self.lc.chunks[i - 1], name)
            )
        return arrays

    def _topdown_checkpoint(
        self, work: pathlib.Path, key: Any, client: Any, progress: bool
    ) -> list[pathlib.Path]:
        """Measure and fit every chunk not yet checkpointed in ``work`` (module notes);
        return each level's folder of sparse chunks."""
        from dpdask.release._progress import compute_items

        folders, todo = self._topdown_graph(work, key)
        if todo is not None:
            items = [todo]
            if progress:  # one result per chunk's checkpoint, counted per level
                layer = todo.dask.layers[todo.key]
                ours = [k for k in layer if isinstance(k, tuple) and k[0].startswith("checkpoint-")]
                items = [Delayed(k, todo.dask, layer=todo.key) for k in ours]
            words = {level_key(L.name): L.name for L in self._levels}
            compute_items(items, client, progress, "measure-reconstruct", words)
        return folders

    def _topdown_graph(self, work: pathlib.Path, key: Any) -> tuple[list[pathlib.Path], Any]:
        """The levels' folders, and the graph that fills them (a ``Delayed`` returning the
        number of entries written; None when every chunk is done)."""
        from dpdask.measure import stream_key

        raw, markers, reports = work / "raw", work / "done", str(work / "reports")
        for folder in (markers, work / "reports"):
            folder.mkdir(parents=True, exist_ok=True)
        counts = self._topdown_counts()
        dsk: dict[Any, Any] = {}
        outputs: list[Any] = []
        folders: list[pathlib.Path] = []
        prev: tuple[str, np.ndarray] | None = None  # the level above: its name, chunk starts
        tok = tokenize(self.release_id, self.run_id, self.integer, [x.name for x in counts])
        for i, (L, x) in enumerate(zip(self._levels, counts, strict=True)):
            folder = raw / L.name
            folder.mkdir(parents=True, exist_ok=True)
            folders.append(folder)
            word = level_key(L.name)
            name, ck = f"measure-reconstruct-{word}-{tok}", f"checkpoint-{word}-{tok}"
            ctx = ChunkContext(
                self.release_id, L.name, self.run_id, L.charge, self.noise, self.test_mode,
                self.max_total,
            )  # fmt: skip
            bounds = np.cumsum((0, *L.chunks))
            zeros = (0,) * (x.ndim - 1)
            fit_token = tokenize(L.plan.strategy, L.plan.row_variance)
            for k in range(len(L.chunks)):
                done = marker(markers, L.name, k)
                if done.exists():
                    dsk[(name, k)] = (read_sparse, str(folder), k)
                    continue
                sk = None
                if key is not None:
                    sk = stream_key(key, (self.release_id, L.name, k, "strategy"), self.run_id)
                block = (x.name, k, *zeros)
                if prev is None:
                    dsk[(name, k)] = (
                        top_block, block, sk, L.plan, ctx, k, self.integer, reports,
                    )  # fmt: skip
                else:
                    pname, pstarts = prev
                    p = self.lc.parents[i - 1][bounds[k] : bounds[k + 1]]
                    js = range(
                        int(np.searchsorted(pstarts, p[0], side="right") - 1),
                        int(np.searchsorted(pstarts, p[-1], side="right")),
                    )
                    dsk[(name, k)] = (
                        family_block, block, sk, [(pname, j) for j in js],
                        [int(pstarts[j]) for j in js], p, L.plan, ctx, k, fit_token,
                        self.integer, reports,
                    )  # fmt: skip
                dsk[(ck, k)] = (write_sparse, (name, k), folder, k, done)
                outputs.append((ck, k))
            prev = (name, bounds[:-1])
        if not outputs:
            return folders, None
        final = f"checkpoint-done-{tok}"
        dsk[final] = (sum, outputs)
        graph = HighLevelGraph.from_collections(final, dsk, dependencies=counts)
        return folders, Delayed(final, graph)
