"""``dpdask bench topdown``: top-down against bottom-up estimation on synthetic data.

A synthetic hierarchy (``--levels``, top first; ``--geographies`` finest units,
``--fanout`` children per parent of each level below the top, decimals being
averages; by default one state, ten tracts per county), its synthetic Census-like
counts written straight into a data store (:func:`dpdask.store.synthetic_store`,
sparse by default: memory and disk grow with the persons, not cells x units), one
budget (zCDP, rho = 1) and one fixed test key; the release is run with least squares
(``ls``), bottom-up NNLS (``nnls``), top-down (``topdown``, with ``--integer`` the
integer variant) and the multi-pass top-down (``multipass``: ``--passes``, ``--slack``,
with ``--total-invariant`` the top level's total published exactly) on a local cluster
of ``--workers`` single-threaded workers. Every
estimator gets the same noise (one run id); a store made in ``--workdir`` is reused by
a later run with the same data options.

Populations of the finest units: lognormal like US counties with median
``--population`` (:func:`dpdask.datasets.draw_populations`), or, with ``--persons
TOTAL``, exactly TOTAL persons shared in proportion to lognormal weights of log-sd
``--spread`` (0.5: tracts of similar sizes) after a random fraction ``--empty`` of the
units is left with no one; for blocks, ``--spread 1 --empty 0.3`` gives many small
blocks, some large ones and about 30% empty.

Workloads: ``--workload`` at every level (default the domain's: ``pl94`` or
``sf1-persons``), ``--level-workload LEVEL=NAME[:k=v,...]`` overriding one level (e.g.
``tract=marginals:k=1``: detailed tables at the state, a few marginals at the
tracts). With one workload, one plan (HDMM) whose budget is split by ``budget_split``;
with overrides, a plan per level (HDMM, each for its level's share). Either way the
shares are equal but for the finest level's, which is double (``[1, 1, 2]`` for three
levels). ``--template`` restricts HDMM's templates: least squares and NNLS weigh
per-level plans by each strategy's mean cell variance, which for now is formed densely
unless the strategy is a Kronecker product, so per-level CPH plans need ``--template
kron`` for ``ls`` and ``nnls`` (top-down does not weigh levels).

With ``--families N`` no release is run: N block-group families of constrained blocks
are fitted and rounded, timed against the earlier linear algebra
(:mod:`dpdask_benchmarks._family_fits`).

Reported:

* ``persons``, ``entries`` (the store's non-zero counts; ``entries_by_level``),
  ``units`` per level, ``cells`` (finest units x domain cells), ``workloads``,
  ``queries`` and ``strategies`` per level, ``budget_shares``, ``data_generation_s``
  (``null`` when the store was reused), ``select_s``;
* ``runs``: per estimator the wall time, peak worker memory and seconds of
  computation by task prefix of the release, and ``truth_s`` (the error pass);
* ``ratio_topdown_over_ls`` (and ``ratio_nnls_over_ls``): wall time, same run;
* ``total_mae``: per estimator and level, the mean absolute error of the units' total
  population (the published estimates' row sums against the truth's);
* ``accuracy``: per level, the realised root-mean-square error of the published
  workload ``answers`` against the truth's (``rmse_topdown``, ``rmse_bottomup_nnls``,
  ``rmse_ls``) and ``topdown_over_nnls``. The truth is computed after each release
  chunk by chunk (:func:`dpdask_benchmarks._topdown_data.level_errors`), never a whole
  level at once, and only the sums of squares are kept.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import tempfile
import time
from typing import Any

from dpdask_benchmarks._family_fits import add_family_arguments, run_families
from dpdask_benchmarks._topdown_data import (
    hierarchy,
    level_errors,
    parse_fanout,
    parse_workload,
    spread_populations,
)

__all__ = ["add_arguments", "run"]

_WORKLOADS = {"pl94": "pl94", "cph": "sf1-persons"}
_NAMES = (
    ("topdown", "topdown"), ("multipass", "multipass"), ("nnls", "bottomup_nnls"), ("ls", "ls"),
)  # fmt: skip


def _level_workload(text: str) -> tuple[str, dict[str, Any]]:
    level, eq, spec = text.partition("=")
    if not eq or not level.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not LEVEL=NAME[:k=v,...]")
    try:
        return level.strip(), parse_workload(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workload(text: str) -> dict[str, Any]:
    try:
        return parse_workload(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--geographies", type=int, default=600, help="units of the finest level")
    add("--domain", default="pl94", choices=sorted(_WORKLOADS), help="P.L. 94 or CPH persons")
    add("--levels", default="state,county,tract", help="level names, top first (comma list)")
    add("--simulate", type=int, default=0,
        help="trials of the simulated RMSE per release (default 0: the fit alone)")  # fmt: skip
    add(
        "--fanout", default=None,
        help="children per parent of each level below the top, top first (comma list; "
        "decimals are averages; the first may be * for one top unit; default *,10,...)",
    )  # fmt: skip
    add(
        "--population", type=float, default=4000.0,
        help="median population of the finest units (lognormal, log-sd 1.66 as US counties)",
    )  # fmt: skip
    add("--persons", type=int, default=None, help="total persons instead (see --spread)")
    add("--spread", type=float, default=0.5, help="log-sd of unit sizes with --persons")
    add("--empty", type=float, default=0.0, help="share of empty finest units with --persons")
    add(
        "--workload", type=_workload, default=None,
        help="workload of every level, NAME[:k=v,...] (default: pl94 or sf1-persons)",
    )  # fmt: skip
    add(
        "--level-workload", type=_level_workload, action="append", default=None,
        metavar="LEVEL=NAME[:k=v,...]",
        help="one level's workload (repeatable), e.g. tract=marginals:k=1",
    )  # fmt: skip
    add(
        "--template", default=None,
        help="HDMM templates to try (comma list of pidentity, kron, union, marginals, identity; "
        "default all); kron keeps ls and nnls with per-level CPH plans within memory",
    )  # fmt: skip
    add("--layout", default="sparse", choices=("sparse", "dense"), help="data store layout")
    add("--workers", type=int, default=2, help="local worker processes")
    add("--memory-limit", default="4GiB", help="per-worker memory limit")
    add("--methods", default="ls,nnls,topdown", help="estimators to run (comma list)")
    add("--integer", action="store_true", help="integer top-down output")
    add(
        "--passes",
        default="default",
        help="multipass: 'default' (total, then the rest) or workload query groups (comma list)",
    )
    add("--slack", type=float, default=0.0, help="multipass: slack of earlier passes' answers")
    add("--total-invariant", action="store_true",
        help="multipass: the top level's total published exactly (an invariant)")  # fmt: skip
    add("--workdir", default=None, help="where to put data (default: temp); a store is reused")
    add("--seed", type=int, default=0, help="data seed and test key")
    add_family_arguments(parser)


def _setup(args: argparse.Namespace) -> tuple[Any, Any, dict[str, dict], list[int]]:
    """Domain, geography, each level's workload spec and the budget shares."""
    from dpdask.census import cph_domain, pl94_domain

    levels = [s.strip() for s in str(args.levels).split(",") if s.strip()]
    geo = hierarchy(levels, parse_fanout(args.fanout, len(levels)), args.geographies)
    domain = pl94_domain() if args.domain == "pl94" else cph_domain()
    base = args.workload or {"name": _WORKLOADS[args.domain]}
    specs = {lv: dict(base) for lv in levels}
    for lv, spec in args.level_workload or ():
        if lv not in specs:
            raise ValueError(f"--level-workload: no level {lv!r} in --levels {levels}")
        specs[lv] = spec
    return domain, geo, specs, [1] * (len(levels) - 1) + [2]


def _data(root: pathlib.Path, args: argparse.Namespace, domain: Any, geo: Any) -> Any:
    """The synthetic store (reused from ``--workdir`` when the same data was made)."""
    from dask.base import tokenize

    from dpdask.datasets import draw_populations
    from dpdask.store import open_store, synthetic_store

    n = geo.n_units()
    if args.persons is not None:
        pops = spread_populations(
            n, args.persons, sigma=args.spread, empty=args.empty, seed=args.seed
        )
    else:
        pops = draw_populations(n, seed=args.seed, population=args.population)
    # the ids follow from the levels and parents: no need to hash millions of strings
    shape = (geo.levels, [p.tobytes() for p in geo.parents], geo.n_units(geo.levels[0]))
    path = root / f"store-{tokenize(domain.to_dict(), shape, pops, args.seed, args.layout)}.zarr"
    if path.exists():
        return open_store(path), pops, None
    t0 = time.perf_counter()
    store = synthetic_store(path, domain, geo, population=pops, seed=args.seed, layout=args.layout)
    return store, pops, time.perf_counter() - t0


def _plans(
    specs: dict[str, dict], shares: list[int], domain: Any, template: str | None
) -> tuple[Any, dict, Any]:
    """The release's plans (one, or a mapping per level), each level's workload, the split."""
    from dpdask.privacy import split_levels, zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import build_workload

    templates = None if not template else [t.strip() for t in template.split(",") if t.strip()]

    def plan(spec: dict, budget: Any) -> Any:
        W = build_workload(spec, domain)
        return select(W, budget, strategy="hdmm", domain=domain, templates=templates)

    levels = list(specs)
    if len({json.dumps(s, sort_keys=True) for s in specs.values()}) == 1:
        one = plan(specs[levels[0]], zCDP(1))
        return one, dict.fromkeys(levels, one), shares
    budgets = split_levels(zCDP(1), levels, shares)
    plans = {lv: plan(specs[lv], budgets[lv]) for lv in levels}
    return plans, plans, None


def _release(
    method: str, args: argparse.Namespace, store: Any, plans: Any, split: Any, workloads: dict
) -> tuple[dict[str, Any], dict[str, dict]]:
    """One release on a fresh cluster, then its errors; the output is removed."""
    from distributed import get_task_stream

    from dpdask.graph import release
    from dpdask.noise import SecretKey
    from dpdask.publish import remove_work, work_dir
    from dpdask_benchmarks.release import _cluster, _WorkerPeaks, task_seconds

    out = pathlib.Path(store.path).parent / f"out-{method}.zarr"
    run_id = f"bench-{args.seed}"  # one run id: every estimator sees the same noise
    work = work_dir(out, run_id)
    shutil.rmtree(out, ignore_errors=True)
    remove_work(work)  # never resume a stale run
    integer = bool(args.integer) and method in ("topdown", "multipass")
    extra = _multipass_options(args, store) if method == "multipass" else {}
    try:
        with _cluster(args.workers, args.memory_limit) as (client, pids):
            rel = release(
                plans, store, budget_split=split, integer=integer, release_id="bench",
                run_id=run_id, test_mode=True, key=SecretKey.for_testing(args.seed),
                simulate=args.simulate,
                reconstruct="topdown" if method == "multipass" else method, **extra,
            )  # fmt: skip
            with _WorkerPeaks(pids) as peaks, get_task_stream(client) as stream:
                t0 = time.perf_counter()
                rel.to_zarr(out, client=client)
                wall = time.perf_counter() - t0
            t0 = time.perf_counter()
            errors = level_errors(store, workloads, {method: out})
            mae = _total_mae(store, out)
            t_truth = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
        remove_work(work)
    row = {
        "reconstruct": method,
        "integer": integer,
        "wall_s": wall,
        "peak_worker_rss_gib": max(peaks.peaks.values()) / 2**30,
        "task_seconds": task_seconds(stream.data),
        "truth_s": t_truth,
        "total_mae": mae,
    }
    return row, errors


def _truth_totals(store: Any) -> dict[str, Any]:
    """Every level's units' true total population."""
    import numpy as np

    geo = store.geography
    x = store.to_sparse((geo.n_units(),))
    x = x.sum(axis=tuple(range(1, x.ndim)))
    tot = {geo.levels[-1]: np.asarray(x.compute().todense(), dtype=float).reshape(-1)}
    for depth in range(len(geo.levels) - 1, 0, -1):
        up = np.zeros(geo.n_units(geo.levels[depth - 1]))
        np.add.at(up, geo.parents[depth - 1], tot[geo.levels[depth]])
        tot[geo.levels[depth - 1]] = up
    return tot


def _published_totals(out: str | pathlib.Path, sizes: dict[str, int]) -> dict[str, Any]:
    """Per level (``sizes``: its units), the published units' total population: the row
    sums of a release's estimates, dense levels or entries."""
    import numpy as np
    import zarr

    root = zarr.open_group(str(out), mode="r")
    est = {}
    for lv, n in sizes.items():
        g = root[lv]
        if "entry_offsets" in g:
            est[lv] = np.bincount(g["entry_geography"][:], g["estimate"][:], minlength=n)
        else:
            est[lv] = np.asarray(g["estimate"][:], dtype=float).reshape(n, -1).sum(axis=1)
    return est


def _total_mae(store: Any, out: pathlib.Path) -> dict[str, float]:
    """Per level, the mean absolute error of the published units' totals."""
    import numpy as np

    truth = _truth_totals(store)
    est = _published_totals(out, {lv: t.size for lv, t in truth.items()})
    return {lv: float(np.abs(est[lv] - t).mean()) for lv, t in truth.items()}


def _multipass_options(args: argparse.Namespace, store: Any) -> dict[str, Any]:
    """The multi-pass release's passes, slack and (``--total-invariant``) the top
    level's total as an invariant (from the truth: a public count in a benchmark)."""
    import numpy as np

    from dpdask.reconstruct.topdown import Constraints

    text = str(args.passes)
    passes: Any = text if text == "default" else [g.strip() for g in text.split(",") if g]
    out: dict[str, Any] = {"passes": passes, "slack": float(args.slack)}
    if args.total_invariant:
        top = store.geography.levels[0]
        t = _truth_totals(store)[top][:, None]
        n = store.domain.size
        out["constraints"] = {
            top: Constraints.none(t.shape[0], n).with_queries(np.ones((1, n)), t, t, ["total"])
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.families:  # constrained block families alone (_family_fits)
        return run_families(args)
    from dpdask_benchmarks.release import _cluster

    domain, geo, specs, shares = _setup(args)
    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    levels = geo.levels
    own = args.workdir is None
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="dpdask-topdown-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        with _cluster(args.workers, args.memory_limit):
            store, pops, t_data = _data(root, args, domain, geo)
        t0 = time.perf_counter()
        plans, by_level, split = _plans(specs, shares, domain, args.template)
        workloads = {lv: p.workload for lv, p in by_level.items()}
        t_select = time.perf_counter() - t0
        runs, rmse, entries = [], {}, {}
        total_mae: dict[str, dict[str, float]] = {}
        for method in methods:
            row, errors = _release(method, args, store, plans, split, workloads)
            runs.append(row)
            total_mae[method] = row["total_mae"]
            rmse[method] = {
                lv: (e["sse"][method] / max(1, e["values"])) ** 0.5 for lv, e in errors.items()
            }
            entries = {lv: e["entries"] for lv, e in errors.items()}
        result: dict[str, Any] = {
            "domain": args.domain,
            "layout": store.layout,
            "levels": list(levels),
            "units": {lv: geo.n_units(lv) for lv in levels},
            "persons": int(pops.sum()),
            "entries": store.nnz if store.nnz is not None else entries.get(levels[-1]),
            "entries_by_level": entries,
            "cells": int(geo.n_units() * domain.size),
            "workloads": specs,
            "queries": {lv: int(W.shape[0]) for lv, W in workloads.items()},
            "plans": "per level" if split is None else "one, budget_split",
            "strategies": {lv: p.template for lv, p in by_level.items()},
            "budget_shares": dict(zip(levels, shares, strict=True)),
            "workers": args.workers,
            "data_generation_s": t_data,
            "data_reused": t_data is None,
            "select_s": t_select,
            "runs": runs,
            "total_mae": total_mae,
        }
        wall = {r["reconstruct"]: r["wall_s"] for r in runs}
        for method in ("topdown", "nnls"):
            if method in wall and "ls" in wall:
                result[f"ratio_{method}_over_ls"] = wall[method] / wall["ls"]
        result["accuracy"] = [
            {"level": lv, **{f"rmse_{name}": rmse[m][lv] for m, name in _NAMES if m in rmse}}
            for lv in levels
        ]
        for row in result["accuracy"]:
            if "rmse_topdown" in row and "rmse_bottomup_nnls" in row and row["rmse_bottomup_nnls"]:
                row["topdown_over_nnls"] = row["rmse_topdown"] / row["rmse_bottomup_nnls"]
        return result
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
