"""``dpdask bench release``: a county-level CPH-domain release end to end.

Synthetic Census-like data of G geographies (``--geographies``; 3,143 is the national
county release, 1.55e9 cells) is generated once, then released (measure,
reconstruct, make consistent across state and county, answer SF1, publish) on a
local cluster of 1 and/or 2 single-threaded workers. Reported: wall time, cells per
second (and per core), the peak resident memory of the largest worker, and the
seconds of computation of the largest task prefixes (for NNLS, the
``nonnegative-county`` fits).

The release runs in test mode (a fixed test key, no ledger): this is a benchmark,
not a publication.

A second, small case (``--union-geographies``, default 51: the states) releases the
same kind of data with HDMM's OPT_+ strategy (a union of two Kronecker products) on
SF1, reconstructed implicitly (:class:`dpdask.reconstruct.structured.KronPairInverse`), and
times answering the SF1 workload on the published estimates of those geographies
(median of 3).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
from dask.utils import key_split
from distributed import get_task_stream

from dpdask.pipeline._data import synthetic_geography
from dpdask.pipeline.cluster import connect
from dpdask.store import open_store

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--geographies", type=int, default=200, help="counties (3143: national)")
    parser.add_argument("--states", type=int, default=None, help="states (default G / 60)")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, e.g. 1,2")
    parser.add_argument("--strategy", default="hdmm", help="strategy for dpdask.select")
    parser.add_argument(
        "--simulate", type=int, default=0, help="trials of the simulated RMSE (default 0)"
    )
    parser.add_argument(
        "--template", default="kron", help="HDMM template (kron: a Kronecker strategy)"
    )
    parser.add_argument("--restarts", type=int, default=1, help="HDMM random restarts")
    parser.add_argument("--workload", default="sf1-persons", help="workload answered")
    parser.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    parser.add_argument("--memory-limit", default="4GiB", help="per-worker memory limit")
    parser.add_argument("--chunk-mib", type=int, default=32, help="chunk size of estimates, MiB")
    parser.add_argument(
        "--reconstruct", default="ls", help="estimators to compare, e.g. ls,nnls (same data)"
    )
    parser.add_argument(
        "--union-geographies", type=int, default=51,
        help="geographies of the OPT_+ (union) case; 0 skips it",
    )  # fmt: skip


class _WorkerPeaks:
    """Samples the RSS of given processes; ``peaks`` maps pid to the largest seen."""

    def __init__(self, pids: list[int], interval: float = 0.1):
        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.peaks = dict.fromkeys(pids, 0)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid, p in self.procs.items():
                try:
                    self.peaks[pid] = max(self.peaks[pid], p.memory_info().rss)
                except psutil.Error:
                    pass
            self._stop.wait(self.interval)

    def __enter__(self) -> _WorkerPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def task_seconds(records: list[dict[str, Any]], top: int = 4) -> dict[str, float]:
    """Seconds of computation by task prefix (``dask.utils.key_split``: fused tasks
    keep the whole chain, e.g. ``rechunk-merge-...-nonnegative-county``) in a task
    stream's records, the ``top`` largest and the rest as ``"other"``."""
    total: dict[str, float] = {}
    for rec in records:
        name = key_split(rec["key"])
        for part in rec["startstops"]:
            if part["action"] == "compute":
                total[name] = total.get(name, 0.0) + part["stop"] - part["start"]
    ranked = sorted(total.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:top])
    if len(ranked) > top:
        out["other"] = sum(v for _, v in ranked[top:])
    return out


@contextlib.contextmanager
def _cluster(workers: int, memory_limit: str) -> Iterator[tuple[Any, list[int]]]:
    """The embedded local cluster (:func:`~dpdask.pipeline.cluster.connect`) with
    ``workers`` single-threaded worker processes, its client and the workers' pids."""
    with connect({"n_workers": workers, "memory_limit": memory_limit}) as client:
        yield client, list(client.run(os.getpid).values())


def _make_data(root: pathlib.Path, n: int, n_states: int) -> tuple[Any, float]:
    from dpdask.census import cph_domain
    from dpdask.datasets import synthetic_persons
    from dpdask.store import adopt_array

    domain = cph_domain()
    store_path = root / f"cph-{n}.zarr"
    if store_path.exists():
        return open_store(store_path), 0.0
    t0 = time.perf_counter()
    syn = synthetic_persons(domain, n, root / f"raw-{n}.zarr", seed=0)
    store = adopt_array(syn, domain, synthetic_geography(n, n_states), store_path)
    shutil.rmtree(root / f"raw-{n}.zarr", ignore_errors=True)
    return store, time.perf_counter() - t0


def _union_case(root: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    """OPT_+ on SF1: select, release ``--union-geographies`` units, time the answers."""
    import numpy as np
    import zarr

    from dpdask.graph import fused, release, structured_inverse
    from dpdask.noise import SecretKey
    from dpdask.privacy import zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import build_workload
    from dpdask_benchmarks._common import median_time

    n = int(args.union_geographies)
    store, _ = _make_data(root, n, 1)
    domain = store.domain
    W = build_workload({"name": args.workload}, domain)
    t0 = time.perf_counter()
    plan = select(W, zCDP(1), domain=domain, templates=["union"], restarts=args.restarts)
    t_select = time.perf_counter() - t0
    pinv = structured_inverse(plan.at(plan.privacy))
    out = root / "out-union.zarr"
    shutil.rmtree(out, ignore_errors=True)
    w = max(int(v) for v in str(args.workers).split(","))
    with _cluster(w, args.memory_limit) as (client, pids):
        rel = release(
            plan, store, levels=("state", "county"), budget_split=[1, 3],
            release_id="bench-union", test_mode=True, key=SecretKey.for_testing(1),
            chunk_bytes=args.chunk_mib * 2**20,
        )  # fmt: skip
        with _WorkerPeaks(pids) as peaks:
            t0 = time.perf_counter()
            rel.to_zarr(out, client=client)
            wall = time.perf_counter() - t0
    est = np.asarray(zarr.open_group(str(out), mode="r")["county/estimate"][:])
    t_answer, times, _ = median_time(lambda: W.apply(est))
    shutil.rmtree(out, ignore_errors=True)
    return {
        "geographies": n,
        "workers": w,
        "strategy": plan.template,
        "strategy_rows": int(plan.strategy.shape[0]),
        "pseudo_inverse": type(pinv).__name__,
        "full_column_rank": bool(getattr(pinv, "full_rank", False)),
        "fused": fused(rel.plans["county"], "ls"),
        "select_s": t_select,
        "release_wall_s": wall,
        "peak_worker_rss_gib": max(peaks.peaks.values()) / 2**30,
        "answer_workload_s": t_answer,
        "answer_workload_runs_s": times,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:

    from dpdask.graph import release
    from dpdask.noise import SecretKey
    from dpdask.privacy import zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import build_workload

    n = int(args.geographies)
    n_states = args.states or max(1, round(n / 60))
    own = args.workdir is None
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="dpdask-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        store, t_data = _make_data(root, n, n_states)
        domain = store.domain
        cells = n * domain.size
        W = build_workload({"name": args.workload}, domain)
        t0 = time.perf_counter()
        opts = (
            {"templates": [args.template], "restarts": args.restarts}
            if args.strategy == "hdmm"
            else {}
        )
        plan = select(W, zCDP(1), strategy=args.strategy, domain=domain, **opts)
        t_select = time.perf_counter() - t0
        rows = []
        runs = [
            (int(w), r)
            for r in str(args.reconstruct).split(",")
            for w in str(args.workers).split(",")
        ]
        for w, method in runs:
            out = root / f"out-{w}.zarr"
            shutil.rmtree(out, ignore_errors=True)
            with _cluster(w, args.memory_limit) as (client, pids):
                rel = release(
                    plan, store, levels=("state", "county"), budget_split=[1, 3],
                    release_id="bench", test_mode=True, key=SecretKey.for_testing(0),
                    reconstruct=method, simulate=args.simulate,
                    chunk_bytes=args.chunk_mib * 2**20,
                )  # fmt: skip
                with _WorkerPeaks(pids) as peaks, get_task_stream(client) as stream:
                    load0 = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    rel.to_zarr(out, client=client)
                    wall = time.perf_counter() - t0
                    load1 = os.getloadavg()[0]
            shutil.rmtree(out, ignore_errors=True)
            rows.append(
                {
                    "workers": w,
                    "reconstruct": method,
                    "wall_s": wall,
                    "cells_per_s": cells / wall,
                    "cells_per_s_per_core": cells / wall / w,
                    "peak_worker_rss_gib": max(peaks.peaks.values()) / 2**30,
                    # 1-minute load average of the machine before and after the run
                    "load_before_after": [load0, load1],
                    "task_seconds": task_seconds(stream.data),
                }
            )
        result: dict[str, Any] = {
            "geographies": n,
            "states": n_states,
            "cells": cells,
            "strategy": plan.template,
            "strategy_rows": int(plan.strategy.shape[0]),
            "workload_queries": int(W.shape[0]),
            "data_generation_s": t_data,
            "select_s": t_select,
            "runs": rows,
        }
        if args.union_geographies:
            result["union"] = _union_case(root, args)
        wall = {(r["workers"], r["reconstruct"]): r["wall_s"] for r in rows}
        for (w, method), t in wall.items():
            if w == 2 and (1, method) in wall:
                result[f"speedup_2_vs_1_{method}"] = wall[(1, method)] / t
            if method != "ls" and (w, "ls") in wall:
                result[f"{method}_over_ls_{w}_workers"] = t / wall[(w, "ls")]
        return result
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
