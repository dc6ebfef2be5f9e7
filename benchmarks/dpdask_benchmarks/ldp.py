"""``dpdask bench ldp``: the local model's optimised strategies against every baseline.

The grid (workloads x domain sizes x epsilon: sample complexity of the optimised
strategy and of the best baseline, and a ``summary`` of it), the optimisation's wall
time, and the server's aggregation of many responses. Without ``--n``, the grid covers
issue 22's domain sizes (64, 256 and 1024) and the speed part times ``n = 256`` and ``n = 1024``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from dpdask.ldp.bounds import lower_bound
from dpdask.ldp.optimize import optimize
from dpdask.linalg import AllRange, Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.workloads.parity import parities

__all__ = [
    "GRID_NS",
    "SPEED_NS",
    "WORKLOADS",
    "add_arguments",
    "aggregate_speed",
    "grid",
    "grid_summary",
    "run",
    "workload",
]

#: Domain sizes of the grid and of the speed part when ``--n`` is not given.
GRID_NS = (64, 256, 1024)
SPEED_NS = (256, 1024)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--part", choices=["grid", "speed", "aggregate", "all"], default="grid",
        help="which figures: the strategy grid, optimisation speed, aggregation",
    )  # fmt: skip
    parser.add_argument(
        "--n", type=int, nargs="+", default=None,
        help=f"domain sizes (default: {' '.join(map(str, GRID_NS))} for the grid, "
        f"{' '.join(map(str, SPEED_NS))} for speed)",
    )  # fmt: skip
    parser.add_argument(
        "--epsilon", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0],
        help="epsilons of the grid",
    )  # fmt: skip
    parser.add_argument(
        "--workload", nargs="+", default=list(WORKLOADS), help="workloads of the grid"
    )
    parser.add_argument("--people", type=int, default=100_000_000, help="for --part aggregate")
    parser.add_argument("--geographies", type=int, default=3000, help="for --part aggregate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random starts")


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.part in ("grid", "all"):
        rows = grid(list(args.n or GRID_NS), args.epsilon, args.workload, seed=args.seed)
        out["grid"] = rows
        out["grid_summary"] = grid_summary(rows)
    if args.part in ("speed", "all"):
        out["speed"] = []
        for n in args.n or SPEED_NS:
            t0 = time.perf_counter()
            optimize(Prefix(n), 1.0, seed=args.seed)
            out["speed"].append(
                {"n": n, "workload": "prefix", "wall_time_s": time.perf_counter() - t0}
            )
    if args.part in ("aggregate", "all"):
        out["aggregate"] = aggregate_speed(args.people, args.geographies, seed=args.seed)
    return out


WORKLOADS = ("histogram", "prefix", "all_range", "all_marginals", "3way_marginals", "3way_parity")


def workload(name: str, n: int) -> LinearQuery:
    """A benchmark workload on ``n`` types (``n = 2^d`` for the binary ones)."""
    d = round(math.log2(n))
    if name == "histogram":
        return Identity(n)
    if name == "prefix":
        return Prefix(n)
    if name == "all_range":
        return AllRange(n)
    if 2**d != n:
        raise ValueError(f"{name} needs n = 2^d")
    if name == "all_marginals":
        return Kron([VStack([Identity(2), Total(2)])] * d)
    if name == "3way_marginals":
        from dpdask import Domain
        from dpdask.workloads import marginals

        return marginals(Domain(**{f"a{i}": 2 for i in range(d)}), 3)
    if name == "3way_parity":
        return parities(d, 3)
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")


def grid(
    ns: list[int], epsilons: list[float], names: list[str], seed: int = 0, alpha: float = 0.01
) -> list[dict[str, Any]]:
    """One record per cell: sample complexities, lower bound, improvement, time."""
    out = []
    for n in ns:
        for name in names:
            W = workload(name, n)
            for eps in epsilons:
                t0 = time.perf_counter()
                S = optimize(W, eps, seed=seed, alpha=alpha)
                wall = time.perf_counter() - t0
                cands = S.info["candidates"]
                base = {
                    k: v["sample_complexity"]
                    for k, v in cands.items()
                    if not k.startswith("optimized") and v.get("supported")
                }
                opt = S.sample_complexity(W, alpha)
                best = min(base.values())
                rec = {
                    "workload": name,
                    "n": n,
                    "epsilon": eps,
                    "optimized": opt,
                    "baselines": base,
                    "best_baseline": min(base, key=base.get),
                    "improvement": best / opt,
                    "at_or_below_best": opt <= best * (1 + 1e-9),
                    "lower_bound": lower_bound(W, eps, alpha=alpha),
                    "winner": S.info["winner"],
                    "wall_time_s": wall,
                }
                out.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    return out


def grid_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What issue 22 asks of the grid, at a glance.

    Cells, those where the optimised strategy is at or below the best baseline (all of
    them must be), those strictly below it, the least and largest improvement, and the
    longest optimisation per domain size.
    """
    worst_time: dict[str, float] = {}
    for r in rows:
        key = str(r["n"])
        worst_time[key] = max(worst_time.get(key, 0.0), float(r["wall_time_s"]))
    improvements = [float(r["improvement"]) for r in rows]
    return {
        "cells": len(rows),
        "at_or_below_best": sum(bool(r["at_or_below_best"]) for r in rows),
        "strictly_below_best": sum(r["improvement"] > 1 + 1e-9 for r in rows),
        "losing_cells": [
            {"workload": r["workload"], "n": r["n"], "epsilon": r["epsilon"]}
            for r in rows
            if not r["at_or_below_best"]
        ],
        "min_improvement": min(improvements, default=math.nan),
        "max_improvement": max(improvements, default=math.nan),
        "max_wall_time_s": worst_time,
    }


def aggregate_speed(people: int, geographies: int, n: int = 64, seed: int = 0) -> dict:
    """Simulate ``people`` responses to Parquet, then time :func:`dpdask.ldp.aggregate`."""
    import pandas as pd

    from dpdask.ldp.aggregate import aggregate
    from dpdask.ldp.baselines import hadamard
    from dpdask.ldp.simulate import randomize

    rng = np.random.default_rng(seed)  # a benchmark's simulated data: public randomness
    S = hadamard(n, 1.0)
    W = Prefix(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "responses")
        os.makedirs(path)
        t0 = time.perf_counter()
        step = 10_000_000
        for i, start in enumerate(range(0, people, step)):
            size = min(step, people - start)
            types = rng.integers(0, n, size=size)
            resp = randomize(S, types, rng).astype(np.int32)
            geo = rng.integers(0, geographies, size=size).astype(np.int32)
            pd.DataFrame({"response": resp, "geography": geo}).to_parquet(
                os.path.join(path, f"part-{i:04d}.parquet"), index=False
            )
        simulate = time.perf_counter() - t0
        t0 = time.perf_counter()
        est = aggregate(path, S, W)
        wall = time.perf_counter() - t0
    return {
        "people": people,
        "geographies": len(est.geographies),
        "n": n,
        "m": S.shape[0],
        "simulate_s": simulate,
        "aggregate_s": wall,
        "counted": int(est.counts.sum()),
    }
