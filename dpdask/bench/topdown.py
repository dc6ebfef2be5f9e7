"""``dpdask bench topdown``: top-down against bottom-up estimation on synthetic data.

One synthetic state > county > tract hierarchy (``--geographies`` tracts, ten per
county) with known truth (:mod:`dpdask.datasets`), one plan, one budget and one fixed
test key; the release is run with least squares (``ls``), bottom-up NNLS (``nnls``) and
top-down (``topdown``, with ``--integer`` the integer variant) on a local cluster of
``--workers`` single-threaded workers. Reported:

* ``runs``: the wall time and peak worker memory of each release;
* ``ratio_topdown_over_ls`` (and ``ratio_nnls_over_ls``): wall time, same run;
* ``accuracy``: per level, the realised root-mean-square error of the published
  workload answers against the truth's (``rmse_topdown``, ``rmse_bottomup_nnls``,
  ``rmse_ls``), and ``topdown_over_nnls``.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
import time
from typing import Any

import numpy as np

__all__ = ["add_arguments", "run"]

_WORKLOADS = {"pl94": "pl94", "cph": "sf1-persons"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--geographies", type=int, default=600, help="tracts (10 per county)")
    parser.add_argument(
        "--domain", default="pl94", choices=sorted(_WORKLOADS), help="P.L. 94 or CPH persons"
    )
    parser.add_argument("--population", type=float, default=4000.0, help="mean per tract")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--memory-limit", default="4GiB", help="per-worker memory limit")
    parser.add_argument("--methods", default="ls,nnls,topdown", help="estimators to run")
    parser.add_argument("--integer", action="store_true", help="integer top-down output")
    parser.add_argument("--workdir", default=None, help="where to put data (default: temp)")
    parser.add_argument("--seed", type=int, default=0, help="data seed and test key")


def _geography(n_tracts: int, per_county: int = 10) -> Any:
    from dpdask import Geography

    n_counties = max(1, -(-n_tracts // per_county))
    county = np.minimum(np.arange(n_tracts) // per_county, n_counties - 1)
    ids = (
        ("01",),
        tuple(f"01{c:03d}" for c in range(n_counties)),
        tuple(f"01{c:03d}{t:06d}" for t, c in enumerate(county)),
    )
    return Geography(
        levels=("state", "county", "tract"),
        ids=ids,
        parents=(np.zeros(n_counties, dtype=np.int64), county.astype(np.int64)),
    )


def _data(root: pathlib.Path, args: argparse.Namespace) -> Any:
    from dpdask.census import cph_domain, pl94_domain
    from dpdask.dataflow import adopt_array
    from dpdask.datasets import synthetic_persons

    domain = pl94_domain() if args.domain == "pl94" else cph_domain()
    n = int(args.geographies)
    syn = synthetic_persons(
        domain, n, root / "raw.zarr", seed=args.seed, population=args.population
    )
    return adopt_array(syn.array, domain, _geography(n), root / "in.zarr")


def _truth_answers(store: Any, W: Any) -> dict[str, np.ndarray]:
    geo = store.geography
    counts = np.asarray(store.to_dask().compute(), dtype=np.float64)
    out = {}
    for lv in geo.levels:
        if lv == geo.levels[-1]:
            t = counts
        else:
            t = np.zeros((geo.n_units(lv), *counts.shape[1:]))
            np.add.at(t, geo.ancestor_index(lv), counts)
        out[lv] = np.asarray(W.apply(t.reshape(t.shape[0], -1)))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import zarr
    from distributed import get_task_stream

    from dpdask.bench.release import _cluster, _WorkerPeaks, task_seconds
    from dpdask.dataflow.release import release
    from dpdask.noise import SecretKey
    from dpdask.privacy import zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import build_workload

    own = args.workdir is None
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="dpdask-topdown-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        store = _data(root, args)
        t_data = time.perf_counter() - t0
        W = build_workload({"name": _WORKLOADS[args.domain]}, store.domain)
        plan = select(W, zCDP(1), strategy="hdmm", domain=store.domain)
        truth = _truth_answers(store, W)
        levels = store.geography.levels
        runs, rmse = [], {}
        for method in str(args.methods).split(","):
            out = root / f"out-{method}.zarr"
            shutil.rmtree(out, ignore_errors=True)
            integer = bool(args.integer) and method == "topdown"
            with _cluster(args.workers, args.memory_limit) as (client, pids):
                rel = release(
                    plan, store, budget_split=[1, 1, 2], reconstruct=method, integer=integer,
                    release_id="bench", test_mode=True, key=SecretKey.for_testing(args.seed),
                )  # fmt: skip
                with _WorkerPeaks(pids) as peaks, get_task_stream(client) as stream:
                    t0 = time.perf_counter()
                    rel.to_zarr(out, client=client)
                    wall = time.perf_counter() - t0
            g = zarr.open_group(str(out), mode="r")
            rmse[method] = {
                lv: float(np.sqrt(np.mean((g[lv]["answers"][:] - truth[lv]) ** 2))) for lv in levels
            }
            shutil.rmtree(out, ignore_errors=True)
            runs.append(
                {
                    "reconstruct": method,
                    "integer": integer,
                    "wall_s": wall,
                    "peak_worker_rss_gib": max(peaks.peaks.values()) / 2**30,
                    "task_seconds": task_seconds(stream.data),
                }
            )
        wall = {r["reconstruct"]: r["wall_s"] for r in runs}
        result: dict[str, Any] = {
            "domain": args.domain,
            "levels": list(levels),
            "units": {lv: store.geography.n_units(lv) for lv in levels},
            "cells": int(store.geography.n_units(levels[-1]) * store.domain.size),
            "workers": args.workers,
            "data_generation_s": t_data,
            "runs": runs,
        }
        for method in ("topdown", "nnls"):
            if method in wall and "ls" in wall:
                result[f"ratio_{method}_over_ls"] = wall[method] / wall["ls"]
        result["accuracy"] = [
            {
                "level": lv,
                **{
                    f"rmse_{name}": rmse[m][lv]
                    for m, name in (("topdown", "topdown"), ("nnls", "bottomup_nnls"), ("ls", "ls"))
                    if m in rmse
                },
            }
            for lv in levels
        ]
        for row in result["accuracy"]:
            if "rmse_topdown" in row and "rmse_bottomup_nnls" in row:
                row["topdown_over_nnls"] = row["rmse_topdown"] / row["rmse_bottomup_nnls"]
        return result
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
