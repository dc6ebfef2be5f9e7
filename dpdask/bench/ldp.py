"""``dpdask bench ldp``: the local model's optimised strategies against every baseline.

The grid (workloads x domain sizes x epsilon: sample complexity of the optimised
strategy and of the best baseline, and a ``summary`` of it), the optimisation's wall
time, and the server's aggregation of many responses. The figures come from
:mod:`dpdask.ldp.bench`. Without ``--n``, the grid covers issue 22's domain sizes
(64, 256 and 1024) and the speed part times ``n = 256`` and ``n = 1024``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dpdask.ldp.bench import WORKLOADS, aggregate_speed, grid, grid_summary
from dpdask.ldp.optimize import optimize
from dpdask.linalg import Prefix

__all__ = ["GRID_NS", "SPEED_NS", "add_arguments", "run"]

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
