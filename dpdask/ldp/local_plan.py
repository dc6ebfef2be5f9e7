"""The plan of a local-model collection: what :func:`select_local` returns.

An :class:`LdpPlan` is data-independent, like the central :class:`~dpdask.Plan`: the
workload, the budget, the optimised strategy every device runs, and what to expect from
it (per person: worst-case and average-case variance; the people needed for a target
normalised variance), compared with every baseline and the lower bound.
"""

from __future__ import annotations

import math
import os
from typing import Any

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.ldp.bounds import lower_bound
from dpdask.ldp.optimize import optimize
from dpdask.ldp.strategy import LocalStrategy, as_epsilon
from dpdask.privacy import PureDP

__all__ = ["LdpPlan", "select_local"]


class LdpPlan:
    """A local-model plan: the strategy, its variances, and the comparison with baselines.

    Attributes
    ----------
    workload : LinearQuery or ndarray
    privacy : PureDP
        The budget each person spends (``epsilon``-LDP).
    strategy : LocalStrategy
        The ``Q`` every device runs (write it with :meth:`save_strategy`).
    model : str
        ``"local"``.
    """

    model = "local"
    mechanism = "local-randomizer"

    def __init__(self, workload: Any, strategy: LocalStrategy, privacy: PureDP, alpha: float):
        self.workload = workload
        self.strategy = strategy
        self.privacy = privacy
        self.alpha = float(alpha)

    @property
    def worst_variance(self) -> float:
        """Worst-case total variance per person (over the person's type)."""
        return self.strategy.worst_variance(self.workload)

    @property
    def average_variance(self) -> float:
        """Average-case total variance per person (types uniform)."""
        return self.strategy.average_variance(self.workload)

    def sample_complexity(self, alpha: float | None = None) -> float:
        """People needed for normalised worst-case variance ``alpha`` (default the plan's)."""
        return self.strategy.sample_complexity(
            self.workload, self.alpha if alpha is None else alpha
        )

    def expected_error(self, people: int) -> float:
        """Worst-case expected total squared error of the workload answers for ``people``."""
        return float(people) * self.worst_variance

    @property
    def baselines(self) -> dict[str, dict[str, Any]]:
        """Every baseline's summary (worst/average variance, sample complexity)."""
        cands = self.strategy.info.get("candidates", {})
        return {k: v for k, v in cands.items() if not k.startswith("optimized")}

    def lower_bound(self) -> float:
        """Lower bound on the worst-case variance per person of any factorization mechanism."""
        return lower_bound(self.workload, self.privacy)

    def summary(self, as_dict: bool = False) -> str | dict[str, Any]:
        """What to expect, and how the chosen strategy compares with every baseline."""
        d: dict[str, Any] = {
            "model": "local",
            "epsilon": str(as_epsilon(self.privacy)),
            "queries": int(self.workload.shape[0]),
            "types": int(self.workload.shape[1]),
            "outputs": int(self.strategy.shape[0]),
            "winner": self.strategy.info.get("winner"),
            "worst_variance_per_person": self.worst_variance,
            "average_variance_per_person": self.average_variance,
            "alpha": self.alpha,
            "sample_complexity": self.sample_complexity(),
            "lower_bound_per_person": self.lower_bound(),
            "baselines": {
                k: {
                    "worst_variance_per_person": v.get("worst_variance"),
                    "sample_complexity": v.get("sample_complexity"),
                    "ratio_to_chosen": (v.get("worst_variance") or math.inf) / self.worst_variance,
                }
                for k, v in self.baselines.items()
            },
        }
        if as_dict:
            return d
        lines = [
            f"local model, epsilon = {d['epsilon']}: {d['types']} types, {d['outputs']} outputs",
            f"worst-case variance per person {d['worst_variance_per_person']:.6g} "
            f"(average {d['average_variance_per_person']:.6g}, lower bound "
            f"{d['lower_bound_per_person']:.6g})",
            f"people for normalised variance {self.alpha:g}: {d['sample_complexity']:.6g}",
        ]
        for k, v in d["baselines"].items():
            lines.append(f"  {k}: {v['ratio_to_chosen']:.3g} x the variance")
        return "\n".join(lines)

    def save_strategy(self, path: str | os.PathLike[str]) -> None:
        """Write the devices' JSON strategy file."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.strategy.to_json())

    def __repr__(self) -> str:
        return (
            f"LdpPlan(epsilon={float(as_epsilon(self.privacy)):g}, "
            f"strategy={self.strategy!r}, worst_variance={self.worst_variance:.6g})"
        )


def select_local(workload: Any, privacy: Any, *, alpha: float = 0.01, **options: Any) -> LdpPlan:
    """Optimise a local strategy for ``workload`` (options of :func:`dpdask.ldp.optimize`).

    Raises
    ------
    BudgetTypeError
        If ``privacy`` is not pure DP (local randomizers here are ``epsilon``-LDP).
    PlanError
        If ``epsilon`` is not positive.
    """
    if not isinstance(privacy, PureDP):
        raise BudgetTypeError(
            f"the local model needs a PureDP budget, got {type(privacy).__name__}"
        )
    if privacy.epsilon <= 0:
        raise PlanError("the local model needs epsilon > 0")
    S = optimize(workload, privacy, alpha=alpha, **options)
    return LdpPlan(workload, S, privacy, alpha)
