"""The error of a top-down release's published answers, measured by simulation.

A top-down estimate (non-negative fits, integer rounding) is not linear in the
measurements: the least-squares variance does not describe it. Its error is measured
instead, per level and workload query group, by simulation around the published
estimate (:func:`simulate_topdown`):

1. the published estimate of every level, ``x_pub``, is taken as a public truth;
2. noise is drawn from the plan around it, as the measure step would around the data:
   ``y = A x_pub + z`` (on the lattice for float data or strategies, as measured), ``z``
   of the law, scale and lattice actually drawn (the plan's
   :attr:`~dpdask.strategy.Plan.drawn`);
3. the same estimator is re-run on ``y``: the same tasks
   (:func:`~dpdask.graph._topdown.fit_task`: top-level NNLS, every family inside its
   simulated parent, integer rounding included) with the same options;
4. each level's answers are compared with the published ones: per workload query group,
   the RMSE over the level's units, the group's queries and the trials.

This is post-processing of the published output: no data is read and nothing is charged.
The noise comes from the release's key, on streams of their own (measurement
``simulate-<t>`` of chunk ``k`` of each level, never the measurement's ``strategy``
stream), so a retried task reproduces it; a fixed seed only ever comes from a test key
in test mode. ``K`` trials (``reconstruct: {method: topdown, simulate: K}``, default 1)
run in one graph (tasks ``simulate-<level>`` and ``simulate-error-<level>``); ``K = 0``
publishes no RMSE and says so.

Published per level (:func:`publish_simulated`): ``simulated_rmse`` (``query_group``),
labelled "RMSE by simulation around the published estimate, K trials".
"""

from __future__ import annotations

import functools
import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import sparse
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from dpdask.errors import NoiseKeyError
from dpdask.graph._blas import task_blas
from dpdask.graph._blocks import ChunkContext
from dpdask.graph._checkpoint import read_sparse
from dpdask.graph._output import LevelGroup, add_array
from dpdask.graph._progress import compute_items
from dpdask.graph._state import RunState
from dpdask.graph._topdown import fit_task
from dpdask.graph._uncertainty import uncertainty_attrs
from dpdask.linalg import LinearQuery, VStack, apply_rows
from dpdask.store import level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = [
    "SimulatedRMSE",
    "group_rows",
    "publish_simulated",
    "simulate_topdown",
    "simulated_measurement",
]


@dataclass(frozen=True)
class SimulatedRMSE:
    """One level's simulated RMSE by query group (``trials`` trials)."""

    groups: tuple[str, ...]
    rmse: np.ndarray
    trials: int


def group_rows(W: LinearQuery) -> list[tuple[str, np.ndarray]]:
    """Each query group of workload ``W`` (the parts of a stacked workload, else one
    group ``query``) and its rows."""
    if not isinstance(W, VStack):
        return [("query", np.arange(W.shape[0]))]
    names = W.names or tuple(f"part{k + 1}" for k in range(len(W.parts)))
    out: list[tuple[str, np.ndarray]] = []
    start = 0
    for name, part in zip(names, W.parts, strict=True):
        out.append((str(name), np.arange(start, start + part.shape[0])))
        start += part.shape[0]
    return out


def simulated_measurement(
    x: Any, plan: Any, key: Any, ctx: ChunkContext, block_info: Any, trial: int = 0
) -> np.ndarray:
    """Simulated measurements ``(g, m)`` of one chunk of a published estimate ``x``
    (``(g, n)``, dense or sparse): ``A x`` (on the plan's lattice) plus noise of the law
    drawn, from stream ``(release, level, chunk, "simulate-<trial>")`` of the run."""
    from dpdask.measure import stream_identity
    from dpdask.noise import KeyedRNG, StreamKey

    chunk = int(block_info[0]["chunk-location"][0])
    stream = stream_identity((ctx.release, ctx.level, chunk, f"simulate-{trial}"), ctx.run_id)
    if not isinstance(key, StreamKey) or not key.is_for(stream):
        raise NoiseKeyError("a simulation task takes the stream key of its own simulate stream")
    if key.test_only and not ctx.test_mode:
        raise NoiseKeyError("refusing a test-only key outside test mode")
    drawn = plan.drawn
    with task_blas():
        exact = apply_rows(plan.strategy, x)
        if not drawn.exact:  # as measured: the answers rounded to the grid
            exact = np.ldexp(np.rint(np.ldexp(exact, drawn.k)), -drawn.k)
        noise = KeyedRNG(key, stream).sample(drawn.mechanism, drawn.grid_scale, exact.shape)
    out: np.ndarray = exact + np.ldexp(noise.astype(np.float64), -drawn.k)
    return out


def _squared_errors(sim: sparse.COO, pub: sparse.COO, W: LinearQuery) -> np.ndarray:
    """``sum over units of (W sim - W pub)^2`` per workload row, ``(q,)``."""
    with task_blas():
        d = apply_rows(W, sim) - apply_rows(W, pub)
    out: np.ndarray = np.einsum("ij,ij->j", d, d)
    return out


def simulate_topdown(
    rel: Release, run: RunState, raw: Sequence[pathlib.Path], client: Any, progress: bool
) -> list[SimulatedRMSE] | None:
    """Every level's simulated RMSE by query group (module notes), or None when nothing
    is simulated (``simulate: 0``, or no noise)."""
    K = rel.simulate
    if K == 0 or not rel.noise or run.key is None:
        return None
    from dpdask.measure import stream_key

    dsk: dict[Any, Any] = {}
    pub_names = []
    for L, folder in zip(rel.released, raw, strict=True):
        name = f"published-{level_key(L.name)}-{tokenize(str(folder), L.chunks)}"
        for k in range(len(L.chunks)):
            dsk[(name, k, 0)] = (read_sparse, str(folder), k)
        pub_names.append(name)
    errors: list[list[Any]] = [[] for _ in rel.released]
    for t in range(K):
        measure = functools.partial(simulated_measurement, trial=t)
        prev: tuple[str, np.ndarray] | None = None
        for i, L in enumerate(rel.released):
            word = level_key(L.name)
            tok = tokenize(rel.release_id, rel.run_id, rel.integer, pub_names[i], t)
            name, err = f"simulate-{word}-{tok}", f"simulate-error-{word}-{tok}"
            ctx = ChunkContext(
                rel.release_id, L.name, rel.run_id, None, True, rel.test_mode, rel.max_total
            )
            bounds = np.cumsum((0, *L.chunks))
            fit_token = tokenize(L.plan.strategy, L.plan.row_variance)
            for k in range(len(L.chunks)):
                sk = stream_key(run.key, (rel.release_id, L.name, k, f"simulate-{t}"), rel.run_id)
                dsk[(name, k)] = fit_task(
                    rel, i, L, bounds, (pub_names[i], k, 0), sk, prev, k, ctx, fit_token,
                    None, None, measure,
                )  # fmt: skip
                dsk[(err, k)] = (_squared_errors, (name, k), (pub_names[i], k, 0), L.plan.workload)
                errors[i].append((err, k))
            prev = (name, bounds[:-1])
    final = f"simulate-done-{tokenize(rel.release_id, rel.run_id, K)}"
    dsk[final] = (_per_level, errors)
    from dask.delayed import Delayed

    graph = HighLevelGraph.from_collections(final, dsk, dependencies=())
    (sums,) = compute_items([Delayed(final, graph)], client, progress, "simulate")  # type: ignore[no-untyped-call]
    out = []
    for L, sse in zip(rel.released, sums, strict=True):
        units = rel.store.geography.n_units(L.name)
        groups = group_rows(L.plan.workload)
        rmse = np.array(
            [math.sqrt(float(sse[rows].sum()) / (units * rows.size * K)) for _, rows in groups]
        )
        out.append(SimulatedRMSE(tuple(g for g, _ in groups), rmse, K))
    return out


def _per_level(errors: list[list[np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Each level's squared errors summed over its chunks and trials (a tuple: one
    result, which :func:`~dpdask.graph._progress.compute_items` does not flatten)."""
    return tuple(np.sum(np.stack(level), axis=0) for level in errors)


def publish_simulated(lg: LevelGroup, sim: SimulatedRMSE | None, plan: Any, what: str) -> None:
    """A level's ``simulated_rmse`` by ``query_group`` (or, with ``sim`` None, the
    level group's attribute saying that none was simulated); ``what`` names the
    published estimator."""
    if sim is None:
        lg.group.attrs["simulated_rmse"] = (
            "not simulated (reconstruct: {method: topdown, simulate: 0}, or no noise)"
        )
        return
    g = lg.group
    labels = np.asarray(sim.groups, dtype=str)
    g.create_array(
        "query_group", shape=labels.shape, dtype=str, dimension_names=("query_group",),
        attributes={"long_name": "workload query group"},
    )[:] = labels  # fmt: skip
    label = f"RMSE by simulation around the published estimate, {sim.trials} trials"
    attrs = uncertainty_attrs(what, plan, True, trials=sim.trials, method=label)
    add_array(lg, "simulated_rmse", sim.rmse, ("query_group",), "persons", label, attrs=attrs)
