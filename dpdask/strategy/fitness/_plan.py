"""A release plan for the fitness-for-use mechanism: ``dpdask.select(..., strategy="fitness")``.

The mechanism of paper 000 releases ``L (B x + N(0, Sigma))``. The plan measures it as a
matrix mechanism with i.i.d. Gaussian noise on the *whitened* strategy

``A = F^-1 B``, with ``F F^T = Sigma`` (``F`` the lower Cholesky factor),

which makes the release step free: ``A`` has full row rank ``r <= d`` (``F`` is invertible
and ``B`` has independent rows), so ``A A^+ = I`` and ``B A^+ = F A A^+ = F``. Least squares
on ``y = A x + sigma_g e`` gives ``x_hat = A^+ y`` and

``B x_hat = B x + sigma_g F e ~ B x + N(0, sigma_g^2 Sigma)``,
``W x_hat = L B x_hat = L (B x + N(0, sigma_g^2 Sigma))``,

the paper's unbiased release, exactly. The column norms of ``A`` are the privacy profile
of ``Sigma`` (``||A e_j||^2 = b_j^T Sigma^-1 b_j``) and its L2 sensitivity the privacy cost,
so calibrating the Gaussian ``sigma_g`` to the budget (``sigma_g = cost / sqrt(2 rho)``
under zCDP, the analytic Gaussian under (epsilon, delta)) is Problem 2's rescaling
(Theorem 3.1): the covariance actually released is ``sigma_g^2 Sigma`` with privacy cost
``cost / sigma_g``, the largest the budget admits.

For a Kronecker solution ``A = (x) F_i^-1 B_i`` (the Kronecker product of the factors'
whitened bases; ``F = (x) F_i`` is the Cholesky factor of ``(x) Sigma_i``). A union of
independently measured parts stacks the parts' whitened strategies and answers each
workload part from its own measurement (the plan's ``groups``): the stacked column norms
are the union's privacy profile and the reported variances are those of the block
release (least squares over the whole stack can only be more accurate).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ArgumentTypeError, PlanError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, VStack
from dpdask.privacy import ApproxDP, Budget, gaussian_delta, zCDP
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.fitness._solution import (
    COST_MARGIN,
    FitnessResult,
    FitnessSolution,
    KronFitnessSolution,
    UnionFitnessSolution,
)
from dpdask.strategy.plan import Plan

__all__ = ["FitnessPlan", "fitness_plan", "whitened_strategy"]

# Per-query ratios are listed in the summary up to this many queries (maxima always).
SUMMARY_MAX_QUERIES = 1000


def _whiten_dense(sol: FitnessSolution) -> Dense:
    F = sol.noise_factor().matrix  # lower triangular, F F^T = Sigma
    if isinstance(sol.basis, Identity):
        B = np.eye(sol.basis.n)
    else:
        B = sol.basis.dense()
    return Dense(sla.solve_triangular(F, B, lower=True, check_finite=False))


def whitened_strategy(sol: FitnessResult) -> LinearQuery:
    """``A = Sigma^{-1/2} B`` (``F^-1 B`` with ``F`` the Cholesky factor of ``Sigma``).

    Parameters
    ----------
    sol : FitnessResult
        A dense, Kronecker or union solution of :func:`dpdask.strategy.fitness.solve`.

    Returns
    -------
    LinearQuery
        :class:`~dpdask.linalg.Dense` for a dense solution, a
        :class:`~dpdask.linalg.Kron` of the factors' for a product, a
        :class:`~dpdask.linalg.VStack` of the parts' for a union.
    """
    if isinstance(sol, FitnessSolution):
        return _whiten_dense(sol)
    if isinstance(sol, KronFitnessSolution):
        return Kron([_whiten_dense(f) for f in sol.factors])
    if isinstance(sol, UnionFitnessSolution):
        return VStack([whitened_strategy(p) for p in sol.parts])
    raise ArgumentTypeError(f"not a fitness-for-use solution: {sol!r}")


class FitnessPlan(Plan):
    """A :class:`~dpdask.strategy.Plan` for the fitness-for-use mechanism (paper 000).

    ``strategy`` is the whitened ``A = Sigma^{-1/2} B`` of a solution (see the module
    docstring); ``noise_scale`` is the Gaussian ``sigma_g`` the budget gives it, so the
    released covariance on ``B x`` is ``sigma_g^2 Sigma``.

    Parameters
    ----------
    workload, strategy, privacy, domain, groups, info, sizes
        As for :class:`~dpdask.strategy.Plan` (``privacy`` a zCDP or ApproxDP budget).
    targets : array_like
        The variance target of every query (relative targets under Problem 2).
    template : str
        ``"fitness"``.

    Raises
    ------
    ValueError
        If the budget admits no Gaussian noise or the targets do not match the workload.
    """

    kind = "fitness"

    def __init__(
        self,
        workload: LinearQuery,
        strategy: LinearQuery,
        privacy: Budget,
        *,
        targets: Any,
        domain: Domain | None = None,
        groups: Any = None,
        template: str = "fitness",
        info: dict[str, Any] | None = None,
        sizes: Any = None,
    ):
        super().__init__(
            workload, strategy, privacy, domain=domain, groups=groups, template=template,
            info=info, sizes=sizes,
        )  # fmt: skip
        if self.mechanism != "gaussian":
            raise PlanError(
                "the fitness-for-use mechanism adds Gaussian noise: give a zCDP or "
                f"(epsilon, delta) budget, not {privacy!r}"
            )
        c = np.asarray(targets, dtype=float).reshape(-1)
        if c.shape != (workload.shape[0],) or not np.isfinite(c).all() or (c <= 0).any():
            raise ArgumentError(
                f"the plan needs one positive finite target per query ({workload.shape[0]}), "
                f"got shape {c.shape}"
            )
        self.targets = c

    # -- the mechanism's figures ------------------------------------------
    @property
    def privacy_cost(self) -> float:
        """``max_j sqrt(b_j^T Sigma^-1 b_j)`` of the released covariance ``sigma_g^2 Sigma``."""
        return self.sensitivity / self.noise_scale

    def privacy_profile(self) -> np.ndarray:
        """The privacy profile of every cell (Definition 2 of paper 000), as released."""
        return self.strategy.column_norms(2) / self.noise_scale

    def variance_ratios(self) -> np.ndarray:
        """Each query's variance divided by its target."""
        out: np.ndarray = self.query_variances() / self.targets
        return out

    @property
    def max_ratio(self) -> float:
        """The largest variance / target (at most 1 when every target is met)."""
        return float(self.variance_ratios().max())

    def _charged_cost(self) -> float:
        return self.privacy_cost * (1.0 + COST_MARGIN)

    def zcdp(self) -> zCDP:
        """The zCDP budget the measurement consumes: ``rho = cost^2 / 2`` (rounded up)."""
        return zCDP(Fraction(self._charged_cost()) ** 2 / 2)

    def approx_dp(self, epsilon: float) -> ApproxDP:
        """The (epsilon, delta) it consumes at ``epsilon`` (exact Gaussian calibration)."""
        delta = gaussian_delta(self._charged_cost(), float(epsilon))
        return ApproxDP(epsilon, Fraction(math.nextafter(delta, 1.0)))

    # -- reporting ---------------------------------------------------------
    def _summary_dict(self) -> dict[str, Any]:
        d = super()._summary_dict()
        ratios = self.variance_ratios()
        variances = ratios * self.targets
        spent = self.zcdp()
        fit: dict[str, Any] = {
            "privacy_cost": self.privacy_cost,
            "zcdp_rho": float(spent.rho),
            "max_ratio": float(ratios.max()),
            "min_ratio": float(ratios.min()),
            "targets_met": bool(ratios.max() <= 1.0 + 1e-9),
        }
        if isinstance(self.privacy, ApproxDP):
            fit["delta_at_epsilon"] = float(self.approx_dp(float(self.privacy.epsilon)).delta)
        if ratios.size <= SUMMARY_MAX_QUERIES:
            fit["queries"] = [
                {"query": i, "variance": float(v), "target": float(t), "ratio": float(r)}
                for i, (v, t, r) in enumerate(zip(variances, self.targets, ratios, strict=True))
            ]
        start = 0
        for part in d["parts"]:
            stop = start + part["queries"]
            part["max_ratio"] = float(ratios[start:stop].max())
            start = stop
        d["fitness"] = fit
        return d

    def summary(self, as_dict: bool = False) -> str | dict[str, Any]:
        """The plan's table plus the privacy cost, the budget spent and the target ratios."""
        d = self._summary_dict()
        if as_dict:
            return d
        f = d["fitness"]
        lines = [
            str(Plan.summary(self)),
            "",
            f"fitness-for-use: privacy cost {f['privacy_cost']:.6g} (zCDP rho "
            f"{f['zcdp_rho']:.6g}), variance / target from {f['min_ratio']:.4g} to "
            f"{f['max_ratio']:.4g}" + ("" if f["targets_met"] else "  (above the targets)"),
        ]
        for p in d["parts"]:
            lines.append(f"  {p['part']}: max variance / target {p['max_ratio']:.4g}")
        return "\n".join(lines)

    # -- persistence -------------------------------------------------------
    def _save_extra(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        arrays["fitness_targets"] = self.targets
        return {"kind": self.kind, "targets": "fitness_targets"}

    @classmethod
    def _from_saved(
        cls, doc: dict[str, Any], arrays: dict[str, np.ndarray], **kwargs: Any
    ) -> FitnessPlan:
        return cls(**kwargs, targets=arrays[doc["targets"]])


def _round_up(budget: zCDP, digits: int = 10) -> zCDP:
    """``rho`` rounded up to ``digits`` significant decimal digits (a readable budget)."""
    rho = budget.rho
    if rho <= 0:
        return budget
    scale = Fraction(10) ** (digits - 1 - math.floor(math.log10(float(rho))))
    return zCDP(Fraction(math.ceil(rho * scale)) / scale)


def _union_groups(W: LinearQuery, sizes: tuple[int, ...], parts: int) -> list[list[int]]:
    """The Kronecker terms of the workload that each union part answers."""
    terms = kron_terms(W, sizes)
    if not isinstance(W, VStack) or terms.k != parts:
        raise ArgumentError(
            "a union fitness plan needs a VStack workload whose parts are single "
            f"Kronecker terms ({terms.k} terms for {parts} parts)"
        )
    return [[j] for j in range(parts)]


def fitness_plan(
    workload: LinearQuery,
    privacy: Budget | None,
    *,
    targets: Any = 1.0,
    basis: Any = None,
    domain: Domain | None = None,
    client: Any = None,
    **options: Any,
) -> FitnessPlan:
    """Problem 1 (``privacy=None``) or Problem 2 as a release plan.

    Parameters
    ----------
    workload : LinearQuery
        ``W``.
    privacy : zCDP, ApproxDP or None
        ``None``: Problem 1, the targets are absolute and the plan spends the least
        budget that meets them (zCDP ``rho = cost^2 / 2``). A budget: Problem 2, the
        targets are relative and the plan spends exactly the budget.
    targets, basis
        As for :func:`dpdask.strategy.fitness.solve`.
    domain : Domain, optional
        The data domain.
    client : distributed.Client, optional
        Where the per-factor optimisation tasks run (default: Dask's default scheduler).
    **options
        Further keywords of :func:`~dpdask.strategy.fitness.solve` (``method``,
        ``total_weight``, ``init``, ``names``, ``options``).

    Returns
    -------
    FitnessPlan
    """
    from dpdask.strategy.fitness import solve

    if "names" not in options and domain is not None and isinstance(workload, Kron):
        if len(workload.factors) == len(domain.attrs):
            options["names"] = list(domain.attrs)
    if client is not None:
        with client.as_current():
            sol = solve(workload, targets, basis, **options)
    else:
        sol = solve(workload, targets, basis, **options)
    spend: Budget = _round_up(sol.zcdp()) if privacy is None else privacy
    A = whitened_strategy(sol)
    sizes = domain.shape if domain is not None else None
    terms_sizes = kron_terms(workload, sizes).sizes
    groups = None
    if isinstance(sol, UnionFitnessSolution):
        groups = _union_groups(workload, terms_sizes, len(sol.parts))
    info = {
        "problem": 1 if privacy is None else 2,
        "solution_privacy_cost": sol.privacy_cost,
        "lower_bound": sol.lower_bound,
        "gap": sol.gap if math.isfinite(sol.gap) else None,
        **{
            k: v
            for k, v in sol.info.items()
            if isinstance(v, int | str | bool)
            or (isinstance(v, float) and math.isfinite(v) and k not in ("lower_bound", "gap"))
        },
    }
    return FitnessPlan(
        workload, A, spend, targets=sol.targets, domain=domain, groups=groups, info=info,
        sizes=terms_sizes,
    )  # fmt: skip
