"""``dpdask bench reconstruct``: speed of ADMM and NNLS, and paper 001's accuracy findings.

Four parts, each against a baseline measured in the same run:

* ``admm_tree`` -- ADMM-L1 (tree form, Algorithm 3 of paper 001) on a
  ``--bins``-cell (default ``2**16``) binary hierarchical histogram of synthetic
  sparse counts at epsilon 1; the baseline is the least-squares tree projection.
  Target: under 5 s.
* ``nnls_cph`` -- NNLS per CPH-domain geography (2 x 2 x 63 x 17 x 115 =
  492,660 cells) of synthetic persons, ``--geographies`` of them, measured with the
  HDMM strategy that :func:`dpdask.strategy.select` chooses for the SF1 person
  tables at epsilon 1 (OPT_+, a union of two Kronecker products); the baseline is
  least squares through its joint diagonalisation (``KronPairInverse``, a
  generalised inverse: the union is rank deficient). Target: under 10 s each.
* ``nnls_kron`` -- NNLS per geography on the CPH domain with the Kronecker strategy
  HDMM selects for the SF1 person tables under zCDP (OPT_x, ``templates=["kron"]``),
  measured as a release measures it (the Gram root of the strategy, Gaussian noise):
  ``--geographies`` synthetic geographies one at a time; the baseline is least
  squares through the Kronecker pseudo-inverse. Reported: median seconds, products
  and Newton iterations per geography, the NNLS/LS time ratio, and the distance of
  answer from one solved to ``tol / 100`` (strategy answers, RMS in noise units).
* ``nnls_sizes`` -- robustness of the NNLS defaults: one geography per
  ``--populations`` size (small ones are the sparse case), both strategies above;
  min / median / max of products, Newton iterations and seconds.
* ``dpbench`` (needs ``../shared/data``) -- mean squared error of unit-length
  queries on NETTRACE and SEARCHLOGS (4096 bins), epsilon 0.1 and 1, binary
  hierarchical strategy, ``--trials`` noise draws: ADMM-L1 against the
  least-squares tree estimate (HTree, negatives set to 0 as in the paper).
* ``adult`` (needs ``../shared/data``) -- the Adult contingency table on six
  attributes with its one-way marginals known: ADMM-L1 (Algorithm 1) against the
  plain Laplace mechanism (negatives set to 0).

Noise comes from :meth:`dpdask.noise.KeyedRNG.for_testing` (a fixed seed), so the
figures are reproducible. Times are medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any

import numpy as np

from dpdask.linalg import Identity, Kron, Ones, VStack
from dpdask.noise import KeyedRNG
from dpdask.reconstruct import HierarchicalTree, admm, nnls
from dpdask_benchmarks._common import PeakRSS, median_time

__all__ = ["add_arguments", "run"]

_DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"
_ADULT_COLUMNS = ("workclass", "education-num", "marital-status", "race", "sex", "income>50K")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--bins", type=int, default=2**16, help="cells of the ADMM histogram")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per estimator")
    parser.add_argument("--trials", type=int, default=10, help="noise draws per finding")
    parser.add_argument("--seed", type=int, default=0, help="seed of data and test noise")
    parser.add_argument("--nnls-tol", type=float, default=1e-2, help="NNLS tolerance (noise units)")
    parser.add_argument(
        "--geographies", type=int, default=5, help="geographies for nnls_cph and nnls_kron"
    )
    parser.add_argument(
        "--populations",
        default="300,3000,30000,300000,3000000",
        help="persons of the nnls_sizes geographies (comma-separated)",
    )
    parser.add_argument("--data", default=str(_DATA), help="the shared data folder")
    parser.add_argument(
        "--parts",
        default="admm_tree,nnls_cph,nnls_kron,nnls_sizes,dpbench,adult",
        help="comma-separated parts to run",
    )


def _noise(seed: int, identity: tuple, scale: float, shape: Any) -> np.ndarray:
    return KeyedRNG.for_testing(seed, ("bench", "reconstruct", *identity)).laplace(
        scale, shape, unsafe_float=True
    )


def _admm_tree(args: argparse.Namespace) -> dict[str, Any]:
    n = args.bins
    gen = np.random.Generator(np.random.Philox(args.seed))
    x = gen.poisson(gen.gamma(0.1, 20.0, size=n)).astype(float)  # sparse, heavy-tailed
    T = HierarchicalTree(n, 2)
    H = T.strategy()
    b = T.levels / 1.0  # epsilon 1; L1 sensitivity = number of levels
    y = T.answers(x) + _noise(args.seed, ("tree",), b, T.m)
    t_admm, times, est = median_time(lambda: admm(H, y, tree=T, scale=b), args.repeats)
    t_ls, _, ls_nodes = median_time(lambda: T.project(y), args.repeats)
    ls = T.leaves(ls_nodes)
    return {
        "bins": n,
        "nodes": T.m,
        "zero_fraction": float((x == 0).mean()),
        "laplace_scale": b,
        "admm_s": t_admm,
        "admm_times_s": times,
        "admm_iterations": est.report.iterations,
        "admm_converged": est.report.converged,
        "admm_tolerance": est.report.tolerance,
        "ls_tree_s": t_ls,
        "admm_over_ls_time": t_admm / t_ls,
        "mse_admm": float(np.mean((est.x - x) ** 2)),
        "mse_ls_tree": float(np.mean((ls - x) ** 2)),
        "mse_ls_tree_clipped": float(np.mean((np.maximum(ls, 0) - x) ** 2)),
        "under_5s": t_admm < 5.0,
    }


def _cph_strategies(args: argparse.Namespace) -> dict[str, Any]:
    """The two HDMM SF1 strategies on the CPH domain, as NNLS sees them."""
    from dpdask.census import cph_domain
    from dpdask.linalg import gram_root
    from dpdask.privacy import PureDP, zCDP
    from dpdask.strategy import select
    from dpdask.workloads.sf1 import sf1_persons

    domain = cph_domain()
    wl = sf1_persons(domain)
    t0 = time.perf_counter()
    union = select(wl, PureDP(1), domain=domain, restarts=1, seed=args.seed).strategy
    t_select = time.perf_counter() - t0
    kron = select(wl, zCDP(1), domain=domain, templates=["kron"], restarts=1, seed=args.seed)
    return {
        "domain": domain,
        "union": union,
        "select_s": t_select,
        "kron": gram_root(kron.strategy),  # what a release measures under Gaussian noise
        "sigma": kron.noise_scale,
    }


def _nnls_union_case(
    args: argparse.Namespace, A: Any, x: np.ndarray, key: tuple, repeats: int
) -> dict[str, Any]:
    """NNLS (Laplace noise, epsilon 1) and the structured LS of one geography."""
    from dpdask.reconstruct.structured import structured_pinv

    b = A.sensitivity(1) / 1.0
    y = A @ x + _noise(args.seed, key, b, A.shape[0])
    w = 1.0 / (2.0 * b * b)  # inverse variance of Laplace(b): tol is in noise units
    t_nnls, _, est = median_time(lambda: nnls(A, y, weights=w, tol=args.nnls_tol), repeats)
    pinv = structured_pinv(A)  # KronPairInverse: a generalised inverse (A is rank deficient)
    t_ls, _, x_ls = median_time(lambda: pinv @ y, repeats)
    return {
        **_solve_row(x, est, t_nnls, t_ls),
        "answers_rmse_nnls": float(np.sqrt(np.mean((A @ est.x - A @ x) ** 2))),
        "answers_rmse_ls": float(np.sqrt(np.mean((A @ x_ls - A @ x) ** 2))),
    }


def _solve_row(x: np.ndarray, est: Any, t_nnls: float, t_ls: float) -> dict[str, Any]:
    """What every NNLS case reports: size, times, work and convergence."""
    return {
        "persons": int(x.sum()),
        "nnls_s": t_nnls,
        "ls_s": t_ls,
        "iterations": est.report.iterations,
        "products": est.report.details["products"],
        "restricted_products": est.report.details.get("restricted", 0),
        "converged": est.report.converged,
        "support": int((est.x > 0).sum()),
    }


def _nnls_kron_case(
    args: argparse.Namespace, A: Any, sigma: float, pinv: Any, x: np.ndarray, i: int, repeats: int
) -> dict[str, Any]:
    """NNLS (Gaussian noise) and the Kronecker pseudo-inverse LS of one geography."""
    w = 1.0 / sigma**2  # tol in noise units
    noise = KeyedRNG.for_testing(args.seed, ("bench", "reconstruct", "kron", i))
    y = A @ x + noise.gaussian(sigma, A.shape[0], unsafe_float=True)
    t_nnls, _, est = median_time(lambda: nnls(A, y, weights=w, tol=args.nnls_tol), repeats)
    t_ls, _, x_ls = median_time(lambda: pinv @ y, repeats)
    return {
        **_solve_row(x, est, t_nnls, t_ls),
        "cell_rmse_nnls": float(np.sqrt(np.mean((est.x - x) ** 2))),
        "cell_rmse_ls": float(np.sqrt(np.mean((x_ls - x) ** 2))),
        "_y": y,
        "_x": est.x,
    }


def _spread(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    vals = [r[key] for r in rows]
    return {"min": float(min(vals)), "median": float(np.median(vals)), "max": float(max(vals))}


def _nnls_cph(args: argparse.Namespace) -> dict[str, Any]:
    from dpdask.datasets import synthetic_block

    st = _cph_strategies(args)
    A = st["union"]
    X = synthetic_block(st["domain"], 0, args.geographies, seed=args.seed)
    X = X.reshape(args.geographies, -1).astype(float)
    with PeakRSS() as mem:
        rows = [
            _nnls_union_case(args, A, x, ("cph",) if i == 0 else ("cph", str(i)), args.repeats)
            for i, x in enumerate(X)
        ]
    med = {k: float(np.median([r[k] for r in rows])) for k in ("nnls_s", "ls_s", "products")}
    return {
        "cells": st["domain"].size,
        "strategy": repr(A),
        "strategy_rows": A.shape[0],
        "select_s": st["select_s"],
        "geographies": rows,
        "nnls_s": med["nnls_s"],
        "nnls_s_max": max(r["nnls_s"] for r in rows),
        "products_median": med["products"],
        "seconds_per_product": med["nnls_s"] / med["products"],
        "ls_s": med["ls_s"],
        "ls_method": "KronPairInverse",
        "nnls_over_ls_time": med["nnls_s"] / med["ls_s"],
        "all_converged": all(r["converged"] for r in rows),
        "peak_rss_gb": mem.peak / 1e9,
        "under_10s": max(r["nnls_s"] for r in rows) < 10.0,
    }


def _nnls_kron(args: argparse.Namespace) -> dict[str, Any]:
    from dpdask.datasets import synthetic_block

    st = _cph_strategies(args)
    A, sigma = st["kron"], st["sigma"]
    X = synthetic_block(st["domain"], 0, args.geographies, seed=args.seed)
    X = X.reshape(args.geographies, -1).astype(float)
    pinv = A.pinv()
    rows = []
    for i, x in enumerate(X):
        row = _nnls_kron_case(args, A, sigma, pinv, x, i, args.repeats)
        y, x_nnls = row.pop("_y"), row.pop("_x")
        ref = nnls(A, y, weights=1.0 / sigma**2, tol=args.nnls_tol / 100)
        row["answers_rms_diff_vs_tight"] = float(
            np.sqrt(np.mean((A @ (x_nnls - ref.x)) ** 2)) / sigma
        )
        rows.append(row)
    med = {k: float(np.median([r[k] for r in rows])) for k in ("nnls_s", "ls_s", "products")}
    return {
        "cells": st["domain"].size,
        "strategy": repr(A),
        "noise_sigma": sigma,
        "geographies": rows,
        "nnls_s_median": med["nnls_s"],
        "ls_s_median": med["ls_s"],
        "products_median": med["products"],
        "seconds_per_product": med["nnls_s"] / med["products"],
        "nnls_over_ls_time": med["nnls_s"] / med["ls_s"],
        "all_converged": all(r["converged"] for r in rows),
    }


def _nnls_sizes(args: argparse.Namespace) -> dict[str, Any]:
    """Robustness of the defaults: one synthetic geography per ``--populations`` size
    (small ones are the sparse case), both strategies, one run each."""
    from dpdask.datasets import synthetic_block

    st = _cph_strategies(args)
    pops = [int(p) for p in args.populations.split(",")]
    X = synthetic_block(st["domain"], 0, len(pops), seed=args.seed, population=pops)
    X = X.reshape(len(pops), -1).astype(float)
    pinv = st["kron"].pinv()
    union, kron = [], []
    for i, x in enumerate(X):
        union.append(_nnls_union_case(args, st["union"], x, ("sizes", str(i)), 1))
        row = _nnls_kron_case(args, st["kron"], st["sigma"], pinv, x, 1000 + i, 1)
        row.pop("_y"), row.pop("_x")
        kron.append(row)
    out: dict[str, Any] = {"union": union, "kron": kron}
    for name, rows in (("union", union), ("kron", kron)):
        for key in ("products", "iterations", "nnls_s"):
            out[f"{name}_{key}"] = _spread(rows, key)
        out[f"{name}_all_converged"] = all(r["converged"] for r in rows)
    return out


def _dpbench(args: argparse.Namespace, data: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    for name in ("NETTRACE", "SEARCHLOGS"):
        x = np.load(data / "dpbench" / "1D" / f"{name}.n4096.npy").astype(float)
        T = HierarchicalTree(x.size, 2)
        H = T.strategy()
        for eps in (0.1, 1.0):
            b = T.levels / eps
            Y = T.answers(x) + _noise(args.seed, ("dpbench", name, str(eps)), b, (args.trials, T.m))
            t0 = time.perf_counter()
            est = admm(H, Y, tree=T, scale=b)
            seconds = time.perf_counter() - t0
            ls = T.leaves(T.project(Y.T)).T
            mse_l1 = float(np.mean((est.x - x) ** 2))
            mse_ls = float(np.mean((np.maximum(ls, 0) - x) ** 2))
            rows.append(
                {
                    "dataset": name,
                    "epsilon": eps,
                    "trials": args.trials,
                    "mse_admm_l1": mse_l1,
                    "mse_htree_clipped": mse_ls,
                    "mse_htree_raw": float(np.mean((ls - x) ** 2)),
                    "ratio_l1_over_htree": mse_l1 / mse_ls,
                    "converged": est.report.converged,
                    "admm_s": seconds,
                }
            )
    return rows


def _adult(args: argparse.Namespace, data: pathlib.Path) -> list[dict[str, Any]]:
    sizes = json.loads((data / "adult" / "adult-domain.json").read_text())
    header = (data / "adult" / "adult.csv").read_text().split("\n", 1)[0].split(",")
    records = np.loadtxt(data / "adult" / "adult.csv", delimiter=",", skiprows=1, dtype=int)
    shape = tuple(sizes[c] for c in _ADULT_COLUMNS)
    x = np.zeros(shape)
    np.add.at(x, tuple(records[:, header.index(c)] for c in _ADULT_COLUMNS), 1.0)
    x = x.ravel()
    margins = VStack(
        [
            Kron([Identity(s) if j == i else Ones(s) for j, s in enumerate(shape)])
            for i in range(len(shape))
        ]
    )
    rows = []
    for eps in (0.1, 1.0):
        Y = x + _noise(args.seed, ("adult", str(eps)), 1.0 / eps, (args.trials, x.size))
        t0 = time.perf_counter()
        est = admm(Identity(x.size), Y, equality=(margins, margins @ x), scale=1.0 / eps)
        seconds = time.perf_counter() - t0
        mse_l1 = float(np.mean((est.x - x) ** 2))
        mse_lap = float(np.mean((np.maximum(Y, 0) - x) ** 2))
        rows.append(
            {
                "cells": x.size,
                "epsilon": eps,
                "trials": args.trials,
                "mse_admm_l1": mse_l1,
                "mse_laplace_clipped": mse_lap,
                "mse_laplace_raw": float(np.mean((Y - x) ** 2)),
                "ratio_l1_over_laplace": mse_l1 / mse_lap,
                "converged": est.report.converged,
                "admm_s": seconds,
            }
        )
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected parts; return their figures."""
    if args.bins < 2 or args.repeats < 1 or args.trials < 1 or args.geographies < 1:
        raise ValueError(
            "--bins must be at least 2 and --repeats, --trials, --geographies at least 1"
        )
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    known = {"admm_tree", "nnls_cph", "nnls_kron", "nnls_sizes", "dpbench", "adult"}
    if unknown := set(parts) - known:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {sorted(known)}")
    data = pathlib.Path(args.data)
    result: dict[str, Any] = {}
    singles = (
        ("admm_tree", _admm_tree),
        ("nnls_cph", _nnls_cph),
        ("nnls_kron", _nnls_kron),
        ("nnls_sizes", _nnls_sizes),
    )
    for name, single in singles:
        if name in parts:
            result.update({f"{name}.{k}": v for k, v in single(args).items()})
    for name, fn in (("dpbench", _dpbench), ("adult", _adult)):
        if name not in parts:
            continue
        if data.is_dir():
            result[name] = fn(args, data)
        else:
            result[name] = f"skipped: no shared data folder at {data}"
    return result
