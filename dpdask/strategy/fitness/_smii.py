"""SM-II: the soft-max reformulation of the fitness-for-use problem, solved by Newton-CG.

Paper 000, section 6. Problem 1 (least privacy cost subject to
``l_i^T Sigma l_i <= c_i``) is equivalent (Theorem 6.1) to Problem 3,

    minimise  max_j b_j^T Sigma^-1 b_j  +  max_i l_i^T Sigma l_i / c_i,

followed by the rescaling ``Sigma / max_i (l_i^T Sigma l_i / c_i)``: the first term is
homogeneous of degree -1 in ``Sigma`` and the second of degree +1, so the problem is a
minimisation of their product. Problem 4 replaces both maxima by soft maxima
``smax_g(x) = log(sum_k exp(g x_k)) / g`` (parameters ``g_P`` and ``g_V``), which is
smooth and convex. With ``p_j = b_j^T X b_j`` (``X = Sigma^-1``), ``v_i = l_i^T Sigma l_i
/ c_i`` and the soft-max weights ``pi = softmax(g_P p)``, ``nu = softmax(g_V v)``:

    grad  = -X B diag(pi) B^T X + L^T diag(nu / c) L  (+ lambda L^T L)
    H[D]  = Y K X + X K Y + g_P (X B diag(pi q) B^T X - (pi . q) X K X)
            + g_V (L^T diag(nu s / c) L - (nu . s) L^T diag(nu / c) L)

with ``K = B diag(pi) B^T``, ``Y = X D X``, ``q_j = b_j^T Y b_j`` and
``s_i = l_i^T D l_i / c_i``. These are the paper's equations (15)-(20) written as
matrix products: the Kronecker form ``(A (x) C) vec(D) = vec(C D A^T)`` is what turns
the ``r^2 x r^2`` Hessian into the products above, so the Hessian is never formed.
The optional total-squared-error term ``lambda tr(L Sigma L^T)`` of section 6.1 adds
``lambda L^T L`` to the gradient and nothing to the Hessian.

Algorithm 1 (outer loop) takes Newton steps on Problem 4 for fixed ``g``; when the
Newton decrement is small the sub-problem is over and ``g`` grows by ``growth``
(continuation). Algorithm 2 is conjugate gradient on ``H d = -grad``. Algorithm 3 is
backtracking with a Cholesky factorisation as the positive-definiteness test and an
Armijo sufficient-decrease condition.

Beyond the paper, for accuracy and speed:

* the soft maxima are set relative to the current scale (``g = tau / mu`` with ``mu``
  the balanced value of both terms, after rescaling ``Sigma`` so that they are equal);
* conjugate gradient runs in whitened coordinates ``D = F E F^T`` (``Sigma = F F^T``)
  and is preconditioned by the exact inverse of the soft-max part of the Hessian plus
  a multiple of the identity (Woodbury, :class:`NewtonSystem`): the soft maxima give
  the Hessian eigenvalues of order ``tau`` beside ones of order 1, which plain CG
  (the paper uses 5 iterations) cannot resolve, and which is why the paper's SM-II
  stops 1-14% above the optimum;
* each sub-problem starts from the extrapolation of the last two along the path, and
  the Newton system carries an adaptive Levenberg-Marquardt damping in the
  ``-log det`` metric (strong at the start of each sub-problem, where the sharper soft
  maximum makes full Newton steps leave the positive-definite cone);
* the continuation stops on a *certified* gap. At any ``Sigma`` the soft-max weights
  are probability vectors, and weak duality gives the lower bound
  ``||diag(nu / c)^{1/2} W diag(pi)^{1/2}||_*^2`` on the optimal squared privacy cost
  (:func:`~dpdask.strategy.fitness._terms.nuclear_bound`); the rescaled ``Sigma``
  achieves ``max_j p_j * max_i v_i``. The loop ends when the two agree to ``gap_tol``
  (or when the squared cost stops improving, ``primal_tol``), and the solution
  reports the gap it reached.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpdask.errors import ArgumentError, ConvergenceError, ConvergenceWarning
from dpdask.strategy.fitness._newton import NewtonSystem
from dpdask.strategy.fitness._terms import ColumnTerm, RowTerm, nuclear_bound

__all__ = ["SMIIOptions", "SMIIResult", "smii"]

# Range of the Levenberg-Marquardt damping (relative to the mean eigenvalue of K).
_DAMPING_MIN, _DAMPING_MAX = 1e-6, 1e3
# ... and the damping each sub-problem starts with.
_STAGE_DAMPING = 1.0


@dataclass(frozen=True)
class SMIIOptions:
    """Tuning of the SM-II optimiser.

    Parameters
    ----------
    tau_start, tau_growth, tau_max : float
        Continuation on the dimensionless soft-max sharpness ``tau = g * mu``: start,
        growth factor per sub-problem, and ceiling.
    gap_tol : float
        Stop when the certified relative optimality gap is at most this.
    primal_tol : float
        Or when the squared cost improved by less than ``primal_tol * (growth - 1)``
        (relative) over the last sub-problem: the improvements shrink geometrically
        with ``tau``, so what is left to gain is about this fraction.
    newton_tol : float
        A sub-problem is solved when half the Newton decrement is below
        ``newton_tol * mu / tau``.
    max_newton : int
        Newton iterations in all (Algorithm 1's MAXITER). Stopping there before a
        stopping rule holds emits a :class:`~dpdask.errors.ConvergenceWarning`.
    max_cg, cg_tol : int, float
        Conjugate-gradient iterations per Newton step and relative residual target.
    armijo, backtrack : float
        Sufficient-decrease constant and step shrink factor of the line search.
    total_weight : float
        ``lambda`` of the total-squared-error term (section 6.1); 0 for pure fitness.
    precondition : {"geometric", "scalar", "none"}
        Conjugate-gradient preconditioner (see :class:`NewtonSystem`); whitening by
        the current ``Sigma`` is always applied.
    hessian_dtype : numpy dtype
        Precision of the matrix products inside conjugate gradient (``np.float32``
        halves their cost; line search and objective stay in float64). Float32 makes
        the later, sharper sub-problems take more Newton steps; float64 is faster overall.
    predict : bool
        Start each sub-problem from the extrapolation of the last two solutions along
        the path ``Sigma(tau) ~ Sigma* + C / tau`` when that lowers the new objective.
    damping : float
        Initial Levenberg-Marquardt damping of the Newton system, relative to the
        mean eigenvalue of ``K``: ``delta E`` (the curvature of ``-log det Sigma`` in
        whitened coordinates) is added to the Hessian. It adapts (divided by 4 after a
        full step, multiplied by 4 after a step shorter than 1/4) and restarts at 1 with
        each sub-problem, whose first Newton steps otherwise leave the positive-definite
        cone or need many halvings.
    blas_threads : int or None
        BLAS threads while solving (``None``: the library's default). One by default:
        the matrices are at most a few thousand wide, and OpenBLAS threads on a busy
        machine spin against each other.
    """

    tau_start: float = 4.0
    tau_growth: float = 6.0
    tau_max: float = 1e9
    gap_tol: float = 1e-4
    primal_tol: float = 1e-5
    newton_tol: float = 1e-3
    max_newton: int = 2000
    max_cg: int = 100
    cg_tol: float = 0.2
    armijo: float = 1e-4
    backtrack: float = 0.5
    total_weight: float = 0.0
    precondition: str = "geometric"
    hessian_dtype: type = np.float64
    predict: bool = True
    damping: float = 1e-2
    blas_threads: int | None = 1

    def __post_init__(self) -> None:
        if not (self.tau_start > 0 and self.tau_growth > 1 and self.tau_max >= self.tau_start):
            raise ArgumentError("need tau_start > 0, tau_growth > 1 and tau_max >= tau_start")
        if self.precondition not in ("geometric", "scalar", "none"):
            raise ArgumentError(f"unknown preconditioner {self.precondition!r}")
        if self.gap_tol < 0 or self.total_weight < 0:
            raise ArgumentError("gap_tol and total_weight must be non-negative")


@dataclass
class SMIIResult:
    """Outcome of :func:`smii`: ``Sigma`` scaled so that the largest variance ratio is 1.

    ``dual_weights`` are the probability vectors ``(u, v)`` over cells and queries
    that certify ``lower_bound`` (``None`` with a total-error term).
    """

    sigma: np.ndarray
    squared_cost: float
    lower_bound: float
    dual_weights: tuple[np.ndarray, np.ndarray] | None
    newton_iterations: int
    cg_iterations: int
    stages: int
    tau: float
    converged: bool
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def gap(self) -> float:
        """Certified relative gap ``squared_cost / lower_bound - 1`` (meaningful for lambda 0)."""
        return self.squared_cost / self.lower_bound - 1.0 if self.lower_bound > 0 else math.inf


def _lse(x: np.ndarray, g: float) -> tuple[float, np.ndarray]:
    """Soft max ``log(sum exp(g x)) / g`` and its weights ``softmax(g x)``."""
    top = float(x.max())
    e = np.exp(g * (x - top))
    s = e.sum()
    return top + math.log(s) / g, e / s


@dataclass
class _Point:
    """``Sigma = R^T R`` (``R`` upper triangular), ``Rinv = R^-1``, and the objective there."""

    sigma: np.ndarray
    R: np.ndarray
    Rinv: np.ndarray
    p: np.ndarray
    v: np.ndarray
    total: float
    value: float
    pi: np.ndarray
    nu: np.ndarray


class _Objective:
    """Problem 4 for fixed soft-max parameters ``gP`` and ``gV``."""

    def __init__(self, rows: RowTerm, cols: ColumnTerm, c: np.ndarray, lam: float):
        self.rows, self.cols, self.c, self.lam = rows, cols, c, lam
        self.G = rows.gram(np.ones(rows.m)) if lam > 0 else None
        self.gP = self.gV = 1.0

    def point(self, sigma: np.ndarray) -> _Point | None:
        """Evaluate at ``sigma``; ``None`` unless it is positive definite (Cholesky test)."""
        R, info = sla.lapack.dpotrf(sigma, lower=0, clean=1)
        if info != 0:
            return None
        Rinv, info = sla.lapack.dtrtri(R, lower=0)
        if info != 0:
            return None
        p = self.cols.quad_inverse(Rinv)
        v = self.rows.quad(sigma) / self.c
        total = float(np.sum(self.G * sigma)) if self.G is not None else 0.0
        if not (np.isfinite(p).all() and np.isfinite(v).all()) or p.max() <= 0:
            return None
        fp, pi = _lse(p, self.gP)
        fv, nu = _lse(v, self.gV)
        return _Point(sigma, R, Rinv, p, v, total, fp + fv + self.lam * total, pi, nu)

    def gradient(self, pt: _Point) -> np.ndarray:
        """The gradient in the original coordinates (the solver uses the whitened one)."""
        X = pt.Rinv @ pt.Rinv.T
        g = self.rows.gram(pt.nu / self.c) - self.cols.sandwich(X, pt.pi)
        if self.G is not None:
            g = g + self.lam * self.G
        out: np.ndarray = g
        return out

    def newton_system(
        self,
        pt: _Point,
        precondition: str = "geometric",
        dtype: type = np.float64,
        damping: float = 0.0,
    ) -> NewtonSystem:
        """The Newton system at ``pt`` (:class:`~dpdask.strategy.fitness._newton.NewtonSystem`)."""
        return NewtonSystem(self, pt, precondition, dtype, damping)


def _reweighted(obj: _Objective, pt: _Point) -> _Point:
    """``pt``'s covariance under the objective's new barrier weights."""
    again = obj.point(pt.sigma)
    if again is None:  # the covariance was positive definite a moment ago
        raise ConvergenceError("the covariance left the positive definite cone")
    return again


def _balance(obj: _Objective, pt: _Point) -> _Point:
    """Rescale ``Sigma`` so that the privacy and variance maxima are equal."""
    vmax = pt.v.max() + obj.lam * pt.total
    t = math.sqrt(pt.p.max() / vmax)
    new = obj.point(pt.sigma * t)
    if new is None:  # pragma: no cover - scaling keeps positive definiteness
        raise FloatingPointError("rescaling lost positive definiteness")
    return new


def smii(
    rows: RowTerm,
    cols: ColumnTerm,
    targets: np.ndarray,
    sigma0: np.ndarray,
    options: SMIIOptions | None = None,
) -> SMIIResult:
    """Solve Problem 1 in canonical form by SM-II (Algorithms 1-3 of paper 000).

    Parameters
    ----------
    rows : row term
        The queries ``L`` (``m x r``), see :mod:`dpdask.strategy.fitness._terms`.
    cols : column term
        The basis columns ``b_j`` (``r x d``).
    targets : numpy.ndarray
        Positive variance targets ``c`` (length ``m``).
    sigma0 : numpy.ndarray
        Positive-definite initial covariance (``r x r``), any scale.
    options : SMIIOptions, optional

    Returns
    -------
    SMIIResult
        ``sigma`` scaled so that ``max_i l_i^T sigma l_i / c_i = 1``.
    """
    opt = options or SMIIOptions()
    t0 = time.perf_counter()
    c = np.asarray(targets, dtype=float)
    obj = _Objective(rows, cols, c, opt.total_weight)
    pt = obj.point(np.array(sigma0, dtype=float))
    if pt is None:
        raise ArgumentError("the initial covariance is not positive definite")
    tau = opt.tau_start
    pt = _balance(obj, pt)
    mu = float(pt.p.max())
    obj.gP = obj.gV = tau / mu
    pt = _reweighted(obj, pt)
    stages, newton, cg_total, converged = 1, 0, 0, False
    rho = opt.damping
    best_lb, prev_ub = 0.0, math.inf
    weights: tuple[np.ndarray, np.ndarray] | None = None
    path: np.ndarray | None = None
    path_mu = 1.0
    best: tuple[float, _Point] = (math.inf, pt)
    history: list[dict[str, float]] = []

    def certify(point: _Point) -> float:
        return nuclear_bound(rows, cols, point.nu / c, point.pi)

    while newton < opt.max_newton:
        system = obj.newton_system(pt, opt.precondition, opt.hessian_dtype, rho)
        grad = system.gradient
        E, k = system.solve(-grad, opt.cg_tol, opt.max_cg)
        d = system.direction(E)
        cg_total += k
        newton += 1
        slope = float(np.sum(grad * E))
        step = 0.0
        if -slope / 2 > opt.newton_tol * mu / tau:
            step = 1.0
            while step > 1e-14:
                trial = obj.point(pt.sigma + step * d)
                if trial is not None and trial.value <= pt.value + opt.armijo * step * slope:
                    pt = trial
                    break
                step *= opt.backtrack
            else:
                step = 0.0
            # adapt the damping: relax after full steps, strengthen after short ones
            rho = rho / 4 if step == 1.0 else (4 * rho if step < 0.25 else rho)
            rho = min(max(rho, _DAMPING_MIN), _DAMPING_MAX)
        elif rho > _DAMPING_MIN:
            rho = _DAMPING_MIN  # a damped step was short: retry with (nearly) pure Newton
            continue
        if step > 0.0:
            continue
        # sub-problem solved (or no further progress): certify, then sharpen the soft max
        ub = float(pt.p.max() * (pt.v.max() + opt.total_weight * pt.total))
        if ub < best[0]:
            best = (ub, pt)
        if opt.total_weight == 0:
            lb = certify(pt)
            if lb > best_lb:
                best_lb, weights = lb, (pt.pi, pt.nu)
        history.append(
            {
                "tau": tau,
                "newton": newton,
                "cg": cg_total,
                "squared_cost": ub,
                "lower_bound": best_lb,
            }
        )
        if opt.total_weight == 0 and ub <= best_lb * (1.0 + opt.gap_tol):
            converged = True
            break
        if 0.0 <= prev_ub - ub <= opt.primal_tol * (opt.tau_growth - 1.0) * ub:
            converged = True
            break
        prev_ub = ub
        if tau >= opt.tau_max:
            converged = opt.total_weight > 0
            break
        growth = min(opt.tau_growth, opt.tau_max / tau)
        tau *= growth
        rho = max(rho, _STAGE_DAMPING)  # the sharper soft max makes the old model poor
        stages += 1
        pt = _balance(obj, pt)
        mu = float(pt.p.max())
        obj.gP = obj.gV = tau / mu
        pt = _reweighted(obj, pt)
        if opt.predict and path is not None:
            # predictor: the central path moves like 1/tau, so extrapolate along it
            trial = obj.point(pt.sigma + (pt.sigma - path * (mu / path_mu)) / growth)
            if trial is not None and trial.value < pt.value:
                path, path_mu = pt.sigma, mu
                pt = trial
                continue
        path, path_mu = pt.sigma, mu

    if not converged and newton >= opt.max_newton:
        warnings.warn(
            f"SM-II stopped at its iteration limit ({opt.max_newton} Newton steps) before "
            "its optimality gap",
            ConvergenceWarning,
            stacklevel=2,
        )
    if best[0] < float(pt.p.max() * (pt.v.max() + opt.total_weight * pt.total)):
        pt = best[1]  # the last iterate (out of iterations) is worse than a stage's end
    vmax = float(pt.v.max())
    sigma = pt.sigma / vmax
    squared = float(pt.p.max() * vmax)
    if opt.total_weight == 0 and weights is None:
        best_lb, weights = certify(pt), (pt.pi, pt.nu)
    return SMIIResult(
        sigma=0.5 * (sigma + sigma.T),
        squared_cost=squared,
        lower_bound=best_lb,
        dual_weights=weights,
        newton_iterations=newton,
        cg_iterations=cg_total,
        stages=stages,
        tau=tau,
        converged=converged,
        seconds=time.perf_counter() - t0,
        history=history,
    )


def run_info(res: SMIIResult) -> dict[str, Any]:
    """JSON-safe summary of a run."""
    return {
        "squared_cost": res.squared_cost,
        "lower_bound": res.lower_bound,
        "gap": res.gap,
        "newton_iterations": res.newton_iterations,
        "cg_iterations": res.cg_iterations,
        "stages": res.stages,
        "tau": res.tau,
        "converged": res.converged,
        "seconds": res.seconds,
    }
