"""The error of a non-linear estimator's published answers, measured by simulation.

A top-down estimate (non-negative fits, integer rounding), like an NNLS, WNNLS or ADMM
one, is not linear in the measurements: the least-squares variance does not describe
it. Its error is measured instead, per level and workload query group, by simulation
around the published estimate (:func:`simulate_topdown`, :func:`simulate_dense`):

1. the published estimate of every level, ``x_pub``, is taken as a public truth;
2. noise is drawn from the plan around it, as the measure step would around the data:
   ``y = A x_pub + z`` (on the lattice for float data or strategies, as measured), ``z``
   of the law, scale and lattice actually drawn (the plan's
   :attr:`~dpdask.strategy.Plan.drawn`; :func:`simulated_measurement`);
3. the same estimator is re-run on ``y`` with the same options: top-down through the
   same tasks (:func:`~dpdask.graph._topdown.fit_task`: top-level NNLS, every family
   inside its simulated parent, integer rounding included); NNLS, WNNLS and ADMM
   through the same per-level estimate and
   :func:`~dpdask.graph._consistent.consistent_estimates` (consistency, non-negative
   fit), once the release's estimates are written;
4. each level's answers are compared with the published ones: per workload query group,
   the RMSE over the level's units, the group's queries and the trials.

This is post-processing of the published output: no data is read and nothing is charged.
The noise comes from the release's key, on streams of their own (measurement
``simulate-<t>`` of chunk ``k`` of each level, never the measurement's ``strategy``
stream), so a retried task reproduces it; a fixed seed only ever comes from a test key
in test mode. ``K`` trials (``reconstruct: {method: topdown, simulate: K}``, default 1)
run in one graph (tasks ``simulate-<level>`` and ``simulate-error-<level>``; on the
dense path ``simulate-measure-<level>``, ``simulate-reconstruct-<level>``,
``simulated-<level>``, ``simulate-answer-<level>``); ``K = 0`` publishes no RMSE and
says so.

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

import dask.array as da
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
from dpdask.graph._subtree import subtree_tasks, wants_below
from dpdask.graph._topdown import fit_task, level_shared
from dpdask.graph._uncertainty import uncertainty_attrs
from dpdask.linalg import LinearQuery, VStack, apply_rows
from dpdask.store import level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = [
    "SimulatedRMSE",
    "group_rows",
    "publish_simulated",
    "simulate_dense",
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

    if isinstance(key, np.ndarray):  # a dense release's one-element block of keys
        key = key.reshape(-1)[0]
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

    secret = run.key
    dsk: dict[Any, Any] = {}
    pub_names = []
    for L, folder in zip(rel.released, raw, strict=True):
        name = f"published-{level_key(L.name)}-{tokenize(str(folder), L.chunks)}"
        for k in range(len(L.chunks)):
            dsk[(name, k, 0)] = (read_sparse, str(folder), k)
        pub_names.append(name)
    errors: list[list[Any]] = [[] for _ in rel.released]
    # each level's plan and passes, in the graph once for every trial
    stok = tokenize(rel.release_id, rel.run_id, rel.integer, pub_names)
    shared = [level_shared(dsk, rel, i, None, stok) for i in range(len(rel.released))]
    for t in range(K):
        measure = functools.partial(simulated_measurement, trial=t)
        prev: tuple[str, np.ndarray] | None = None

        def context(i: int) -> ChunkContext:
            lv = rel.released[i].name
            return ChunkContext(
                rel.release_id, lv, rel.run_id, None, True, rel.test_mode, rel.max_total
            )

        def stream(i: int, k: int, t: int = t) -> Any:
            lv = rel.released[i].name
            return stream_key(secret, (rel.release_id, lv, k, f"simulate-{t}"), rel.run_id)

        tok = tokenize(rel.release_id, rel.run_id, rel.integer, pub_names, t)
        below = None
        if wants_below(rel):  # the levels below's totals, from the simulated measurements
            below = subtree_tasks(
                rel, dsk, lambda i, k: (pub_names[i], k, 0), stream, context, tok,
                [s.plan for s in shared], measure,
            )  # fmt: skip
        for i, L in enumerate(rel.released):
            word = level_key(L.name)
            name, err = f"simulate-{word}-{tok}", f"simulate-error-{word}-{tok}"
            ctx = context(i)
            bounds = np.cumsum((0, *L.chunks))
            for k in range(len(L.chunks)):
                dsk[(name, k)] = fit_task(
                    rel, i, L, bounds, (pub_names[i], k, 0), stream(i, k), prev, k, ctx,
                    shared[i], None, measure, below,
                )  # fmt: skip
                dsk[(err, k)] = (_squared_errors, (name, k), (pub_names[i], k, 0), L.plan.workload)
                errors[i].append((err, k))
            prev = (name, bounds[:-1])
    final = f"simulate-done-{tokenize(rel.release_id, rel.run_id, K)}"
    dsk[final] = (_per_level, errors)
    from dask.delayed import Delayed

    graph = HighLevelGraph.from_collections(final, dsk, dependencies=())
    (sums,) = compute_items([Delayed(final, graph)], client, progress, "simulate")  # type: ignore[no-untyped-call]
    return _by_group(rel, sums, K)


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


def _stream_keys(rel: Release, run: RunState, L: Any, t: int, ndim: int) -> da.Array:
    """Chunk ``k``'s stream key of trial ``t`` as block ``k`` (a one-element object
    array), made on the client: tasks never see the release's key."""
    from dpdask.measure import stream_key

    n, key = len(L.chunks), run.key
    if key is None:  # pragma: no cover - simulate_dense returns first
        raise NoiseKeyError("a simulation needs the run's key")
    name = f"simulate-streamkey-{level_key(L.name)}-{tokenize(rel.release_id, rel.run_id, t)}"
    one = (1,) * (ndim - 1)
    blocks: dict[Any, Any] = {}
    for k in range(n):
        block = np.empty((1, *one), dtype=object)
        ident = (rel.release_id, L.name, k, f"simulate-{t}")
        block.flat[0] = stream_key(key, ident, rel.run_id)
        blocks[(name, k, *(0,) * len(one))] = block
    graph = HighLevelGraph.from_collections(name, blocks)
    return da.Array(graph, name, chunks=((1,) * n, *((1,) for _ in one)), dtype=object)  # type: ignore[no-untyped-call]


def simulate_dense(
    rel: Release, run: RunState, root: Any, client: Any, progress: bool
) -> list[SimulatedRMSE] | None:
    """The simulated RMSE of an NNLS, WNNLS or ADMM release's published answers (module
    notes), from its published estimates and answers in ``root``: every level measured
    around them, estimated, made consistent and fitted non-negative as the release was
    (:func:`~dpdask.graph._consistent.consistent_estimates`). None when nothing is
    simulated."""
    from dpdask.graph import _plans
    from dpdask.graph._blocks import LS_FIRST, answer_block, reconstruct_block
    from dpdask.graph._consistent import consistent_estimates

    K = rel.simulate
    if K == 0 or not rel.noise or run.key is None:
        return None
    shape = tuple(rel.domain.shape)
    method = "ls" if rel.reconstruct in LS_FIRST else rel.reconstruct
    published, answers = [], []
    for L in rel.released:
        est: da.Array = da.from_zarr(root[L.name]["estimate"])  # type: ignore[no-untyped-call]
        published.append(est.rechunk((L.chunks, *((s,) for s in shape))))  # type: ignore[no-untyped-call]
        ans: da.Array = da.from_zarr(root[L.name]["answers"])  # type: ignore[no-untyped-call]
        answers.append(ans.rechunk((L.chunks, -1)))  # type: ignore[no-untyped-call]
    variances = [
        np.full(rel.store.geography.n_units(L.name), L.unit_variance) for L in rel.released
    ]
    sse: list[Any] = [None] * len(rel.released)
    for t in range(K):
        ests = []
        for L, x in zip(rel.released, published, strict=True):
            word, m = level_key(L.name), L.plan.strategy.shape[0]
            tok = tokenize(rel.release_id, rel.run_id, L.name, t, x.name)
            ctx = ChunkContext(
                rel.release_id, L.name, rel.run_id, None, True, rel.test_mode, rel.max_total
            )
            y = x.map_blocks(
                simulated_measurement, L.plan, _stream_keys(rel, run, L, t, x.ndim), ctx,
                trial=t, chunks=(x.chunks[0], (m,)), drop_axis=list(range(2, x.ndim)),
                dtype=np.float64, name=f"simulate-measure-{word}-{tok}", meta=np.empty((0, 0)),
            )  # fmt: skip
            pinv = _plans.structured_inverse(L.plan)
            ests.append(y.map_blocks(
                reconstruct_block, L.plan.strategy, method, shape, pinv, None, L.name,
                L.plan.drawn_scale, chunks=(x.chunks[0], *((s,) for s in shape)),
                new_axis=list(range(2, 1 + len(shape))), dtype=np.float64,
                name=f"simulate-reconstruct-{word}-{tok}", meta=np.empty((0,) * (1 + len(shape))),
            ))  # fmt: skip
        final, _ = consistent_estimates(rel, ests, variances, None, name="simulated")
        for i, (L, fit) in enumerate(zip(rel.released, final, strict=True)):
            W = L.plan.workload
            got = fit.map_blocks(
                answer_block, W, chunks=(fit.chunks[0], (W.shape[0],)),  # type: ignore[arg-type]
                drop_axis=list(range(2, fit.ndim)), dtype=np.float64, meta=np.empty((0, 0)),
                name=f"simulate-answer-{level_key(L.name)}-{tokenize(fit, W)}",
            )  # fmt: skip
            err = ((got - answers[i].rechunk({0: got.chunks[0]})) ** 2).sum(axis=0)
            sse[i] = err if sse[i] is None else sse[i] + err
    sums = compute_items(sse, client, progress, "simulate")
    return _by_group(rel, sums, K)


def _by_group(rel: Release, sums: Sequence[np.ndarray], K: int) -> list[SimulatedRMSE]:
    """Each level's RMSE by query group from its squared errors per query (summed over
    units and ``K`` trials)."""
    out = []
    for L, sse in zip(rel.released, sums, strict=True):
        units = rel.store.geography.n_units(L.name)
        groups = group_rows(L.plan.workload)
        sq = np.asarray(sse, dtype=np.float64)
        rmse = np.array([math.sqrt(float(sq[r].sum()) / (units * r.size * K)) for _, r in groups])
        out.append(SimulatedRMSE(tuple(g for g, _ in groups), rmse, K))
    return out
