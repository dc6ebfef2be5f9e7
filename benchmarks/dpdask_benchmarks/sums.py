"""``dpdask bench sums``: paper 004's experiment on the CPS weekly wages.

The 28,155 wages of ``cps/AER_CPS1988.csv`` (``../shared/data``) are bucketized into
``--bins`` bins of equal width over ``[0, --high]`` (default 1,000 bins of $20 over
[0, 20,000]), each represented by its upper end. Workloads: prefix sums Q1 (every
prefix), Q2 (every 10th), Q3 (every 100th). For every workload, epsilon in
``--epsilons``, rho in ``--rhos`` and threshold method (``none``: the whole budget
measures, reported with ``rho = 0``; ``svt``; ``recursive``) the mechanisms SQM,
Identity, Workload, TiMM and TaMM answer the workload ``--trials`` times:

* each trial draws its own private threshold (SVT over ``s c^(i-1)`` with
  ``r = 0.998, c = 1.2`` and ``s = --svt-s``; recursive with ``beta = 2 rho eps / 5``,
  ``mu = 0.5``, ``theta0 = s``, rounded down to the SVT grid so that strategies can
  be cached), shared by the four matrix mechanisms of the trial (paper 004,
  Algorithm 9); SQM draws one threshold per query with budget ``rho eps / m``;
* TiMM's and TaMM's strategies come from :func:`dpdask.select` (``--strategy``,
  default HDMM) for the selection workload of ``--objective`` (default: per mechanism,
  :data:`dpdask.sums.DEFAULT_OBJECTIVE`; :func:`dpdask.sums.select_strategy`), chosen
  once per workload (TiMM) or per workload and threshold (TaMM);
* noise: float Laplace from :class:`~dpdask.noise.KeyedRNG` streams of a fresh key
  (``--seed`` for a test key: reproducible figures).

Reported per row: ``mean_relative_error`` (after isotonic regression of the prefix
sums) and ``mean_relative_error_raw`` (before) of ``|y~ - y| / max(y, 100)`` over trials
and queries, the same over the smallest and the largest tenth of the queries and over
every tenth (``mean_relative_error_by_tenth``, after isotonic regression), and the
median threshold. ``checks`` summarises the paper's findings on this run.
"""

from __future__ import annotations

import argparse
import csv
import math
import pathlib
import time
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.noise import KeyedRNG, SecretKey, new_key
from dpdask.privacy import PureDP
from dpdask.sums import (
    MECHANISMS,
    NumericBins,
    SumWorkload,
    exponential_grid,
    monotone,
    recursive_threshold,
    relative_error,
    sum_mechanism,
    svt_threshold,
)
from dpdask.sums.mechanisms import OBJECTIVES, SumMechanism, select_strategy

__all__ = ["add_arguments", "run"]

_DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"
_WORKLOADS = {"Q1": 1, "Q2": 10, "Q3": 100}
_THRESHOLDS = ("none", "svt", "recursive")


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument(
        "--data", default=str(_DATA / "cps" / "AER_CPS1988.csv"), help="CPS wages CSV"
    )
    parser.add_argument("--bins", type=int, default=1000, help="equal-width bins")
    parser.add_argument("--high", type=float, default=20000.0, help="upper end of the bins")
    parser.add_argument("--trials", type=int, default=100, help="noise draws per row")
    parser.add_argument(
        "--epsilons", type=_floats, default=[0.01, 0.1, 1.0], help="comma-separated"
    )
    parser.add_argument("--rhos", type=_floats, default=[0.1, 0.5], help="threshold shares")
    parser.add_argument("--workloads", type=_names, default=list(_WORKLOADS), help="Q1,Q2,Q3")
    parser.add_argument(
        "--thresholds", type=_names, default=list(_THRESHOLDS), help="none,svt,recursive"
    )
    parser.add_argument(
        "--mechanisms", type=_names, default=list(MECHANISMS), help="SQM,Identity,..."
    )
    parser.add_argument("--strategy", default="hdmm", help="dpdask.select strategy (A)")
    parser.add_argument("--restarts", type=int, default=1, help="HDMM restarts")
    parser.add_argument(
        "--objective", choices=OBJECTIVES, default=None,
        help="what TiMM's and TaMM's selection minimises (default: per mechanism)",
    )  # fmt: skip
    parser.add_argument("--svt-r", default="0.998", help="SVT quantile r")
    parser.add_argument("--svt-s", type=float, default=500.0, help="first SVT candidate")
    parser.add_argument("--svt-c", type=float, default=1.2, help="SVT grid ratio")
    parser.add_argument("--mu", type=float, default=0.5, help="recursive mechanism's mu")
    parser.add_argument("--delta", type=float, default=100.0, help="relative error floor")
    parser.add_argument("--seed", type=int, default=None, help="test key (reproducible)")


def _wages(path: str) -> np.ndarray:
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} not found (the CPS wages of ../shared/data/cps)")
    with p.open(newline="") as fh:
        return np.array([float(row["wage"]) for row in csv.DictReader(fh)])


class _Cache:
    """Mechanisms at epsilon 1 by (workload, name, theta); the noise scales with 1 / eps."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.mechs: dict[tuple[str, str, float], SumMechanism] = {}
        self.base: dict[str, Any] = {}

    def get(self, wl: str, sums: SumWorkload, name: str, theta: float) -> SumMechanism:
        key = (wl, name, theta)
        if key not in self.mechs:
            opts: dict[str, Any] = {"strategy": self.args.strategy}
            if self.args.strategy == "hdmm":
                opts["restarts"] = self.args.restarts
            opts["objective"] = self.args.objective
            if name == "TiMM":
                if wl not in self.base:
                    plan = select_strategy("TiMM", sums, None, PureDP(1), **opts)
                    self.base[wl] = plan.strategy
                opts["base"] = self.base[wl]
            mech = sum_mechanism(name, sums, theta, PureDP(1), **opts)
            if not isinstance(mech, SumMechanism):
                raise TypeError("expected a matrix mechanism")
            mech.reconstruction()
            self.mechs[key] = mech
        return self.mechs[key]


def _errors(noisy: np.ndarray, true: np.ndarray, delta: float) -> dict[str, float]:
    raw = relative_error(noisy, true, delta)
    iso = relative_error(monotone(noisy), true, delta)
    m = true.size
    k = max(1, m // 10)
    return {
        "mean_relative_error": float(iso.mean()),
        "mean_relative_error_raw": float(raw.mean()),
        "mean_relative_error_smallest": float(iso[:, :k].mean()),
        "mean_relative_error_largest": float(iso[:, -k:].mean()),
        "mean_relative_error_smallest_raw": float(raw[:, :k].mean()),
        "mean_relative_error_largest_raw": float(raw[:, -k:].mean()),
        "mean_relative_error_by_tenth": [
            float(part.mean()) for part in np.array_split(iso, min(10, m), axis=1)
        ],
    }


def _thresholds(
    method: str,
    x: np.ndarray,
    u: np.ndarray,
    eps1: Fraction | None,
    rng: KeyedRNG,
    size: int,
    args: argparse.Namespace,
    grid: np.ndarray,
) -> np.ndarray:
    if method == "none" or eps1 is None:
        return np.full(size, math.inf)
    if method == "svt":
        res = svt_threshold(
            x, u, eps1, rng, r=args.svt_r, s=args.svt_s, c=args.svt_c, size=size,
            unsafe_float=True,
        )  # fmt: skip
    else:
        res = recursive_threshold(
            x, u, eps1, rng, theta0=args.svt_s, mu=args.mu, grid=grid, size=size,
            unsafe_float=True,
        )  # fmt: skip
    return res.theta


def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    trials = int(args.trials)
    if trials < 1:
        raise ValueError("--trials must be positive")
    for name in args.mechanisms:
        if name not in MECHANISMS:
            raise ValueError(f"unknown mechanism {name!r}; choose from {MECHANISMS}")
    for name in args.thresholds:
        if name not in _THRESHOLDS:
            raise ValueError(f"unknown threshold {name!r}; choose from {_THRESHOLDS}")
    for name in args.workloads:
        if name not in _WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; choose from {list(_WORKLOADS)}")
    wages = _wages(args.data)
    bins = NumericBins.uniform(0.0, args.high, args.bins)
    x = bins.histogram(wages)
    u = bins.values
    grid = exponential_grid(args.svt_s, args.svt_c, float(u.max()))
    key = SecretKey.for_testing(args.seed) if args.seed is not None else new_key()
    cache = _Cache(args)
    rows: list[dict[str, Any]] = []
    for wl in args.workloads:
        sums = SumWorkload(Domain(wage=bins.size), "wage", u, bins.prefixes(_WORKLOADS[wl]))
        true = sums.weighted() @ x.astype(float)
        m = true.size
        for eps in args.epsilons:
            eps_f = Fraction(repr(float(eps)))
            configs = [("none", Fraction(0))] if "none" in args.thresholds else []
            configs += [
                (t, Fraction(repr(float(r))))
                for t in args.thresholds
                if t != "none"
                for r in args.rhos
            ]
            for method, rho in configs:
                eps1 = rho * eps_f if rho > 0 else None
                eps2 = eps_f - (eps1 or 0)
                ident = ("bench-sums", wl, str(eps_f), method, str(rho))
                shared = _thresholds(
                    method, x, u, eps1, KeyedRNG(key, (*ident, "theta")), trials, args, grid
                )
                for name in args.mechanisms:
                    rng = KeyedRNG(key, (*ident, name))
                    noisy = np.empty((trials, m))
                    if name == "SQM":
                        per_q = None if eps1 is None else eps1 / m
                        th = _thresholds(method, x, u, per_q, rng, trials * m, args, grid)
                        th = th.reshape(trials, m)
                        for i in range(trials):
                            sqm = sum_mechanism("SQM", sums, th[i], PureDP(eps2))
                            noisy[i] = sqm.sample(x, rng, 1)[0]
                        theta_med = float(np.median(th))
                    else:
                        for theta in np.unique(shared):
                            idx = np.flatnonzero(shared == theta)
                            mech = cache.get(wl, sums, name, float(theta))
                            b = mech.noise_scale / float(eps2)  # cached at epsilon 1
                            z = rng.laplace(b, (idx.size, mech.strategy.shape[0]),
                                            unsafe_float=True)  # fmt: skip
                            noisy[idx] = (mech.output @ x.astype(float))[None, :] + mech.answer(z)
                        theta_med = float(np.median(shared))
                    rows.append(
                        {
                            "workload": wl,
                            "epsilon": float(eps),
                            "rho": float(rho),
                            "threshold": method,
                            "mechanism": name,
                            **_errors(noisy, true, args.delta),
                            "median_theta": None if math.isinf(theta_med) else theta_med,
                        }
                    )
    return {
        "data": str(args.data),
        "records": int(wages.size),
        "bins": int(bins.size),
        "bin_width": float(args.high) / bins.size,
        "trials": trials,
        "strategy": args.strategy,
        "objective": args.objective or "default (TiMM: total, TaMM: relative)",
        "svt": {"r": str(args.svt_r), "s": args.svt_s, "c": args.svt_c},
        "recursive": {"beta": "2 rho eps / 5", "mu": args.mu, "theta0": args.svt_s},
        "strategies_selected": len(cache.mechs),
        "wall_time_s": time.perf_counter() - t_start,
        "rows": rows,
        "checks": _checks(rows),
    }


def _find(rows: list[dict], **kw: Any) -> dict | None:
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _checks(rows: list[dict]) -> dict[str, Any]:
    """The paper's three findings, evaluated on this run's rows."""
    out: dict[str, Any] = {}
    lowered: dict[str, list[int]] = {}
    for r in rows:
        if r["threshold"] == "none" or r["epsilon"] != 0.01:
            continue
        base = _find(rows, workload=r["workload"], epsilon=r["epsilon"], threshold="none",
                     mechanism=r["mechanism"])  # fmt: skip
        if base is not None:
            tally = lowered.setdefault(f"{r['threshold']}_rho_{r['rho']:g}", [0, 0])
            tally[0] += r["mean_relative_error"] < base["mean_relative_error"]
            tally[1] += 1
    out["truncation_lowers_error_at_eps_0_01"] = {k: f"{a}/{b}" for k, (a, b) in lowered.items()}
    tamm_best = []
    for r in rows:
        if r["workload"] != "Q1" or r["mechanism"] != "TaMM":
            continue
        same = [
            s for s in rows
            if s["workload"] == "Q1" and s["epsilon"] == r["epsilon"] and s["rho"] == r["rho"]
            and s["threshold"] == r["threshold"]
        ]  # fmt: skip
        best = min(same, key=lambda s: s["mean_relative_error"])
        tamm_best.append(
            {
                "epsilon": r["epsilon"],
                "rho": r["rho"],
                "threshold": r["threshold"],
                "best": best["mechanism"],
                "tamm_over_best_other": r["mean_relative_error"]
                / min((s["mean_relative_error"] for s in same if s is not r), default=math.nan),
            }
        )
    out["q1_best_mechanism"] = tamm_best
    ratios = []
    for r in rows:
        if r["workload"] != "Q1" or r["mechanism"] != "TiMM":
            continue
        t = _find(rows, workload="Q1", epsilon=r["epsilon"], rho=r["rho"],
                  threshold=r["threshold"], mechanism="TaMM")  # fmt: skip
        if t is not None:
            ratios.append(
                {
                    "epsilon": r["epsilon"], "rho": r["rho"], "threshold": r["threshold"],
                    "timm_over_tamm_smallest_raw": r["mean_relative_error_smallest_raw"]
                    / t["mean_relative_error_smallest_raw"],
                    "timm_over_tamm_largest_raw": r["mean_relative_error_largest_raw"]
                    / t["mean_relative_error_largest_raw"],
                    "timm_over_tamm_smallest": r["mean_relative_error_smallest"]
                    / t["mean_relative_error_smallest"],
                    "timm_over_tamm_largest": r["mean_relative_error_largest"]
                    / t["mean_relative_error_largest"],
                }
            )  # fmt: skip
    out["q1_timm_over_tamm"] = ratios
    return out
