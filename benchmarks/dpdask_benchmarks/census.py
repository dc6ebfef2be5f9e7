"""``dpdask bench census``: dpdask's plans against the Census Bureau's 2020 production strategy.

At the Bureau's production budget (persons ``rho = (542/339)^2 = 2.5562`` change-one,
``1.2781`` add/remove, :mod:`dpdask.strategy.tda2020`), each level at its facts-sheet
share of the persons budget (state to block by default), on the ``pl94-full``
workload (the Bureau's eleven query groups on the 2,016-cell histogram), per level and
query group:

``var_tda``
    the variance of a measured answer under ``tda-2020`` (the group measured directly;
    the closed form ``1 / (2 rho l q)``);
``var_hdmm``
    under ``hdmm`` with the group weights ``--weights`` (default the ``pl94`` preset),
    same level budget, least-squares answers;
``var_fitness``
    under ``fitness`` with ``tda-2020``'s variances as targets, rescaled to the same
    level budget (its variances are then ``budget_ratio`` times the targets or less);

each the **largest** variance among the group's queries (``tda-2020``'s are equal
within a group). ``budget_ratio`` is the certified least budget of the fitness plan
meeting every ``tda-2020`` variance, over the Bureau's budget for the level (below 1:
as accurate as the Bureau on every query with less budget). ``budget_ratio_bound`` is
the least ratio any data-independent Gaussian mechanism with least-squares answers can
reach (:func:`dpdask.strategy.tda2020_bound.budget_ratio_bound`, a certified lower
bound); ``budget_ratio`` equal to it means the fitness plan is optimal. Plans only: no
data.

``--part compare`` (issue 33) releases a synthetic state with these plans and compares
the estimators: bottom-up least squares, today's top-down and the multi-pass top-down
with the Bureau's invariants and constraints (:mod:`dpdask_benchmarks._census_compare`).
``--part linear`` gives the expected errors of least squares and the multi-pass total
pass on the same state's tree from their linear models, where a few keys cannot rank
them (:mod:`dpdask_benchmarks._census_linear`).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import numpy as np

from dpdask import census
from dpdask.privacy import zCDP
from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, convert
from dpdask.strategy import select
from dpdask.strategy.tda2020 import LEVELS, PERSONS_RHO_CHANGE_ONE, level_budget
from dpdask.strategy.tda2020_bound import budget_ratio_bound
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS, pl94_full
from dpdask_benchmarks._census_compare import add_compare_arguments, run_compare
from dpdask_benchmarks._census_linear import run_linear

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument(
        "--levels", nargs="+", default=list(LEVELS[1:]), choices=list(LEVELS),
        help="levels to compare (default state to block)",
    )  # fmt: skip
    parser.add_argument(
        "--rho-change-one", default=str(PERSONS_RHO_CHANGE_ONE),
        help="persons budget, zCDP rho under change-one neighbours (default the Bureau's)",
    )  # fmt: skip
    parser.add_argument("--weights", default="pl94", help="HDMM group-weight preset")
    parser.add_argument("--restarts", type=int, default=1, help="HDMM random starts")
    parser.add_argument(
        "--part", default="plans", choices=("plans", "compare", "linear"),
        help="plans: the budget ratios (no data); compare: the estimators on a synthetic "
        "state; linear: their expected errors on its tree by their linear models",
    )  # fmt: skip
    add_compare_arguments(parser)
    parser.add_argument(
        "--trials", type=int, default=2000, help="linear: draws of the units' total errors"
    )


def _group_max(v: np.ndarray, offsets: np.ndarray) -> list[float]:
    return [float(v[a:b].max()) for a, b in itertools.pairwise(offsets)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Plan every level three ways; per group the largest variance, per level the ratio
    (``--part compare``: :func:`~dpdask_benchmarks._census_compare.run_compare`)."""
    if args.part == "compare":
        return run_compare(args)
    if args.part == "linear":
        return run_linear(args)
    W = pl94_full()
    domain = census.pl94_full_domain()
    persons = convert(zCDP(args.rho_change_one), CHANGE_ONE, ADD_REMOVE)
    offsets = np.cumsum([0] + [p.shape[0] for p in W.parts])
    out: list[dict[str, Any]] = []
    for lv in args.levels:
        budget = level_budget(persons, lv)
        t0 = time.perf_counter()
        tda = select(W, budget, "tda-2020", domain=domain, level=lv)
        t1 = time.perf_counter()
        hdmm = select(W, budget, "hdmm", domain=domain, weights=args.weights,
                      restarts=args.restarts)  # fmt: skip
        t2 = time.perf_counter()
        fit = select(W, None, "fitness", domain=domain, targets="tda-2020", level=lv,
                     persons=persons)  # fmt: skip
        t3 = time.perf_counter()
        ratio = float(fit.info["budget_ratio"])
        bound = budget_ratio_bound(lv, persons)  # type: ignore[arg-type]
        # the fitness plan at the Bureau's budget: every variance scales by 1 / budget
        scale = float(fit.zcdp().rho) / float(budget.rho)  # type: ignore[attr-defined]
        v_tda = _group_max(tda.query_variances(), offsets)
        v_hdmm = _group_max(hdmm.query_variances(), offsets)
        v_fit = _group_max(fit.query_variances() * scale, offsets)
        out.append(
            {
                "level": lv,
                "budget_ratio": ratio,
                "budget_ratio_bound": bound,
                "rho_tda": float(budget.rho),  # type: ignore[attr-defined]
                "rho_fitness": float(fit.zcdp().rho),
                "hdmm_template": hdmm.template,
                "seconds": {"tda": t1 - t0, "hdmm": t2 - t1, "fitness": t3 - t2},
                "groups": [
                    {"group": g, "var_tda": a, "var_hdmm": b, "var_fitness": c}
                    for g, a, b, c in zip(PL94_FULL_GROUPS, v_tda, v_hdmm, v_fit, strict=True)
                ],
            }
        )
    return {
        "persons_rho_change_one": float(zCDP(args.rho_change_one).rho),
        "persons_rho_add_remove": float(persons.rho),  # type: ignore[attr-defined]
        "variance": "largest per-query variance within each group, at the level's budget",
        "weights": args.weights,
        "levels": out,
    }
