"""``dpdask bench linalg``: the implicit SF1 workload and large marginal workloads.

Measures, in one run:

* building the SF1 person workload (:func:`dpdask.workloads.sf1_persons`, 4,327
  queries on the 492,660-cell CPH domain): median time and the peak memory traced
  by :mod:`tracemalloc` during one build;
* its matvec on one geography (median), against the baseline of ``np.sum`` over
  the same data vector (the least any query answering must do: read every cell);
* its rmatvec (``W.T @ y``) and its L1 and L2 sensitivities, computed from the
  Kronecker structure without materialising;
* the L1 and L2 sensitivities of all 3-way marginals on a domain of about 10^8
  cells (10 attributes), with the closed form ``C(d, 3)`` (every cell is in one
  row of each marginal) to check them against.

Data are Poisson counts from a seeded generator (benchmark data, not noise).
"""

from __future__ import annotations

import argparse
import math
import time
import tracemalloc
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.workloads import marginals, sf1_persons
from dpdask_benchmarks._common import median_time

__all__ = ["add_arguments", "run"]

_BIG_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 10, 28)  # 101,606,400 cells


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--repeats", type=int, default=5, help="runs per timing (median)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the benchmark data")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(_BIG_SIZES),
        help="attribute sizes of the large marginal domain",
    )
    parser.add_argument("--way", type=int, default=3, help="order of the large marginals")


def _traced_peak(fn: Any) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time the SF1 workload and the large marginals; return the figures."""
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    r = args.repeats
    build_s, build_all, W = median_time(sf1_persons, r)
    build_peak, _ = _traced_peak(sf1_persons)

    x = np.random.default_rng(args.seed).poisson(1.0, W.shape[1]).astype(float)
    matvec_s, _, y = median_time(lambda: W @ x, r)
    sum_s, _, _ = median_time(lambda: np.sum(x), r)
    rmatvec_s, _, _ = median_time(lambda: W.T @ y, r)
    sens1_s, _, sens1 = median_time(lambda: W.sensitivity(1), r)
    sens2_s, _, sens2 = median_time(lambda: W.sensitivity(2), r)

    big = Domain({f"a{i}": n for i, n in enumerate(args.sizes)})
    t0 = time.perf_counter()
    M = marginals(big, args.way)
    big_build_s = time.perf_counter() - t0
    big1_s, _, big1 = median_time(lambda: M.sensitivity(1), r)
    big2_s, _, big2 = median_time(lambda: M.sensitivity(2), r)
    n_parts = math.comb(len(big), args.way)

    return {
        "sf1_queries": W.shape[0],
        "sf1_cells": W.shape[1],
        "sf1_products": len(W.parts),
        "sf1_build_s": build_s,
        "sf1_build_runs_s": build_all,
        "sf1_build_peak_traced_bytes": build_peak,
        "sf1_matvec_s": matvec_s,
        "baseline_np_sum_s": sum_s,
        "matvec_over_np_sum": matvec_s / sum_s,
        "sf1_rmatvec_s": rmatvec_s,
        "sf1_sensitivity_l1": sens1,
        "sf1_sensitivity_l1_s": sens1_s,
        "sf1_sensitivity_l2": sens2,
        "sf1_sensitivity_l2_s": sens2_s,
        "marginals_domain_cells": big.size,
        "marginals_way": args.way,
        "marginals_parts": len(M.parts),
        "marginals_queries": M.shape[0],
        "marginals_build_s": big_build_s,
        "marginals_sensitivity_l1": big1,
        "marginals_sensitivity_l1_expected": float(n_parts),
        "marginals_sensitivity_l1_s": big1_s,
        "marginals_sensitivity_l2": big2,
        "marginals_sensitivity_l2_expected": math.sqrt(n_parts),
        "marginals_sensitivity_l2_s": big2_s,
        "repeats": r,
    }
