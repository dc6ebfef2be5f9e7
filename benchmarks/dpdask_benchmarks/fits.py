"""``dpdask bench fits``: one top-down family's fit on the CPH domain, at Census scale.

Each case is one parent and its ``K`` children on the CPH person domain (492,660
cells), with the release's strategy (``select(sf1-persons, zCDP(rho), "hdmm")``), from
synthetic persons (:func:`dpdask.datasets.synthetic_block`, the truth known) measured
with Gaussian noise from NumPy at the plan's scale for each level's share of the
budget (test data, not a release):

* ``a``: a state of 6 million persons and its 62 counties;
* ``b``: a county of 650,000 persons and its 155 tracts (about 4,300 persons each);
* ``c``: a state of 39 million persons and its 58 counties.

The counties' populations are lognormal like US counties' (scaled to the state's), the
tracts' lognormal with log-sd 0.3. The parent's estimate is NNLS on the parent's
measurements (timed: ``parent_nnls_s``); the children are fitted by
``children_fitter(A, 1 / variance).on_support(parent, Y=...)`` (or ``Z=``, their
least-squares estimates), timed ``--repeats`` times (``fit_s``, the median; ``fit_runs``
all). Reported per family: the parent's support (estimated and true), ``K``, the
variables, iterations, products, the KKT residual and the duality gap of the fit, and
the realised root-mean-square error against the truth of the SF1 person answers and of
the cells, for the top-down children and for the bottom-up baseline (each child's own
NNLS, ``--baseline``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

__all__ = ["add_arguments", "run"]

# case: parent population, children, the parent's and the children's share of rho
_CASES: dict[str, tuple[str, int, int, float, float, str]] = {
    "a": ("state > counties", 6_000_000, 62, 0.25, 0.25, "county"),
    "b": ("county > tracts", 650_000, 155, 0.25, 0.5, "tract"),
    "c": ("state > counties", 39_000_000, 58, 0.25, 0.25, "county"),
}
_ROWS = 8  # children generated, measured and answered this many at a time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cases", default="a,b,c",
        help="families to fit, comma-separated: a (6M state, 62 counties), b (650k county, "
        "155 tracts), c (39M state, 58 counties)",
    )  # fmt: skip
    parser.add_argument("--children", type=int, default=None, help="K, overriding the case's")
    parser.add_argument(
        "--population", type=float, default=None, help="the parent's persons, overriding the case's"
    )
    parser.add_argument(
        "--method", default="auto", choices=("auto", "newton", "fista", "active"),
        help="the children's solver (children_fitter's method)",
    )  # fmt: skip
    parser.add_argument(
        "--start", default="auto", choices=("auto", "estimates", "simple", "admm"),
        help="where the children's fit starts (children_fitter's start)",
    )  # fmt: skip
    parser.add_argument(
        "--given", default="y", choices=("y", "z"),
        help="fit from the children's measurements (y) or least-squares estimates (z)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="timed fits per family")
    parser.add_argument("--tol", type=float, default=1e-2, help="KKT tolerance, noise units")
    parser.add_argument("--rho", type=float, default=1.0, help="zCDP budget of the release")
    parser.add_argument(
        "--baseline", action=argparse.BooleanOptionalAction, default=True,
        help="also fit each child by its own NNLS (the bottom-up baseline)",
    )  # fmt: skip
    parser.add_argument(
        "--parent-repeats", type=int, default=1, help="timed NNLS fits of the parent"
    )
    parser.add_argument("--seed", type=int, default=0, help="data and noise seed")


def _populations(kind: str, total: int, K: int, rng: np.random.Generator) -> np.ndarray:
    from dpdask.datasets import draw_populations

    if kind == "county":
        shares = draw_populations(K, int(rng.integers(2**31)), 25_000).astype(float)
    else:
        shares = rng.lognormal(0.0, 0.3, size=K)
    shares = np.maximum(shares, 1.0)
    pops = np.floor(total * shares / shares.sum()).astype(np.int64)
    pops[np.argmax(pops)] += total - int(pops.sum())
    return pops


class _Family:
    """One parent and its children: truth (sparse), measurements, noise variances."""

    def __init__(self, case: str, args: argparse.Namespace, A: Any, plan: Any):
        from scipy import sparse

        from dpdask.datasets import synthetic_block
        from dpdask.privacy import noise_scale, zCDP

        label, pop, K, share_p, share_c, kind = _CASES[case]
        self.case, self.label = case, label
        self.population = int(args.population or pop)
        self.K = K = int(args.children or K)
        rng = np.random.default_rng([args.seed, ord(case)])
        self.pops = _populations(kind, self.population, K, rng)
        sens = float(plan.sensitivity)
        self.var_parent = noise_scale("gaussian", sens, zCDP(args.rho * share_p)) ** 2
        self.var_children = noise_scale("gaussian", sens, zCDP(args.rho * share_c)) ** 2
        dom = plan.domain
        n, m = A.shape[1], A.shape[0]
        rows, Y = [], np.empty((K, m))
        for a in range(0, K, _ROWS):
            b = min(K, a + _ROWS)
            x = synthetic_block(dom, a, b, seed=args.seed + 7 * ord(case), population=self.pops)
            x = x.reshape(b - a, n).astype(np.float64)
            Y[a:b] = A.apply(x) + rng.normal(scale=np.sqrt(self.var_children), size=(b - a, m))
            rows.append(sparse.csr_array(x))
        self.truth = sparse.vstack(rows).tocsr()
        self.parent_truth = np.asarray(self.truth.sum(axis=0)).ravel()
        noise = rng.normal(scale=np.sqrt(self.var_parent), size=m)
        self.y_parent = A.apply(self.parent_truth[None])[0] + noise
        self.Y = Y

    def estimates(self, A: Any) -> np.ndarray:
        """The children's least-squares estimates (the structured pseudo-inverse)."""
        from dpdask.reconstruct.structured import structured_pinv

        P = structured_pinv(A)
        if P is None:
            raise ValueError("the strategy has no structured pseudo-inverse")
        Z = np.empty((self.K, A.shape[1]))
        for a in range(0, self.K, _ROWS):
            Z[a:a + _ROWS] = P.apply(self.Y[a:a + _ROWS])  # fmt: skip
        return Z


def _rmse(W: Any, truth: Any, rows: Any) -> dict[str, float]:
    """RMSE of the cells and of the workload answers; ``rows(a, b)`` the estimates."""
    K = truth.shape[0]
    cell = answer = 0.0
    for a in range(0, K, _ROWS):
        b = min(K, a + _ROWS)
        est, true = rows(a, b), truth[a:b].toarray()
        cell += float(np.square(est - true).sum())
        answer += float(np.square(W.apply(est) - W.apply(true)).sum())
    return {
        "cells": float(np.sqrt(cell / (K * truth.shape[1]))),
        "answers": float(np.sqrt(answer / (K * W.shape[0]))),
    }


def _fit(fit: Any, parent: np.ndarray, data: dict[str, np.ndarray]) -> Any:
    """``fit.on_support``, or (a tree from before it, measured as a baseline) the
    dense fit restricted to the support."""
    if hasattr(fit, "on_support"):
        return fit.on_support(parent, **data)
    from types import SimpleNamespace

    dense = fit(data["Y"], parent) if "Y" in data else fit.from_estimates(data["Z"], parent)
    idx = np.flatnonzero(parent > 0)
    return SimpleNamespace(idx=idx, x=dense.x[:, idx], report=dense.report)


def _case(case: str, args: argparse.Namespace, A: Any, W: Any, plan: Any) -> dict[str, Any]:
    from dpdask.reconstruct import nnls
    from dpdask.reconstruct.topdown import children_fitter

    t0 = time.perf_counter()
    fam = _Family(case, args, A, plan)
    out: dict[str, Any] = {"case": case, "family": fam.label, "K": fam.K}
    out["population"] = fam.population
    out["data_s"] = time.perf_counter() - t0
    times = []
    for _ in range(max(1, int(args.parent_repeats))):
        t0 = time.perf_counter()
        top = nnls(A, fam.y_parent, 1.0 / fam.var_parent, tol=args.tol)
        times.append(time.perf_counter() - t0)
    parent = np.maximum(np.asarray(top.x, dtype=float), 0.0)
    out["parent_nnls_s"] = statistics.median(times)
    out["parent_converged"] = bool(top.report.converged)
    out["support"] = int(np.count_nonzero(parent))
    out["support_true"] = int(np.count_nonzero(fam.parent_truth))
    out["parent_rmse_answers"] = float(
        np.sqrt(np.mean(np.square(W.apply(parent[None] - fam.parent_truth[None]))))
    )
    t0 = time.perf_counter()
    options = {"tol": args.tol, "method": args.method, "start": args.start}
    fit = children_fitter(A, 1.0 / fam.var_children, **options)
    out["setup_s"] = time.perf_counter() - t0
    data = {"Y": fam.Y} if args.given == "y" else {"Z": fam.estimates(A)}
    runs = []
    for _ in range(max(1, int(args.repeats))):
        t0 = time.perf_counter()
        est = _fit(fit, parent, data)
        runs.append(time.perf_counter() - t0)
    rep = est.report
    out.update(fit_s=statistics.median(runs), fit_runs=runs, method=rep.method)
    out.update(variables=rep.details["variables"], iterations=rep.iterations)
    out.update(products=rep.details.get("products"), kkt=rep.residual)
    out.update(gap=rep.details.get("gap"), converged=bool(rep.converged))
    out.update(start=rep.details.get("start"), gram=rep.details.get("gram"))
    sums = np.zeros(A.shape[1])
    sums[est.idx] = est.x.sum(axis=0)
    out["max_sum_error"] = float(np.abs(sums - parent).max())
    out["min_child"] = float(est.x.min(initial=0.0))

    def topdown_rows(a: int, b: int) -> np.ndarray:
        X = np.zeros((b - a, A.shape[1]))
        X[:, est.idx] = est.x[a:b]
        return X

    rm = _rmse(W, fam.truth, topdown_rows)
    out.update(rmse_topdown_answers=rm["answers"], rmse_topdown_cells=rm["cells"])
    if args.baseline:
        t0 = time.perf_counter()
        bottom = [
            np.maximum(nnls(A, fam.Y[c], 1.0 / fam.var_children, tol=args.tol).x, 0.0)
            for c in range(fam.K)
        ]
        out["nnls_children_s"] = time.perf_counter() - t0
        rm = _rmse(W, fam.truth, lambda a, b: np.stack(bottom[a:b]))
        out.update(rmse_nnls_answers=rm["answers"], rmse_nnls_cells=rm["cells"])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from dpdask.census import cph_domain
    from dpdask.privacy import zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import build_workload

    cases = [c.strip() for c in str(args.cases).split(",") if c.strip()]
    unknown = sorted(set(cases) - set(_CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; use {', '.join(_CASES)}")
    dom = cph_domain()
    W = build_workload({"name": "sf1-persons"}, dom)
    t0 = time.perf_counter()
    plan = select(W, zCDP(args.rho), strategy="hdmm", domain=dom)
    result: dict[str, Any] = {"select_s": time.perf_counter() - t0, "cells": dom.size}
    result["strategy_rows"] = int(plan.strategy.shape[0])
    with threadpool_limits(limits=1):  # one core per task, as in a release
        result["families"] = [_case(c, args, plan.strategy, W, plan) for c in cases]
    return result
