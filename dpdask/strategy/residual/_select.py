"""Reading a marginal workload from operators and planning it: ``strategy="residual"``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import Identity, LinearQuery, Ones
from dpdask.privacy import Budget
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.residual._plan import ResidualPlan
from dpdask.strategy.residual._solve import (
    ResidualSolution,
    solve_max,
    solve_sum,
    solve_targets,
)
from dpdask.strategy.residual._workload import MarginalWorkload

__all__ = ["OBJECTIVES", "as_marginals", "plan_residual", "solve"]

OBJECTIVES = ("sum", "max", "targets")


def as_marginals(
    workload: LinearQuery | MarginalWorkload, sizes: Sequence[int] | None = None
) -> MarginalWorkload | None:
    """The workload as marginals, or ``None`` if some term is not a marginal.

    A term is a marginal when every factor is the identity or the total (``Ones(n)``).
    """
    if isinstance(workload, MarginalWorkload):
        return workload
    try:
        terms = kron_terms(workload, sizes)
    except ValueError:
        return None
    sets = []
    for fs in terms.factors:
        kept = []
        for i, f in enumerate(fs):
            if isinstance(f, Identity):
                kept.append(i)
            elif not (isinstance(f, Ones) and f.m == 1):
                return None
        sets.append(kept)
    w = np.abs(terms.weights)
    if np.any(w == 0):
        return None
    return MarginalWorkload(terms.sizes, sets, w, names=terms.names)


def solve(
    W: MarginalWorkload,
    objective: str = "sum",
    *,
    targets: Any = None,
    gap: float = 1e-9,
) -> ResidualSolution:
    """The optimal residual precisions for ``objective`` (``"sum"``, ``"max"``, ``"targets"``)."""
    if objective == "sum":
        return solve_sum(W)
    if objective == "max":
        return solve_max(W, gap=gap)
    if objective == "targets":
        if targets is None:
            raise PlanError("objective 'targets' needs targets (one variance per marginal)")
        t = np.asarray(targets, dtype=float).reshape(-1)
        if t.shape != (W.m,) or not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise PlanError(f"targets must be {W.m} positive finite per-cell variances")
        return solve_targets(W, t, gap=gap)
    raise PlanError(f"unknown residual objective {objective!r}; choose one of {OBJECTIVES}")


def plan_residual(
    workload: LinearQuery | MarginalWorkload,
    privacy: Budget | None,
    *,
    domain: Domain | None = None,
    objective: str = "sum",
    targets: Any = None,
    gap: float = 1e-9,
    template: str = "residual",
) -> ResidualPlan:
    """Plan a marginal workload with the optimal residual strategy.

    Parameters
    ----------
    workload : LinearQuery or MarginalWorkload
        Marginals (every Kronecker term's factors identities or totals), weighted.
    privacy : zCDP, ApproxDP or None
        The budget. ``None`` only with ``objective="targets"``: the plan then has
        the least zCDP budget meeting the targets (:meth:`ResidualPlan.least_budget`).
    domain : Domain, optional
    objective : {"sum", "max", "targets"}
        Total weighted variance (closed form), the largest weighted per-cell
        variance, or per-marginal per-cell variance targets (``targets``): the
        least budget meeting them, or with a budget the least ``max_S V_S / tau_S``.
    targets : array_like, optional
        One per-cell variance per marginal (in the marginals' order).
    gap : float
        Relative duality gap at which the convex programs stop.

    Raises
    ------
    PlanError
        If the workload is not made of marginals, the budget is pure DP, or the
        objective or targets are invalid.
    """
    sizes = domain.shape if domain is not None else None
    W = as_marginals(workload, sizes)
    if W is None:
        raise PlanError(
            "the residual strategy needs a marginal workload (Kronecker terms of "
            "identities and totals)"
        )
    sol = solve(W, objective, targets=targets, gap=gap)
    info = {
        "objective": sol.objective,
        "residuals": len(sol.precision),
        "marginals": W.m,
        "value": sol.value,
        "lower_bound": sol.lower_bound,
        "gap": sol.gap,
        "iterations": sol.iterations,
        "optimisation_wall_time_s": sol.wall_time_s,
    }
    op = None if isinstance(workload, MarginalWorkload) else workload
    if privacy is None:
        if objective != "targets":
            raise PlanError("a residual plan without a budget needs objective='targets'")
        probe = ResidualPlan(W, sol, _unit_zcdp(), domain=domain, workload=op)
        privacy = probe.least_budget()
    return ResidualPlan(W, sol, privacy, domain=domain, workload=op, template=template, info=info)


def _unit_zcdp() -> Budget:
    from dpdask.privacy import zCDP

    return zCDP(1)
