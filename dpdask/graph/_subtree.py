"""The sweep before a multi-pass release's fits: what the levels below know of each total.

A pass with ``below`` (:class:`~dpdask.reconstruct.topdown.Pass`, the default total pass
of every level but the finest) fits, beside a unit's own measurements, the sum of its
children's subtree estimates of their totals
(:mod:`dpdask.reconstruct.topdown._subtree`). Those come from every level below, so
before the top-down fits the graph runs, for every level but the top:

* a task per chunk (``subtree-total-<level>``) that measures the chunk exactly as its
  fit task will (the same stream key and context: the same noise, as a retry does) and
  keeps each unit's own unbiased total and its variance (the constraints' known totals
  exactly), two numbers per unit; the measurements never leave it;
* one task (``subtree-sums``) that folds them bottom-up into each level's subtree sums,
  which the fit tasks of the levels above slice by chunk (:func:`below_rows`).

The simulation of the estimator's error (:mod:`dpdask.graph._simulate`) runs the same
sweep on its simulated measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize

from dpdask.graph._blas import task_blas
from dpdask.graph._blocks import ChunkContext, measure_block, trim_heap, tune_allocator
from dpdask.graph._chunked import level_chunk_constraints
from dpdask.graph._spine import spine_measure
from dpdask.graph._topdown_blocks import _info
from dpdask.reconstruct.topdown import Constraints, known_totals, subtree_sums, total_estimator
from dpdask.store import level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = ["below_rows", "subtree_tasks", "wants_below"]

_ESTIMATORS: dict[str, tuple[np.ndarray, float] | None] = {}  # per worker: each level's


def wants_below(rel: Release) -> bool:
    """Whether some level above the finest has a pass that fits the levels below."""
    if rel.passes is None or len(rel.released) < 2:
        return False
    return any(p.below for L in rel.released[:-1] for p in rel.passes[L.name])


def _estimator(plan: Any, token: str) -> tuple[np.ndarray, float] | None:
    if token not in _ESTIMATORS:
        A = np.asarray(plan.strategy.dense(), dtype=float)
        _ESTIMATORS[token] = total_estimator(A, np.full(A.shape[0], 1.0 / plan.row_variance))
    return _ESTIMATORS[token]


def subtree_block(
    x: Any, key: Any, plan: Any, cons: Constraints | None, ctx: ChunkContext, chunk: int,
    token: str, measure: Any = None,
) -> np.ndarray:  # fmt: skip
    """``(g, 2)``: each unit of one chunk's own unbiased total and its variance (0 for a
    total the constraints fix; ``inf`` when the strategy cannot estimate it, or for a
    spine unit, whose rows ``measure`` discards)."""
    tune_allocator()
    trim_heap()
    y = (measure or measure_block)(x, plan, key, ctx, _info(chunk))
    g = np.shape(y)[0]
    with task_blas():
        est = _estimator(plan, token)
        if est is None:
            u, s = np.zeros(g), np.full(g, np.inf)
        else:
            u, s = np.asarray(y, dtype=float) @ est[0], np.full(g, est[1])
    unknown = ~np.isfinite(u)  # a spine unit's rows, discarded (:mod:`._spine`)
    u, s = np.where(unknown, 0.0, u), np.where(unknown, np.inf, s)
    return _known(u, s, cons)


def unmeasured_block(g: int, cons: Constraints | None) -> np.ndarray:
    """:func:`subtree_block` of a chunk of ``g`` units of a spine level: not measured
    (no noise drawn), so no own totals but those the constraints fix."""
    return _known(np.zeros(g), np.full(g, np.inf), cons)


def _known(u: np.ndarray, s: np.ndarray, cons: Constraints | None) -> np.ndarray:
    if cons is not None:
        known, value = known_totals(cons)
        u, s = np.where(known, value, u), np.where(known, 0.0, s)
    return np.column_stack([u, s])


def _sums(
    parts: list[list[np.ndarray]], parents: list[np.ndarray], sizes: list[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    own = [(both[:, 0], both[:, 1]) for both in (np.concatenate(p) for p in parts)]
    return subtree_sums(own, parents, sizes)


def subtree_tasks(
    rel: Release,
    dsk: dict[Any, Any],
    block: Callable[[int, int], Any],
    stream: Callable[[int, int], Any],
    context: Callable[[int], ChunkContext],
    tok: str,
    plans: Sequence[Any],
    measure: Any = None,
) -> str:
    """Add the sweep's tasks (module notes) to ``dsk``; return the sums task's key.

    ``block(i, k)``, ``stream(i, k)`` and ``context(i)`` give what level ``i``'s chunk
    ``k`` is measured from, as its fit task has them, ``plans[i]`` the key of its plan
    in ``dsk`` (:func:`~dpdask.graph._topdown.level_shared`); ``measure`` replaces
    :func:`~dpdask.graph._blocks.measure_block` (a simulation's).
    """
    parts: list[list[Any]] = []
    for i in range(1, len(rel.released)):
        L = rel.released[i]
        name = f"subtree-total-{level_key(L.name)}-{tok}"
        token = tokenize(L.plan.strategy, L.plan.row_variance)
        bounds = np.cumsum((0, *L.chunks))
        ctx = context(i)
        keys = []
        for k in range(len(L.chunks)):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            cons = level_chunk_constraints(rel.constraints, L.name, lo, hi)
            measured, how = spine_measure(rel, i, lo, hi, measure)
            dsk[(name, k)] = (
                (subtree_block, block(i, k), stream(i, k), plans[i], cons, ctx, k, token, how)
                if measured
                else (unmeasured_block, hi - lo, cons)
            )
            keys.append((name, k))
        parts.append(keys)
    sums = f"subtree-sums-{tok}"
    sizes = [int(sum(L.chunks)) for L in rel.released]
    dsk[sums] = (_sums, parts, [np.asarray(p) for p in rel.lc.parents], sizes)
    return sums


def below_rows(
    sums: Sequence[tuple[np.ndarray, np.ndarray]], level: int, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray]:
    """The subtree sums and variances of units ``start:stop`` of level ``level``."""
    S, VS = sums[level]
    return S[start:stop], VS[start:stop]
