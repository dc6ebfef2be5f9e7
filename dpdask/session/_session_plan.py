"""What a session plans and spends: :class:`SessionPlan` (a plan selected without the
data) and :class:`Spending` (budget spent or left), and budgets in a spec's form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpdask.errors import SpecError
from dpdask.privacy import Budget, PureDP, zCDP

if TYPE_CHECKING:  # pragma: no cover
    from dpdask.strategy import Plan

__all__ = ["SessionPlan", "Spending", "budget_mapping", "total"]


def budget_mapping(budget: Budget | Mapping[str, Any]) -> dict[str, Any]:
    """A budget in a spec's form: ``{zcdp: ...}`` or ``{epsilon: ..., delta: ...}``,
    exact (fractions as text); a mapping is taken as a spec's ``privacy`` budget.

    Examples
    --------
    >>> from dpdask.privacy import ApproxDP, zCDP
    >>> budget_mapping(zCDP("1/3"))
    {'zcdp': '1/3'}
    >>> budget_mapping(ApproxDP(1, "1e-9"))
    {'epsilon': '1', 'delta': '1/1000000000'}
    """
    if isinstance(budget, Mapping):
        return dict(budget)
    if isinstance(budget, zCDP):
        return {"zcdp": str(budget.rho)}
    if isinstance(budget, PureDP):
        return {"epsilon": str(budget.epsilon)}
    fields = budget.to_dict()
    if set(fields) == {"type", "epsilon", "delta"}:
        return {"epsilon": fields["epsilon"], "delta": fields["delta"]}
    raise SpecError(f"budget: {budget!r} has no spec form")


@dataclass(frozen=True)
class Spending:
    """Budget spent or left, for this session and for its dataset.

    ``session``: the session's own (charged by its runs; left of its ``budget=`` cap,
    ``None`` without one). ``dataset``: the dataset's, as the ledger records it (left of
    its lifetime budget, ``None`` without one).
    """

    session: Budget | None
    dataset: Budget | None


@dataclass(frozen=True)
class SessionPlan:
    """A plan of :meth:`Session.plan`: what to release, selected without the data.

    Attributes
    ----------
    workload, strategy : str or dict
        As a spec's ``workload`` and ``strategy``.
    budget : Budget
        The release's total, split over ``levels`` (``split``: the shares).
    levels : tuple of str
        The released levels, coarsest first.
    plan : Plan or dict of str to Plan
        The selected strategy (one per level for per-level workloads or strategies;
        ``None`` only in a draft, before selection).
    report : dict
        What ``dpdask plan`` reports: per level its budget, noise scale and expected
        errors (``report["levels"]``).
    """

    workload: str | Mapping[str, Any]
    budget: Budget
    levels: tuple[str, ...]
    strategy: str | Mapping[str, Any]
    split: dict[str, Any] | None
    plan: Plan | Mapping[str, Plan] | None = field(repr=False)
    report: dict[str, Any] = field(repr=False)

    @property
    def expected(self) -> dict[str, dict[str, float]]:
        """Per level: ``rmse_per_query`` and ``max_query_stddev`` (persons)."""
        return {
            row["level"]: {k: row[k] for k in ("rmse_per_query", "max_query_stddev")}
            for row in self.report["levels"]
        }


def total(budgets: list[Budget]) -> Budget | None:
    """The sum of ``budgets`` (``None`` for none)."""
    return sum(budgets[1:], start=budgets[0]) if budgets else None
