"""How a release's levels are chunked, and each level's plan, charge, chunks and variance
(:func:`configure`, called by :func:`dpdask.graph.release`)."""

from __future__ import annotations

from dask.base import tokenize

from dpdask.graph._levels import LevelChunks, level_chunks
from dpdask.graph._plans import mean_cell_variance
from dpdask.graph._state import Level
from dpdask.measure import level_charge
from dpdask.store import DataStore
from dpdask.strategy import Plan

__all__ = ["configure"]

_TOP_UNITS = 1024  # top-down: a top level of at most this many units gets a chunk per unit
_TOPDOWN_SHARE = 4  # top-down chunks are chunk_bytes / this


def configure(
    store: DataStore,
    levels: tuple[str, ...],
    plans: dict[str, Plan],
    release_id: str,
    run_id: str,
    reconstruct: str,
    chunk_bytes: int,
) -> tuple[LevelChunks, tuple[Level, ...]]:
    """How the levels are chunked, and each level's plan, charge, chunks and variance."""
    n = store.domain.size
    if reconstruct == "topdown":
        # a chunk holds whole families; its size is its measurements' (and dense counts')
        dense = getattr(store, "layout", "dense") != "sparse"
        row_bytes = [
            8 * max(plans[lv].strategy.shape[0], n if (i == 0 or dense) else 1)
            for i, lv in enumerate(levels)
        ]
        if store.geography.n_units(levels[0]) <= _TOP_UNITS:
            # a few top units, each a whole non-negative fit: a task each, in parallel
            row_bytes[0] = max(row_bytes[0], chunk_bytes // _TOPDOWN_SHARE)
        # smaller chunks than a least-squares release's: a chunk's fits take longer than
        # its measurement, and a level waits for the level above (load balance)
        lc = level_chunks(
            store.geography, levels, n, max(1, chunk_bytes // _TOPDOWN_SHARE),
            row_bytes=row_bytes, whole_families=True,
        )  # fmt: skip
    else:
        lc = level_chunks(store.geography, levels, n, chunk_bytes)
    # the tree model's unit variances weigh levels against each other in the bottom-up
    # consistency step; top-down never combines levels' measurements
    same = reconstruct == "topdown" or len({tokenize(p.strategy) for p in plans.values()}) == 1
    released = tuple(
        Level(
            lv,
            plans[lv],
            level_charge(plans[lv], release_id, run_id, lv, "strategy")[0],
            lc.of(lv),
            plans[lv].row_variance * (1.0 if same else mean_cell_variance(plans[lv].strategy)),
        )
        for lv in levels
    )
    return lc, released
