"""``dpdask bench ldp``: the local model's optimised strategies against every baseline.

The grid (workloads x domain sizes x epsilon: sample complexity of the optimised
strategy and of the best baseline), the optimisation's wall time, and the server's
aggregation of many responses. The figures come from :mod:`dpdask.ldp.bench`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dpdask.ldp.bench import WORKLOADS, aggregate_speed, grid
from dpdask.ldp.optimize import optimize
from dpdask.linalg import Prefix

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=["grid", "speed", "aggregate", "all"], default="grid")
    parser.add_argument("--n", type=int, nargs="+", default=[64, 256], help="domain sizes")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--people", type=int, default=100_000_000, help="for --part aggregate")
    parser.add_argument("--geographies", type=int, default=3000, help="for --part aggregate")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.part in ("grid", "all"):
        out["grid"] = grid(args.n, args.epsilon, args.workload, seed=args.seed)
    if args.part in ("speed", "all"):
        out["speed"] = []
        for n in args.n:
            t0 = time.perf_counter()
            optimize(Prefix(n), 1.0, seed=args.seed)
            out["speed"].append(
                {"n": n, "workload": "prefix", "wall_time_s": time.perf_counter() - t0}
            )
    if args.part in ("aggregate", "all"):
        out["aggregate"] = aggregate_speed(args.people, args.geographies, seed=args.seed)
    return out
