"""``dpdask bench datasets``: writing synthetic CPH histograms to zarr, time and peak memory.

Writes ``--geographies`` geographies of the CPH domain (2 x 2 x 63 x 17 x 115 =
492,660 cells each) with :func:`dpdask.datasets.synthetic_persons` to a zarr store
in a temporary directory, ``--repeats`` times with the Dask threaded scheduler and
(unless ``--no-baseline``) as many times with the plain sequential loop, the
baseline of the speed-up. Reports median wall and CPU times (CPU over wall is the
number of cores the run kept busy: on a shared machine the wall-time speed-up is
only meaningful when that is near the core count), cells per second, the peak
resident memory of the process and its children (the requirement: under 2 GB),
and the size on disk. Every store is deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from dpdask.census import cph_domain
from dpdask.datasets import synthetic_block, synthetic_persons
from dpdask_benchmarks._common import PeakRSS

__all__ = ["add_arguments", "run"]

_GB = 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--geographies", type=int, default=3000, help="number of geographies")
    parser.add_argument("--chunk", type=int, default=None, help="geographies per chunk")
    parser.add_argument("--repeats", type=int, default=1, help="runs per scheduler")
    parser.add_argument("--seed", type=int, default=0, help="data seed")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the sequential baseline runs"
    )
    parser.add_argument("--tmpdir", default=None, help="parent of the temporary store")


def _disk_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _one_run(args: argparse.Namespace, scheduler: str) -> dict[str, Any]:
    parent = tempfile.mkdtemp(prefix="dpdask-bench-datasets-", dir=args.tmpdir)
    try:
        store = os.path.join(parent, "persons.zarr")
        with PeakRSS() as mem:
            t0, c0 = time.perf_counter(), time.process_time()
            out = synthetic_persons(
                cph_domain(), args.geographies, store, seed=args.seed, chunk=args.chunk,
                scheduler=scheduler,
            )  # fmt: skip
            seconds = time.perf_counter() - t0
            cpu = time.process_time() - c0
        return {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "peak_rss": mem.peak,
            "baseline_rss": mem.baseline,
            "disk_bytes": _disk_bytes(store),
            "persons": int(out.population.sum()),
            "max_population": int(out.population.max()),
            "chunk": int(out.array.chunks[0]),
        }
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time the threaded and sequential writers; return the figures."""
    if args.geographies < 1 or args.repeats < 1:
        raise ValueError("--geographies and --repeats must be at least 1")
    domain = cph_domain()
    cells = args.geographies * domain.size
    modes = ["threads"] if args.no_baseline else ["threads", "sequential"]
    synthetic_block(domain, 0, 1, population=[1])  # warm the cached model tables first
    rows, results = [], {}
    for mode in modes:
        runs = [_one_run(args, mode) for _ in range(args.repeats)]
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = max(r["peak_rss"] for r in runs)
        results[mode] = (seconds, runs)
        rows.append(
            {
                "scheduler": mode,
                "median_s": seconds,
                "times_s": ", ".join(f"{r['seconds']:.1f}" for r in runs),
                "cpu_s": statistics.median(r["cpu_seconds"] for r in runs),
                "cores_busy": statistics.median(r["cpu_seconds"] / r["seconds"] for r in runs),
                "cells_per_s": cells / seconds,
                "persons_per_s": runs[0]["persons"] / seconds,
                "peak_rss_gb": peak / _GB,
                "rss_increase_gb": (peak - min(r["baseline_rss"] for r in runs)) / _GB,
            }
        )
    first = results["threads"][1][0]
    report: dict[str, Any] = {
        "domain": domain.to_dict(),
        "geographies": args.geographies,
        "cells": cells,
        "chunk_geographies": first["chunk"],
        "persons": first["persons"],
        "largest_geography": first["max_population"],
        "uncompressed_gb": cells * 4 / _GB,
        "disk_gb": first["disk_bytes"] / _GB,
        "cpus": os.cpu_count(),
        "runs": rows,
        "peak_rss_gb": max(r["peak_rss_gb"] for r in rows),
        "peak_under_2gb": max(r["peak_rss_gb"] for r in rows) < 2.0,
    }
    if "sequential" in results:
        report["speedup_threads_vs_sequential"] = results["sequential"][0] / results["threads"][0]
    return report
