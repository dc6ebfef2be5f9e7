"""Optimal residual noise: closed form for the sum of variances, a convex program otherwise.

Notation of :mod:`._workload`: residual precisions ``u_A``, squared sensitivity
``sum_A c_A u_A``, per-cell variance of marginal ``S`` ``V_S(u) = sum_{A in S} v_SA / u_A``.

Sum of variances. Minimising ``sum_A b_A / u_A`` (``b_A = sum_{S > A} w_S^2 N_S v_SA``)
at unit sensitivity gives, by Cauchy-Schwarz, ``u_A = sqrt(b_A / c_A) / K`` with
``K = sum_A sqrt(b_A c_A)`` and the optimum ``K^2``: exact, no iterations.

Variance targets (and the maximum variance). The least squared sensitivity
meeting ``V_S(u) <= tau_S`` for every ``S`` is a convex program in ``u``. Its
Lagrange dual, for multipliers ``mu >= 0`` and ``a_A(mu) = sum_{S > A} mu_S v_SA``,
maximised over the scale of ``mu``, is ::

    L(mu) = (sum_A sqrt(c_A a_A(mu)))^2 / (mu . tau)

a lower bound on the optimum for *every* ``mu >= 0``; ``u_A = sqrt(a_A / c_A)``
scaled up until every target holds is feasible, an upper bound. :func:`solve_targets`
maximises ``log L`` (smooth, scale-free) by L-BFGS-B on ``log mu`` to a gap of
:data:`LBFGS_GAP`, then by Newton-CG steps on the active multipliers, and stops
when the two bounds agree to ``gap``. Minimising the largest weighted variance
``max_S w_S^2 V_S`` at unit sensitivity is the same program with
``tau_S = 1 / w_S^2``, rescaled.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.sparse import coo_matrix
from scipy.sparse.linalg import LinearOperator, cg

from dpdask.errors import ArgumentError, ConvergenceWarning
from dpdask.strategy.residual._workload import MarginalWorkload

__all__ = ["ResidualSolution", "solve_max", "solve_sum", "solve_targets"]

LBFGS_GAP = 1e-2
"""Relative gap at which L-BFGS-B hands over to Newton."""
NEWTON_STEPS = 50
NEWTON_CG_RTOL = 1e-12
NEWTON_CG_MAXITER = 1000
NEWTON_ACTIVE = 1e-9
"""Multipliers below this fraction of the largest are taken as inactive (zero)."""


@dataclass
class ResidualSolution:
    """Residual precisions and the certificate of their optimality.

    Attributes
    ----------
    precision : ndarray
        ``u_A`` per residual of the workload (:attr:`MarginalWorkload.residuals`),
        scaled to unit squared sensitivity ``sum_A c_A u_A = 1`` except for
        ``objective="targets"``, where it is the least-cost precision meeting them.
    objective : str
        ``"sum"``, ``"max"`` or ``"targets"``.
    value : float
        The objective at ``precision``: total variance, largest weighted per-cell
        variance (both at unit sensitivity), or the squared sensitivity (targets).
    lower_bound : float
        A certified lower bound on the optimum (equal to ``value`` for ``"sum"``).
    iterations : int
    wall_time_s : float
    """

    precision: np.ndarray
    objective: str
    value: float
    lower_bound: float
    iterations: int = 0
    wall_time_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative duality gap ``value / lower_bound - 1`` (0 when closed form)."""
        return self.value / self.lower_bound - 1.0 if self.lower_bound > 0 else math.inf


def solve_sum(W: MarginalWorkload) -> ResidualSolution:
    """The residual precisions of least total weighted variance at unit sensitivity.

    Examples
    --------
    Both one-way marginals of a 2 x 2 table: ``W^T W`` has eigenvalues 4, 2, 2, 0, so
    the optimum is the SVD bound ``(2 + 2 sqrt 2)^2 / 4 = (1 + sqrt 2)^2``.

    >>> W = MarginalWorkload((2, 2), [(0,), (1,)])
    >>> sol = solve_sum(W)
    >>> round(W.sensitivity2(sol.precision), 12), round(sol.value - (1 + 2**0.5) ** 2, 12)
    (1.0, 0.0)
    """
    t0 = time.perf_counter()
    p = W.pairs()
    c = W.residual_cost()
    cells = np.asarray(W.cells(), dtype=float)
    b = np.bincount(p.residual, weights=(W.weights**2 * cells)[p.marginal] * p.v, minlength=c.size)
    root = np.sqrt(b * c)
    K = float(root.sum())
    u = np.sqrt(b / c) / K
    value = K * K
    return ResidualSolution(u, "sum", value, value, 0, time.perf_counter() - t0)


def _dual_parts(
    W: MarginalWorkload, mu: np.ndarray, tau: np.ndarray, c: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """``log L(mu)``, its gradient in ``mu`` and the primal point ``u(mu)``."""
    p = W.pairs()
    a = np.bincount(p.residual, weights=mu[p.marginal] * p.v, minlength=c.size)
    u = np.sqrt(a / c)
    X = float(np.sqrt(c * a).sum())
    Y = float(mu @ tau)
    V = W.cell_variances(u)  # dX/dmu_S = V_S / 2
    return 2.0 * math.log(X) - math.log(Y), V / X - tau / Y, u


def _feasible_cost(W: MarginalWorkload, u: np.ndarray, tau: np.ndarray, c: np.ndarray) -> float:
    t = float(np.max(W.cell_variances(u) / tau))
    return t * float(c @ u)


def solve_targets(
    W: MarginalWorkload,
    targets: np.ndarray,
    *,
    gap: float = 1e-9,
    maxiter: int = 20000,
) -> ResidualSolution:
    """The least squared sensitivity whose residual noise meets per-marginal cell-variance targets.

    Parameters
    ----------
    W : MarginalWorkload
    targets : ndarray
        ``tau_S > 0``: the largest per-cell variance allowed on each marginal at
        unit noise (its weight is not applied).
    gap : float
        Stop when the feasible cost is within this relative gap of the dual bound.
    maxiter : int
        L-BFGS-B iterations.

    Returns
    -------
    ResidualSolution
        ``value`` is the squared sensitivity ``sum_A c_A u_A`` of the feasible
        ``precision`` (zCDP ``rho = value / 2`` at unit noise), ``lower_bound`` the
        dual bound.
    """
    t0 = time.perf_counter()
    tau = np.asarray(targets, dtype=float)
    if tau.shape != (W.m,) or not np.all(np.isfinite(tau)) or np.any(tau <= 0):
        raise ArgumentError(f"targets must be {W.m} positive finite variances")
    c = W.residual_cost()
    best: dict[str, Any] = {"lower": 0.0, "upper": math.inf, "u": None, "nit": 0}

    def fun(eta: np.ndarray) -> tuple[float, np.ndarray]:
        mu = np.exp(eta - eta.max())
        f, g, u = _dual_parts(W, mu, tau, c)
        lower = math.exp(f)
        upper = _feasible_cost(W, u, tau, c)
        best["nit"] += 1
        if lower > best["lower"]:
            best["lower"], best["mu"] = lower, mu
        if upper < best["upper"]:
            best["upper"], best["u"] = upper, u
        if best["upper"] <= best["lower"] * (1.0 + max(gap, LBFGS_GAP)):
            raise _Converged
        return -f, -(g * mu)

    eta0 = -np.log(tau)
    try:
        minimize(
            fun,
            eta0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": maxiter, "maxcor": 30, "ftol": 0.0, "gtol": 0.0},
        )
    except _Converged:
        pass
    if best["upper"] > best["lower"] * (1.0 + gap):
        _newton_polish(W, tau, c, best, gap)
    if best["upper"] > best["lower"] * (1.0 + gap):
        warnings.warn(
            f"the residual program stopped at a certified gap of "
            f"{best['upper'] / best['lower'] - 1:.3g} (asked {gap:.3g}); the plan is feasible",
            ConvergenceWarning,
            stacklevel=3,
        )
    u = best["u"]
    scale = float(np.max(W.cell_variances(u) / tau))
    u = u * scale
    value = float(c @ u)
    return ResidualSolution(
        u, "targets", value, best["lower"], best["nit"], time.perf_counter() - t0
    )


class _Converged(Exception):
    pass


def _newton_polish(
    W: MarginalWorkload, tau: np.ndarray, c: np.ndarray, best: dict[str, Any], gap: float
) -> None:
    """Newton steps on ``log L`` over the active multipliers, updating ``best``.

    L-BFGS-B finds ``log L`` to machine precision, but the primal point recovered
    from ``mu`` converges only like the square root of that; Newton drives the
    gradient (exact to rounding) to zero, and the primal with it. The Newton system
    ``(P_a D P_a^T / 2X + V_a V_a^T / 2X^2) step = g_a`` (``P`` the sparse
    marginal-by-residual matrix of ``v_SA``, ``D = sqrt(c) a^-3/2``; the rank-one
    term of the scale direction left out, which makes it definite) is solved by
    conjugate gradients with Hessian products in ``O(pairs)``.
    """
    p = W.pairs()
    P = coo_matrix((p.v, (p.marginal, p.residual)), shape=(W.m, c.size)).tocsr()
    P2 = P.multiply(P).tocsr()
    mu = best["mu"]
    f, g, u = _dual_parts(W, mu, tau, c)
    for _ in range(NEWTON_STEPS):
        act = np.flatnonzero(mu > NEWTON_ACTIVE * mu.max())
        a = P.T @ mu
        X = float(np.sqrt(c * a).sum())
        Va = W.cell_variances(u)[act]
        Pa = P[act]
        D = np.sqrt(c) * a**-1.5

        def hv(x: np.ndarray, Pa: Any = Pa, D: np.ndarray = D, X: float = X, Va: Any = Va) -> Any:
            return (Pa @ (D * (Pa.T @ x))) / (2 * X) + Va * (Va @ x) / (2 * X * X)

        diag = (P2[act] @ D) / (2 * X) + Va * Va / (2 * X * X)
        H = LinearOperator((act.size, act.size), matvec=hv, dtype=float)
        M = LinearOperator((act.size, act.size), matvec=lambda x, d=diag: x / d, dtype=float)
        sa, _info = cg(H, g[act], rtol=NEWTON_CG_RTOL, maxiter=NEWTON_CG_MAXITER, M=M)
        step = np.zeros_like(mu)
        step[act] = sa
        t = 1.0
        while t > 1e-12:
            # a multiplier may reach zero: the step stops short of it (it leaves the set)
            trial = np.maximum(mu + t * step, 0.0)
            f2, g2, u2 = _dual_parts(W, trial, tau, c)
            if f2 >= f - 1e-15 * abs(f):
                break
            t *= 0.5
        else:
            return
        mu, f, g, u = trial, f2, g2, u2
        best["nit"] += 1
        best["lower"] = max(best["lower"], math.exp(f))
        upper = _feasible_cost(W, u, tau, c)
        if upper < best["upper"]:
            best["upper"], best["u"] = upper, u
        if best["upper"] <= best["lower"] * (1.0 + gap):
            return


def solve_max(W: MarginalWorkload, *, gap: float = 1e-9, maxiter: int = 20000) -> ResidualSolution:
    """The residual precisions of least maximum weighted cell variance at unit sensitivity.

    Examples
    --------
    >>> W = MarginalWorkload((2, 3), [(0,), (0, 1)])
    >>> sol = solve_max(W)
    >>> sol.gap < 1e-8 and abs(W.sensitivity2(sol.precision) - 1) < 1e-12
    True
    """
    sol = solve_targets(W, 1.0 / W.weights**2, gap=gap, maxiter=maxiter)
    # cost K meets w^2 V <= 1; scaled to unit sensitivity the largest w^2 V is K
    u = sol.precision / sol.value
    value = float(np.max(W.weights**2 * W.cell_variances(u)))
    return ResidualSolution(
        u, "max", value, sol.lower_bound, sol.iterations, sol.wall_time_s, sol.info
    )
