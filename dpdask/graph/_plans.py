"""Every released level's plan: the one place ``plan`` and ``run`` get them from.

A release spends its budget over its geography levels: one plan whose budget the levels
split (:func:`dpdask.privacy.split_levels`), or a plan per level spending its own.
:func:`level_plans` makes each level's plan (:meth:`dpdask.strategy.Plan.at`: the
measured strategy and its calibration, shared by the levels of one base plan) and, when
the data's dtype is known, fixes the noise the measure step draws for it
(:func:`realised`), so that the variances ``dpdask plan`` prints are those ``dpdask run``
publishes. :func:`structured_inverse` and :func:`fused` decide, once per base plan, how
least squares is computed on a level's chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg import Kron, LinearQuery
from dpdask.measure import DEFAULT_MAX_TOTAL, lattice
from dpdask.privacy import Budget, split_levels
from dpdask.reconstruct.structured import full_column_rank, structured_pinv
from dpdask.strategy import Plan

__all__ = [
    "LevelShares",
    "PlanLike",
    "as_plan",
    "fused",
    "level_plans",
    "mean_cell_variance",
    "realised",
    "structured_inverse",
    "total_budget",
]


class PlanLike(Protocol):
    """What a release needs of a plan: a :class:`~dpdask.strategy.Plan`, or an object
    with its workload, strategy, budget and domain (:func:`as_plan`)."""

    @property
    def workload(self) -> LinearQuery: ...

    @property
    def strategy(self) -> LinearQuery: ...

    @property
    def privacy(self) -> Budget: ...

    @property
    def domain(self) -> Domain | None: ...


LevelShares = Mapping[str, object] | Sequence[object]
"""Each level's share of a single plan's budget (:func:`dpdask.privacy.split_levels`)."""


def level_plans(
    plans: PlanLike | Mapping[str, PlanLike],
    levels: Sequence[str],
    budget_split: LevelShares | None = None,
    *,
    dtype: npt.DTypeLike | None = None,
    max_total: int = DEFAULT_MAX_TOTAL,
    moves: Mapping[str, str] | None = None,
) -> dict[str, Plan]:
    """Each released level's plan, in the order of ``levels``.

    Parameters
    ----------
    plans : Plan or mapping of level to Plan
        One plan whose budget the levels split, or a plan per level (each spending its
        own budget).
    levels : sequence of str
        The released levels.
    budget_split : mapping of level to share, or sequence, optional
        With a single plan: each level's share of its budget (default even).
    dtype : numpy dtype, optional
        The data's dtype (public metadata) when known: each level's noise is then fixed
        as the measure step draws it (:func:`realised`); nominal otherwise.
    max_total : int
        The public bound on one geography's total the lattice is sized for.
    moves : mapping of level to level, optional
        Levels that are not measured (a top-down release's spine levels,
        :mod:`~dpdask.graph._spine`) and the measured level each one's budget moves to:
        that level's plan is calibrated once for its budget plus theirs, and theirs is
        that plan (their estimates are its level's).

    Returns
    -------
    dict of str to Plan

    Raises
    ------
    dpdask.errors.ArgumentError
        For a level without a plan, a split given with per-level plans, or a split that
        does not match the levels (naming ``budget_split``).
    dpdask.errors.PlanError
        If a level's budget cannot be spent with its plan's mechanism.
    """
    if isinstance(plans, Mapping):
        missing = [lv for lv in levels if lv not in plans]
        if missing:
            raise ArgumentError(f"no plan for level(s) {missing}")
        if budget_split is not None:
            raise ArgumentError(
                "budget_split goes with a single plan; per-level plans carry their own"
            )
        out = {lv: as_plan(plans[lv]).at(plans[lv].privacy, operator=True) for lv in levels}
    else:
        base = as_plan(plans)
        try:
            budgets = split_levels(base.privacy, levels, budget_split)
        except ValueError as exc:
            raise ArgumentError(f"budget_split: {exc}") from None
        out = {lv: base.at(b, operator=True) for lv, b in budgets.items()}
    if moves:
        out = _move_budgets(out, moves)
    if dtype is not None:
        out = {lv: realised(p, dtype, max_total) for lv, p in out.items()}
    return out


def _move_budgets(plans: dict[str, Plan], moves: Mapping[str, str]) -> dict[str, Plan]:
    """``plans`` with the budget of every level in ``moves`` added to the level it moves
    to, whose plan is recalibrated once for the sum (:meth:`Plan.at`); a moved level's
    plan is then its receiver's. The levels' budgets still sum to the same total."""
    out = dict(plans)
    for to in dict.fromkeys(moves.values()):
        if to in moves or to not in plans:
            raise ArgumentError(f"level {to!r} receives a moved budget but is not measured")
        given = [plans[lv].privacy for lv, t in moves.items() if t == to]
        out[to] = plans[to].at(sum(given, start=plans[to].privacy), operator=True)
    for lv, to in moves.items():
        out[lv] = out[to]
    return out


def as_plan(plan: PlanLike) -> Plan:
    """``plan``, or a :class:`~dpdask.strategy.Plan` of the same workload, strategy, budget
    and domain for a plan-like object made elsewhere (a test's dense oracle): its noise
    is calibrated here, by the one calibration, whatever it says.

    Raises
    ------
    dpdask.errors.ArgumentTypeError
        If ``plan`` has no workload, strategy, privacy or domain.
    """
    if isinstance(plan, Plan):
        return plan
    try:
        workload, strategy, privacy = plan.workload, plan.strategy, plan.privacy
        domain = plan.domain
    except AttributeError as exc:
        raise ArgumentTypeError(f"not a plan: {plan!r} ({exc})") from None
    return Plan(workload, strategy, privacy, domain=domain)


def total_budget(plans: Mapping[str, Plan]) -> Budget:
    """What the levels' plans spend together (sequential composition)."""
    budgets = [p.privacy for p in plans.values()]
    return sum(budgets, start=budgets[0].zero())


def realised(plan: Plan, dtype: npt.DTypeLike, max_total: int = DEFAULT_MAX_TOTAL) -> Plan:
    """``plan`` with its noise as the measure step draws it for data of ``dtype``: the
    lattice and scale of :func:`dpdask.measure.lattice` (no data read)."""
    return plan.realise(lattice(plan, dtype, max_total))


def structured_inverse(plan: Plan) -> LinearQuery | None:
    """The measured strategy's pseudo-inverse when it is structured (Kronecker
    products, unions of two of them; :func:`~dpdask.reconstruct.structured.structured_pinv`),
    computed once for the levels of one base plan."""

    def compute() -> LinearQuery | None:
        with threadpool_limits(limits=1, user_api="blas"):
            return structured_pinv(plan.strategy)

    return plan.shared("pinv", compute)


def fused(plan: Plan, reconstruct: str) -> bool:
    """Whether measure and least squares fuse into ``x + A^+ z`` for a level
    (:func:`~dpdask.graph._blocks.estimate_block`): a least-squares estimator and a
    strategy of full column rank with a structured pseudo-inverse."""
    pinv = structured_inverse(plan)
    if reconstruct not in ("ls", "wls") or pinv is None:
        return False

    def compute() -> bool:
        with threadpool_limits(limits=1, user_api="blas"):
            return bool(full_column_rank(plan.strategy, pinv))

    return plan.shared("full_rank", compute)


def mean_cell_variance(A: LinearQuery) -> float:
    """``trace((A^T A)^+) / n``: the average variance of a cell's least-squares estimate
    per unit of noise variance (factor by factor for Kronecker strategies)."""
    if isinstance(A, Kron):
        return float(np.prod([mean_cell_variance(f) for f in A.factors]))
    # the pseudo-inverse's trace from the eigenvalues alone (numpy's pinv cut-off), not
    # from the pseudo-inverse itself: no eigenvectors, no products of n x n matrices
    lam = np.linalg.eigvalsh(A.gram().dense())
    cut = max(lam.size, 1) * np.finfo(float).eps * np.abs(lam).max(initial=0.0)
    kept = lam[np.abs(lam) > cut]
    return float(np.sum(1.0 / kept) / A.shape[1])
