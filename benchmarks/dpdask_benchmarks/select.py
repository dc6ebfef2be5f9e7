"""``dpdask bench select``: HDMM strategy selection, time and error against baselines.

Cases (``--cases``, comma-separated; default all):

``opt0``
    OPT_0 on prefix queries, ``n`` in ``--opt0-sizes`` (default 1024, 4096, 8192),
    pure DP, one start; at n = 4096 against the error of HDMM's OPT_0 with p = 256
    on the machine of issue 20 (:data:`P256_REFERENCE`, 212 s there).
``ratios``
    The HDMM slides' prefix table: RMSE of Identity, H2, HB and Privelet over
    HDMM's at n = 256 and 1024 (pure DP).
``gaussian``
    OPT_0 under zCDP on prefix and all-range, n in ``--gaussian-sizes`` (default
    256 and 1024): total squared error over the convex optimum's certified lower
    bound (:func:`dpdask.strategy.convex.ca_solve`, up to n = 4096) and the SVD bound.
``small``
    Problems under 1e5 cells, which run in process: all-range n = 256 (pure DP,
    default templates and restarts) and all 3-way marginals of the 5-attribute
    domain (75, 16, 5, 2, 20) with default templates, against the HDMM
    reference's wall times on the machine of issue 20 (0.24 s and 0.11 s).
``sf1``
    Census SF1 persons on the CPH domain, ``--restarts`` starts (default 25),
    best template, pure DP at epsilon = 1; against Identity and HB per attribute.
    One row per entry of ``--sf1-workers`` (default ``0,2``): 0 runs the tasks in
    this process (no cluster), ``w > 0`` on a local cluster of ``w`` single-threaded
    worker processes (:func:`dpdask.pipeline.cluster.connect`, started before the
    timing); each row gives its wall time over the in-process row's and whether the
    errors agree.
``sf1-reference``
    The HDMM reference's own SF1 person workload (:mod:`dpdask.workloads.sf1_reference`,
    4,151 queries on 2 x 2 x 64 x 17 x 115), ``--restarts`` starts, best template,
    pure DP at epsilon = 1, against Identity; and the same with the relationship
    attribute dropped. Error in both conventions: dpdask's ``expected_error()``
    (Laplace variance ``2 / eps^2`` times ``||A||_1^2 ||W A^+||_F^2``, equal to the
    reference's ``expected_error(W, A, eps=1)``) and the bare objective
    ``||A||_1^2 ||W A^+||_F^2`` (the reference's default ``eps = sqrt(2)``).
``marginals``
    OPT_M on all 3-way marginals of the 12-attribute domain
    (100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5), and of it with two more
    binary attributes; on the (75, 16, 5, 2, 20) domain; and on binary domains
    (2,)^8, (2,)^10, (2,)^12 under pure DP and zCDP; all against Identity.

``residual``
    The residual strategy (:mod:`dpdask.strategy.residual`) under zCDP: all 3-way
    marginals of (2,)^8, (2,)^10, (2,)^12 (``dpdask.select(..., "residual")`` timed;
    what ``"hdmm"`` picks, untimed), total variance over its certified optimum and
    over the SVD bound, and OPT_M's total variance over it; all marginals up to 3-way over 100
    attributes of 10 values (166,751 marginals, sum of variances; target under
    10 s on one core) and over 30 attributes (largest variance; target under
    60 s), the latter also with mixed sizes and random weights. Selection works
    on attribute subsets only, never on cells.

Wall times are medians of ``--repeats`` runs (default 3) of the whole
:func:`dpdask.select` call; ratios are against baselines computed in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from dpdask.domain import Domain
from dpdask.linalg import AllRange, Prefix
from dpdask.privacy import PureDP, zCDP
from dpdask_benchmarks._common import median_time

CASES = ("opt0", "ratios", "gaussian", "small", "sf1", "sf1-reference", "marginals", "residual")
BASELINE_MAX_N = 4096  # baselines and SVD bound need an n x n eigendecomposition
TWELVE = (100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5)
P256_REFERENCE = {4096: 602_831.0}
"""Expected error at epsilon = 1 of OPT_0 with p = 256 on prefix queries (issue 20)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default=",".join(CASES), help=f"subset of {CASES}")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case")
    parser.add_argument("--restarts", type=int, default=25, help="random starts for SF1")
    parser.add_argument(
        "--opt0-sizes", default="1024,4096,8192", help="prefix sizes of the OPT_0 timing case"
    )
    parser.add_argument(
        "--gaussian-sizes", default="256,1024", help="sizes of the Gaussian OPT_0 case"
    )
    parser.add_argument(
        "--sf1-workers",
        default="0,2",
        help="worker processes of the SF1 case's runs (0: in this process, no cluster)",
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return math.sqrt(a / b)


def _baseline_errors(W: Any, privacy: Any, names: list[str], **kw: Any) -> dict[str, float]:
    from dpdask.strategy import select

    out = {}
    for name in names:
        opts = {"branching": 2} if name == "hierarchical" else {}
        out[name] = select(W, privacy, name, **kw, **opts).expected_error()
    return out


def _timed(fn: Any, repeats: int) -> tuple[float, list[float], float, Any]:
    """Median wall time, all wall times, median CPU time (all threads), last result."""
    cpu: list[float] = []

    def run() -> Any:
        c0 = time.process_time()
        out = fn()
        cpu.append(time.process_time() - c0)
        return out

    t, times, result = median_time(run, repeats)
    return t, times, statistics.median(cpu), result


def _opt0(sizes: list[int], repeats: int) -> list[dict]:
    from dpdask.strategy import select

    rows = []
    for n in sizes:
        W = Prefix(n)
        t, times, cpu, plan = _timed(lambda W=W: select(W, PureDP(1), restarts=1), repeats)
        err = plan.expected_error()
        names = ["identity"] + (["hierarchical", "hb", "wavelet"] if n <= BASELINE_MAX_N else [])
        base = _baseline_errors(W, PureDP(1), names)
        best = min((k for k in base if k != "identity"), key=base.get, default="identity")
        bound = plan.svd_bound() if n <= BASELINE_MAX_N else None
        rows.append(
            {
                "case": f"OPT_0 prefix n={n}",
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "p": plan.info.get("p"),
                "iterations": plan.info.get("iterations"),
                "expected_error": err,
                "identity_rmse_ratio": _ratio(base["identity"], err),
                "best_baseline": best,
                "best_baseline_rmse_ratio": _ratio(base[best], err),
                "rmse_over_svd_bound": _ratio(err, bound),
                "solver": plan.info.get("solver", "lbfgs"),
                "p256_reference_error": P256_REFERENCE.get(n),
                "error_over_p256_reference": (
                    err / P256_REFERENCE[n] if n in P256_REFERENCE else None
                ),
            }
        )
    return rows


def _ratios() -> list[dict]:
    from dpdask.strategy import select

    rows = []
    for n in (256, 1024):
        W = Prefix(n)
        plan = select(W, PureDP(1), restarts=3)
        err = plan.expected_error()
        base = _baseline_errors(W, PureDP(1), ["identity", "hierarchical", "hb", "wavelet"])
        rows.append(
            {
                "case": f"prefix n={n} (RMSE over HDMM)",
                "identity": _ratio(base["identity"], err),
                "H2": _ratio(base["hierarchical"], err),
                "HB": _ratio(base["hb"], err),
                "privelet": _ratio(base["wavelet"], err),
                "slides_identity": {256: 2.18, 1024: 3.34}[n],
                "slides_H2": {256: 1.79, 1024: 1.80}[n],
            }
        )
    return rows


def _gaussian(sizes: list[int], repeats: int) -> list[dict]:
    from dpdask.strategy import select
    from dpdask.strategy.convex import ca_solve

    rows = []
    for name, cls in (("prefix", Prefix), ("all-range", AllRange)):
        for n in sizes:
            W = cls(n)
            t, times, plan = median_time(lambda W=W: select(W, zCDP("0.5"), restarts=1), repeats)
            loss = plan.sensitivity**2 * plan.analysis.total()  # unit-sensitivity loss
            lower = ca_solve(W, tol=1e-9).lower_bound if n <= BASELINE_MAX_N else None
            bound = plan.svd_bound() if n <= BASELINE_MAX_N else None
            err = plan.expected_error()
            rows.append(
                {
                    "case": f"OPT_0 zCDP {name} n={n}",
                    "wall_s": t,
                    "times_s": [round(x, 3) for x in times],
                    "solver": plan.info.get("solver", "lbfgs"),
                    "expected_error": err,
                    "error_over_optimum": loss / lower if lower else None,
                    "svd_bound": bound,
                    "error_over_svd_bound": err / bound if bound else None,
                }
            )
    return rows


def _small(repeats: int) -> list[dict]:
    from dpdask.strategy import select
    from dpdask.workloads import marginals

    domain = Domain({f"a{chr(97 + i)}": s for i, s in enumerate((75, 16, 5, 2, 20))})
    problems = [
        ("all-range n=256, pure DP", AllRange(256), None, 0.24),
        ("3-way marginals (75,16,5,2,20), pure DP", marginals(domain, 3), domain, 0.11),
    ]
    rows = []
    for case, W, dom, reference in problems:
        t, times, cpu, plan = _timed(lambda W=W, dom=dom: select(W, PureDP(1), domain=dom), repeats)
        rows.append(
            {
                "case": case,
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "in_process": plan.info.get("in_process"),
                "template": plan.template,
                "expected_error": plan.expected_error(),
                "hdmm_reference_s": reference,
            }
        )
    return rows


def _sf1(restarts: int, repeats: int, workers: list[int]) -> list[dict]:
    from dpdask import census
    from dpdask.strategy import select
    from dpdask.workloads import sf1_persons

    domain = census.cph_domain()
    W = sf1_persons(domain)
    base = _baseline_errors(W, PureDP(1), ["identity", "hb"], domain=domain)
    best = min(base, key=base.get)
    rows: list[dict] = []
    for w in workers:
        with _client(w) as client:
            t, times, cpu, plan = _timed(
                lambda client=client: select(
                    W, PureDP(1), domain=domain, restarts=restarts, client=client
                ),
                repeats,
            )
        err = plan.expected_error()
        first = rows[0] if rows else None
        rows.append(
            {
                "case": f"SF1 persons {'x'.join(map(str, domain.shape))}, {restarts} restarts, "
                + (f"{w} workers" if w else "in process"),
                "workers": w,
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "wall_over_first": t / first["wall_s"] if first else None,
                "same_error_as_first": (
                    math.isclose(err, first["expected_error_eps1"], rel_tol=1e-9) if first else None
                ),
                "template": plan.template,
                "templates": plan.info.get("templates"),
                "expected_error_eps1": err,
                "error_is_upper_bound": plan.groups is not None,
                "identity_rmse_ratio": _ratio(base["identity"], err),
                "best_baseline": best,
                "best_baseline_rmse_ratio": _ratio(base[best], err),
                "svd_bound_ratio": _ratio(err, plan.svd_bound()),
            }
        )
    return rows


@contextlib.contextmanager
def _client(workers: int) -> Iterator[Any]:
    """``None`` for 0 workers, else a client of a local cluster of single-threaded workers."""
    if workers <= 0:
        yield None
        return
    from dpdask.pipeline.cluster import connect

    with connect({"n_workers": workers, "threads_per_worker": 1}) as client:
        client.wait_for_workers(workers)
        yield client


def _sf1_reference(restarts: int, repeats: int) -> list[dict]:
    from dpdask.strategy import select
    from dpdask.workloads.sf1_reference import hdmm_reference_domain, sf1_hdmm_reference

    full = hdmm_reference_domain()
    rows = []
    for domain, reference in ((full, 12.8), (full.project(["sex", "hisp", "race", "age"]), 2.94)):
        W = sf1_hdmm_reference(domain)
        t, times, cpu, plan = _timed(
            lambda W=W, domain=domain: select(W, PureDP(1), domain=domain, restarts=restarts),
            repeats,
        )
        err = plan.expected_error()
        objective = plan.sensitivity**2 * plan.analysis.total()
        ident = select(W, PureDP(1), "identity", domain=domain).expected_error()
        rows.append(
            {
                "case": f"SF1 HDMM reference {'x'.join(map(str, domain.shape))}, "
                f"{restarts} restarts",
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "template": plan.template,
                "templates": plan.info.get("templates"),
                "sensitivity": plan.sensitivity,
                "expected_error_eps1": err,
                "objective": objective,
                "reference_error": 2.21e5 if domain is full else None,
                "error_is_upper_bound": plan.groups is not None,
                "identity_rmse_ratio": _ratio(ident, err),
                "reference_identity_rmse_ratio": reference,
            }
        )
    return rows


def _marginals(repeats: int) -> list[dict]:
    from dpdask.strategy import select
    from dpdask.workloads import marginals

    rows = []
    problems = [(s, PureDP(1)) for s in (TWELVE, (*TWELVE, 2, 2), (75, 16, 5, 2, 20))]
    problems += [((2,) * d, pr) for d in (8, 10, 12) for pr in (PureDP(1), zCDP("0.5"))]
    for sizes, privacy in problems:
        domain = Domain({f"a{chr(97 + i)}": s for i, s in enumerate(sizes)})
        W = marginals(domain, 3)
        t, times, cpu, plan = _timed(
            lambda W=W, domain=domain, privacy=privacy: select(
                W, privacy, domain=domain, templates=["marginals"], restarts=1
            ),
            repeats,
        )
        err = plan.expected_error()
        ident = plan.identity_error()
        label = f"(2,)^{len(sizes)}" if set(sizes) == {2} else f"{len(sizes)} attributes"
        rows.append(
            {
                "case": f"OPT_M 3-way marginals, {label}, {plan.mechanism}",
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "expected_error": err,
                "error_over_identity": err / ident,
                "identity_rmse_ratio": _ratio(ident, err),
            }
        )
    return rows


def _residual(repeats: int) -> list[dict]:
    import numpy as np

    from dpdask.strategy import select
    from dpdask.strategy.residual import MarginalWorkload, all_subsets, plan_residual
    from dpdask.workloads import marginals

    rows = []
    for d in (8, 10, 12):
        domain = Domain({f"a{chr(97 + i)}": 2 for i in range(d)})
        W = marginals(domain, 3)
        t, times, cpu, plan = _timed(
            lambda W=W, domain=domain: select(W, zCDP("0.5"), "residual", domain=domain),
            repeats,
        )
        err = plan.expected_error()
        optimum = plan.noise_variance * plan.solution.lower_bound  # closed form
        bound = plan.svd_bound()
        opt_m = select(W, zCDP("0.5"), domain=domain, templates=["marginals"], restarts=1)
        hdmm = select(W, zCDP("0.5"), domain=domain, restarts=1)  # untimed: what it picks
        rows.append(
            {
                "case": f"residual 3-way marginals, (2,)^{d}, zCDP",
                "hdmm_picks": hdmm.template,
                "wall_s": t,
                "times_s": [round(x, 4) for x in times],
                "cpu_s": cpu,
                "expected_error": err,
                "error_over_certified_optimum": err / optimum,
                "error_over_svd_bound": err / bound if bound else None,
                "opt_m_error_over_residual": opt_m.expected_error() / err,
            }
        )
    rng = np.random.default_rng(0)
    mixed = tuple(2 + (7 * i) % 9 for i in range(30))
    wide = [
        ("sum", (10,) * 100, None, 10.0),
        ("max", (10,) * 30, None, 60.0),
        ("max", mixed, rng.uniform(0.5, 2.0, 4526), 60.0),
    ]
    for objective, sizes, weights, target in wide:

        def build(sizes: Any = sizes, weights: Any = weights, objective: str = objective) -> Any:
            W = MarginalWorkload(sizes, all_subsets(len(sizes), 3), weights)
            return plan_residual(W, zCDP("0.5"), objective=objective)

        t, times, cpu, plan = _timed(build, repeats)
        label = f"{len(sizes)} x {sizes[0]}" if len(set(sizes)) == 1 else f"{len(sizes)} mixed 2-10"
        rows.append(
            {
                "case": f"residual up to 3-way, {label}, {objective}"
                + (", random weights" if weights is not None else ""),
                "marginals": plan.marginals.m,
                "queries": float(np.sum(plan.marginals.cells())),
                "residuals": len(plan.precision),
                "wall_s": t,
                "times_s": [round(x, 3) for x in times],
                "cpu_s": cpu,
                "target_s": target,
                "within_target": cpu < target,
                "objective_value": plan.solution.value,
                "certified_gap": plan.solution.gap,
                "iterations": plan.solution.iterations,
            }
        )
    return rows


def run(args: argparse.Namespace) -> dict:
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            raise ValueError(f"unknown case {c!r}; choose from {CASES}")
    out: dict[str, Any] = {"cpus": os.cpu_count(), "repeats": args.repeats}
    t0 = time.perf_counter()
    if "opt0" in cases:
        out["opt0"] = _opt0([int(s) for s in args.opt0_sizes.split(",")], args.repeats)
    if "ratios" in cases:
        out["ratios"] = _ratios()
    if "gaussian" in cases:
        sizes = [int(s) for s in args.gaussian_sizes.split(",")]
        out["gaussian"] = _gaussian(sizes, args.repeats)
    if "small" in cases:
        out["small"] = _small(args.repeats)
    if "sf1" in cases:
        workers = [int(w) for w in str(args.sf1_workers).split(",")]
        out["sf1"] = _sf1(args.restarts, args.repeats, workers)
    if "sf1-reference" in cases:
        out["sf1-reference"] = _sf1_reference(args.restarts, args.repeats)
    if "marginals" in cases:
        out["marginals"] = _marginals(args.repeats)
    if "residual" in cases:
        out["residual"] = _residual(args.repeats)
    out["total_s"] = time.perf_counter() - t0
    return out
