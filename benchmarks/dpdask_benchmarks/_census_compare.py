"""``dpdask bench census --part compare``: the estimators on a synthetic state (issue 33).

A state of ``--blocks`` blocks and ``--persons`` persons on the 2,016-cell ``pl94-full``
histogram, with housing units and group-quarters facilities (``data: {format:
synthetic-blocks}``, drawn once into ``--workdir`` by the spec pipeline's own
:func:`~dpdask.pipeline.run.load_data` and reused by a later run with the same
options), released at every level of ``--levels`` (state to block by default) at the
Bureau's production budget, each level at its facts-sheet share (part ``plans``), with
each plan of ``--plans``:

``tda-2020``
    the Bureau's strategy (:func:`dpdask.strategy.tda2020.tda2020_plan`);
``fitness``
    dpdask's best plan from part 1: the fitness plan with ``tda-2020``'s variances as
    targets, spending the Bureau's budget of the level;

and each estimator of ``--methods``:

``ls``
    bottom-up least squares;
``topdown`` (``topdown-int``: integer)
    today's top-down, no invariants, no constraints;
``multipass`` (``multipass-int``: integer)
    the multi-pass top-down (``passes="default"``) with the invariants and
    constraints a spec states (:data:`INVARIANTS`, :data:`CONSTRAINTS`: the state's
    total, the blocks' housing units and facilities, nobody in a block with no housing
    unit and no facility), built as ``dpdask run`` builds them
    (:func:`~dpdask.pipeline.invariants.checked_constraints`).

Every release is in test mode with the test key ``k`` and run id ``census-k`` for
``k`` in ``0 .. --keys - 1``: within a key every estimator and plan sees the same key
(so the fractional and integer multi-pass releases fit the same measurements).

Reported: ``runs``, one row per plan, method and key: wall time of the release
(``to_zarr``), the state total's error, the persons the release puts in blocks with no
housing unit and no facility (``empty_block_persons``; ``empty_blocks_filled`` of them
with a non-zero total), for ``multipass-int`` the largest ``|integer block total -
fractional block total|`` of the release's own fits (``block_vs_fractional``: each
family's integer blocks against the fractional fit they were rounded from, in the same
task, the release summary's ``rounding_gap``), per level the total-population MAE and RMSE,
``large_graph``, the size of the graph sent to the scheduler when Dask warned it was
large, ``peak_worker_rss_gib``, the largest worker's peak resident memory during the
release, and ``peak_client_rss_gib``, this process's (the client and the embedded
cluster's scheduler; both sampled). ``accuracy``, one row per plan and level: the median
over keys of each method's total-population MAE and RMSE against the truth, the standard
deviation of the level's total as the Bureau measures it (``sd_total_tda``, part 1) and
as the plan answers it (``sd_total_plan``), and the verdict ``multipass_ok``: each
multi-pass MAE at most the smaller of ``ls``'s and ``topdown``'s. ``methods``, one row
per plan and method: the median wall time, the largest state-total error, empty-block
persons and rounding gap over keys.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import re
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["CONSTRAINTS", "INVARIANTS", "METHODS", "PLANS", "add_compare_arguments", "run_compare"]

METHODS = ("ls", "topdown", "topdown-int", "multipass", "multipass-int")
PLANS = ("tda-2020", "fitness")
#: the counts published exactly, as a spec's ``invariants:`` states them
INVARIANTS: dict[str, list[str]] = {"state": ["total"], "block": ["housing_units", "gq_facilities"]}
#: the constraints, as a spec's ``constraints:`` states them
CONSTRAINTS: dict[str, Any] = {"empty_units": True}
_MULTIPASS = ("multipass", "multipass-int")
_BASELINES = ("ls", "topdown")


def _names(text: str, known: tuple[str, ...], option: str) -> list[str]:
    from dpdask.errors import ArgumentError

    names = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ArgumentError(f"{option}: {bad or text!r} not among {list(known)}")
    return list(dict.fromkeys(names))


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--part compare``."""
    add = parser.add_argument
    add("--blocks", type=int, default=25_000, help="compare: blocks of the synthetic state")
    add("--persons", type=int, default=1_000_000, help="compare: persons of the state")
    add("--keys", type=int, default=3, help="compare: test noise keys (releases per method)")
    add("--seed", type=int, default=0, help="compare: the data's seed")
    add("--plans", default=",".join(PLANS), help=f"compare: plans, comma list of {PLANS}")
    add("--methods", default="ls,topdown,multipass,multipass-int",
        help=f"compare: estimators, comma list of {METHODS}")  # fmt: skip
    add("--workers", type=int, default=2, help="compare: local worker processes")
    add("--memory-limit", default="4GiB", help="compare: per-worker memory limit")
    add("--workdir", default=None, help="compare: data folder (default temp); data reused")


@contextlib.contextmanager
def workdir(args: argparse.Namespace) -> Iterator[pathlib.Path]:
    """``--workdir`` (made if missing, kept), or a temporary folder removed afterwards."""
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="dpdask-census-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def empty_blocks(store: Any) -> np.ndarray:
    """The finest units with no housing unit and no facility (the empty-block
    constraint puts nobody there)."""
    hu, fac = store.unit_attribute("housing_units"), store.unit_attribute("gq_facilities")
    return np.asarray((hu == 0) & (fac.sum(axis=1) == 0))


def _spec(args: argparse.Namespace, root: pathlib.Path) -> Any:
    """The spec whose data, invariants and constraints the comparison releases."""
    from dpdask.pipeline.spec import parse_spec

    raw = {
        "release": "bench-census-compare",
        "data": {
            "format": "synthetic-blocks",
            "blocks": args.blocks,
            "persons": args.persons,
            "seed": args.seed,
            "id": "bench-census-compare",
        },
        "domain": "pl94-full",
        "levels": list(args.levels),
        "workload": "pl94-full",
        "privacy": {"zcdp": 1},  # unused: each level's plan carries its budget
        "strategy": "tda-2020",
        "reconstruct": "topdown",
        "invariants": INVARIANTS,
        "constraints": CONSTRAINTS,
        "output": str(root / "unused.zarr"),
    }
    return parse_spec(raw, base=root)


def _plans(
    names: list[str], levels: list[str], persons: Any, dtype: Any, bound: int
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, dict[str, float]],
           dict[str, float]]:  # fmt: skip
    """Per plan name, each level's plan at the Bureau's level budget, and the same with
    its noise as drawn for data of ``dtype`` under the public bound ``bound`` on a total;
    the level total's standard deviation (the Bureau's measurement, the plan's drawn
    answer); selection times."""
    from dpdask import census
    from dpdask.graph import level_plans
    from dpdask.strategy import select
    from dpdask.strategy.tda2020 import level_budget
    from dpdask.workloads.pl94_full import PL94_FULL_GROUPS, pl94_full

    W, domain = pl94_full(), census.pl94_full_domain()
    total = PL94_FULL_GROUPS.index("total")  # one query: the group's first row
    plans: dict[str, dict[str, Any]] = {n: {} for n in names}
    sd: dict[str, dict[str, float]] = {n: {} for n in [*names, "bureau"]}
    seconds: dict[str, float] = dict.fromkeys(names, 0.0)
    for lv in levels:
        budget = level_budget(persons, lv)
        tda = select(W, budget, "tda-2020", domain=domain, level=lv)
        sd["bureau"][lv] = float(np.sqrt(tda.query_variances()[total]))  # nominal
        for name in names:
            t0 = time.perf_counter()
            if name == "tda-2020":
                plan = tda
            else:
                plan = select(W, budget, "fitness", domain=domain, targets="tda-2020", level=lv)
            seconds[name] += time.perf_counter() - t0
            plans[name][lv] = plan
    drawn = {  # as the releases draw them (a float strategy: on the lattice)
        name: level_plans(plans[name], levels, dtype=dtype, max_total=bound) for name in names
    }
    for name in names:
        for lv in levels:
            sd[name][lv] = float(np.sqrt(drawn[name][lv].query_variances()[total]))
    return plans, drawn, sd, seconds


def _graph_size(caught: list[warnings.WarningMessage]) -> str | None:
    """The size of the graph sent to the scheduler when Dask warns it is large (a figure
    of the run); every other warning is raised again."""
    size = None
    for w in caught:
        found = re.search(
            r"Sending large graph of size (\S+ \S+?)\.?$", str(w.message).split("\n")[0]
        )
        if found and issubclass(w.category, UserWarning):
            size = found[1]
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return size


def _release(
    method: str, plans: dict[str, Any], store: Any, levels: list[str], key: int, cons: Any,
    out: Any, client: Any, bound: int,
) -> tuple[float, str | None, dict[str, np.ndarray], float | None]:  # fmt: skip
    """One release (published to ``out``, then removed): its wall time, the size of its
    graph if Dask warned it was large, each level's published unit totals and (integer
    multi-pass) the finest level's rounding gap from the release's summary."""
    from dpdask.graph import release
    from dpdask.noise import SecretKey
    from dpdask.publish import remove_work, work_dir
    from dpdask_benchmarks.topdown import _published_totals

    run_id = f"census-{key}"
    base = method.removesuffix("-int")
    extra: dict[str, Any] = {}
    if base == "multipass":
        extra = {"passes": "default", "constraints": cons.lazy(),
                 "invariants": cons.statement()}  # fmt: skip
    work = work_dir(out, run_id)
    shutil.rmtree(out, ignore_errors=True)
    remove_work(work)  # never resume a stale run
    try:
        rel = release(
            plans, store, levels=levels, reconstruct="ls" if base == "ls" else "topdown",
            integer=method.endswith("-int"), release_id="bench-census", run_id=run_id,
            test_mode=True, key=SecretKey.for_testing(key), simulate=0, max_total=bound, **extra,
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            rel.to_zarr(out, client=client)
            wall = time.perf_counter() - t0
        graph = _graph_size(caught)
        geo = store.geography
        gap = rel.summary().get("rounding_gap", {}).get(levels[-1])  # the rounder's, per fit
        totals = _published_totals(out, {lv: geo.n_units(lv) for lv in levels})
        return wall, graph, totals, gap
    finally:
        shutil.rmtree(out, ignore_errors=True)
        remove_work(work)


def _run_row(
    plan: str,
    method: str,
    key: int,
    wall: float,
    est: dict[str, Any],
    truth: dict[str, Any],
    empty: np.ndarray,
) -> dict[str, Any]:
    top, *_, finest = truth
    blocks = est[finest]
    row: dict[str, Any] = {
        "plan": plan,
        "method": method,
        "key": key,
        "wall_s": wall,
        "state_total_error": float(est[top].sum() - truth[top].sum()),
        "empty_block_persons": float(blocks[empty].sum()),
        "empty_blocks_filled": int(np.count_nonzero(np.abs(blocks[empty]) > 1e-6)),
    }
    for lv, t in truth.items():
        row[f"mae_{lv}"] = float(np.abs(est[lv] - t).mean())
        row[f"rmse_{lv}"] = float(np.sqrt(((est[lv] - t) ** 2).mean()))
    return row


def _accuracy(
    runs: list[dict[str, Any]],
    plans: list[str],
    methods: list[str],
    levels: list[str],
    sd: dict[str, dict[str, float]],
) -> list[dict[str, Any]]:
    """Per plan and level: each method's median MAE and RMSE over keys, the noise, the
    verdict."""
    out = []
    for plan in plans:
        for lv in levels:
            row: dict[str, Any] = {"plan": plan, "level": lv,
                                   "sd_total_tda": sd["bureau"][lv],
                                   "sd_total_plan": sd[plan][lv]}  # fmt: skip
            for m in methods:
                mine = [r for r in runs if r["plan"] == plan and r["method"] == m]
                row[f"mae_{m}"] = statistics.median(r[f"mae_{lv}"] for r in mine)
                row[f"rmse_{m}"] = statistics.median(r[f"rmse_{lv}"] for r in mine)
            base = [row[f"mae_{m}"] for m in _BASELINES if m in methods]
            mp = [row[f"mae_{m}"] for m in _MULTIPASS if m in methods]
            row["multipass_ok"] = max(mp) <= min(base) if mp and base else None
            out.append(row)
    return out


def _summary(
    runs: list[dict[str, Any]], plans: list[str], methods: list[str]
) -> list[dict[str, Any]]:
    out = []
    for plan in plans:
        for m in methods:
            mine = [r for r in runs if r["plan"] == plan and r["method"] == m]
            gaps = [r["block_vs_fractional"] for r in mine if "block_vs_fractional" in r]
            out.append(
                {
                    "plan": plan,
                    "method": m,
                    "wall_s_median": statistics.median(r["wall_s"] for r in mine),
                    "state_total_error_max": max(abs(r["state_total_error"]) for r in mine),
                    "empty_block_persons_max": max(abs(r["empty_block_persons"]) for r in mine),
                    "block_vs_fractional_max": max(gaps) if gaps else None,
                    "peak_worker_rss_gib_max": max(
                        (r.get("peak_worker_rss_gib", 0.0) for r in mine), default=0.0
                    ),
                    "peak_client_rss_gib_max": max(
                        (r.get("peak_client_rss_gib", 0.0) for r in mine), default=0.0
                    ),
                }
            )
    return out


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Release the synthetic state with every plan, method and key; the figures."""
    from dpdask.errors import ArgumentError
    from dpdask.pipeline.invariants import checked_constraints
    from dpdask.pipeline.run import load_data
    from dpdask.privacy import zCDP
    from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, convert
    from dpdask_benchmarks.release import _cluster, _WorkerPeaks
    from dpdask_benchmarks.topdown import _truth_totals

    plans_ = _names(args.plans, PLANS, "--plans")
    chosen = _names(args.methods, METHODS, "--methods")
    methods = [m for m in METHODS if m in chosen]  # multipass before multipass-int
    if args.keys < 1:
        raise ArgumentError(f"--keys: expected a positive integer, got {args.keys}")
    if "us" in args.levels:
        raise ArgumentError("--levels: a synthetic state has no 'us' level")
    levels = list(args.levels)
    persons = convert(zCDP(args.rho_change_one), CHANGE_ONE, ADD_REMOVE)
    with workdir(args) as root:
        spec = _spec(args, root)
        with _cluster(args.workers, args.memory_limit) as (client, pids):
            t0 = time.perf_counter()
            store = load_data(spec, root / "work")
            t_data = time.perf_counter() - t0
            geo = store.geography
            cons = checked_constraints(spec, store, levels)
            every = _truth_totals(store)
            truth = {lv: every[lv] for lv in levels}  # coarsest first
            empty = empty_blocks(store)
            bound = int(truth[levels[0]].max())  # public: the state's total is an invariant
            plans, _, sd, t_select = _plans(plans_, levels, persons, store.dtype, bound)
            runs: list[dict[str, Any]] = []
            out = root / "out.zarr"
            for plan in plans_:
                for key in range(args.keys):
                    for m in methods:
                        with _WorkerPeaks([*pids, os.getpid()]) as peaks:
                            wall, graph, est, gap = _release(
                                m, plans[plan], store, levels, key, cons, out, client, bound
                            )
                        row = _run_row(plan, m, key, wall, est, truth, empty)
                        row["large_graph"] = graph
                        row["peak_worker_rss_gib"] = max(peaks.peaks[p] for p in pids) / 2**30
                        row["peak_client_rss_gib"] = peaks.peaks[os.getpid()] / 2**30
                        if gap is not None:
                            row["block_vs_fractional"] = float(gap)
                        runs.append(row)
        accuracy = _accuracy(runs, plans_, methods, levels, sd)
        return {
            "part": "compare",
            "blocks": args.blocks,
            "persons": int(truth[levels[0]].sum()),
            "levels": levels,
            "units": {lv: geo.n_units(lv) for lv in levels},
            "empty_blocks": int(empty.sum()),
            "keys": args.keys,
            "seed": args.seed,
            "workers": args.workers,
            "persons_rho_change_one": float(zCDP(args.rho_change_one).rho),
            "persons_rho_add_remove": float(persons.rho),  # type: ignore[attr-defined]
            "invariants": cons.statement() if cons is not None else None,
            "data_s": t_data,
            "select_s": t_select,
            "verdict": all(r["multipass_ok"] is not False for r in accuracy),
            "accuracy": accuracy,
            "methods": _summary(runs, plans_, methods),
            "runs": runs,
        }
