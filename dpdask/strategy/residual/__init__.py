"""The residual strategy: the optimal Gaussian mechanism for marginal workloads.

After Xiao, He, Zhang and Kifer (NeurIPS 2023, "ResidualPlanner"): every
marginal is a sum of mutually orthogonal *residuals*, one per subset of its
attributes; measuring each residual with its own Gaussian noise scale makes
every marginal's variance a sum of per-residual terms and the privacy cost a
sum too, so the optimal noise is a closed form (sum of variances) or a small
convex program with a certified dual bound (largest variance, variance targets).
Selection works on attribute subsets only, never on cells.

* :class:`MarginalWorkload`: marginals (attribute sets) with weights, the
  residual closure and the variance algebra (:mod:`._workload`);
* :func:`solve_sum`, :func:`solve_max`, :func:`solve_targets`: the optimum;
* :class:`ResidualPlan`, :func:`plan_residual`: the :class:`~dpdask.strategy.Plan`
  that ``dpdask.select(W, zCDP(...), strategy="residual")`` returns;
Residual answers from records or marginal tables are :mod:`dpdask.measure.residual`;
reconstruction in marginal space is :mod:`dpdask.reconstruct.residual`.
"""

from dpdask.strategy.residual._plan import (
    ResidualPlan,
    helmert,
    helmert_integer,
    helmert_scales,
    helmert_transpose,
    marginal_operator,
    residual_operator,
)
from dpdask.strategy.residual._select import OBJECTIVES, as_marginals, plan_residual, solve
from dpdask.strategy.residual._solve import ResidualSolution, solve_max, solve_sum, solve_targets
from dpdask.strategy.residual._workload import (
    MarginalWorkload,
    Pairs,
    all_subsets,
    marginal_covariance,
)

__all__ = [
    "OBJECTIVES",
    "MarginalWorkload",
    "Pairs",
    "ResidualPlan",
    "ResidualSolution",
    "all_subsets",
    "as_marginals",
    "helmert",
    "helmert_integer",
    "helmert_scales",
    "helmert_transpose",
    "marginal_covariance",
    "marginal_operator",
    "plan_residual",
    "residual_operator",
    "solve",
    "solve_max",
    "solve_sum",
    "solve_targets",
]
