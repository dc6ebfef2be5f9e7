"""Conversions between privacy definitions and exact Gaussian calibration.

Two results are implemented here, both on floats (budgets themselves are exact
fractions; these functions are the "edge" where floats enter):

* The tight conversion of rho-zCDP to (epsilon, delta)-DP of Canonne, Kamath and
  Steinke (2020, "The Discrete Gaussian for Differential Privacy", Corollary 13):
  a rho-zCDP mechanism is (epsilon, delta)-DP for

  .. math::

     \\delta = \\inf_{\\alpha > 1}
               \\frac{\\exp((\\alpha - 1)(\\alpha\\rho - \\epsilon))}{\\alpha - 1}
               \\left(1 - \\frac{1}{\\alpha}\\right)^{\\alpha},

  equivalently :math:`\\epsilon = \\inf_{\\alpha>1} \\alpha\\rho + (\\log(1/\\delta)
  + (\\alpha - 1)\\log(1 - 1/\\alpha) - \\log\\alpha) / (\\alpha - 1)`. Every
  :math:`\\alpha > 1` gives a *valid* epsilon, so a numerical minimiser can only
  err on the safe side (a slightly larger epsilon).

* The exact (analytic) Gaussian mechanism of Balle and Wang (2018, Theorem 8),
  restated as Theorem 3 / Corollary 3.2 of the fitness-for-use paper
  (``../shared/papers/000``): a Gaussian mechanism whose *privacy cost* is ``c``
  (``c = Delta_2 / sigma`` for i.i.d. noise; ``max_j sqrt(b_j^T Sigma^{-1} b_j)`` for
  correlated noise) is (epsilon, delta)-DP if and only if

  .. math::

     \\Phi(c/2 - \\epsilon/c) - e^{\\epsilon}\\Phi(-c/2 - \\epsilon/c) \\le \\delta .

  The left side is increasing in ``c``; calibration finds the largest ``c`` that
  satisfies it by bisection and rounds in the private direction.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_ndtr

from dpdask.errors import PlanError

__all__ = ["gaussian_delta", "gaussian_max_privacy_cost", "zcdp_delta", "zcdp_epsilon"]


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise PlanError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return delta


def _zcdp_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    return alpha * rho + (
        log_inv_delta + (alpha - 1.0) * math.log1p(-1.0 / alpha) - math.log(alpha)
    ) / (alpha - 1.0)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The smallest epsilon such that rho-zCDP implies (epsilon, delta)-DP.

    Canonne, Kamath and Steinke (2020), Corollary 13, minimised over the Renyi
    order alpha numerically. The result is rounded up by one ulp, so it is always a
    valid guarantee.

    Parameters
    ----------
    rho : float
        The zCDP parameter, ``rho >= 0``.
    delta : float
        The target delta, ``0 < delta < 1``.

    Returns
    -------
    float
        Epsilon (``0.0`` when ``rho == 0``).

    Examples
    --------
    >>> round(zcdp_epsilon(2.556, 1e-10), 3)
    17.143
    """
    rho = float(rho)
    delta = _check_delta(delta)
    if not (rho >= 0.0 and math.isfinite(rho)):
        raise PlanError(f"rho must be finite and non-negative, got {rho!r}")
    if rho == 0.0:
        return 0.0
    log_inv = -math.log(delta)
    # The unconstrained optimum of the looser bound rho*a + log(1/delta)/(a-1) is at
    # a = 1 + sqrt(log(1/delta)/rho); the tight optimum lies nearby. Search on log(a-1).
    centre = math.log(math.sqrt(log_inv / rho))
    res = minimize_scalar(
        lambda t: _zcdp_epsilon_at(1.0 + math.exp(t), rho, log_inv),
        bounds=(centre - 12.0, centre + 12.0),
        method="bounded",
        options={"xatol": 1e-12},
    )
    eps = _zcdp_epsilon_at(1.0 + math.exp(res.x), rho, log_inv)
    return max(0.0, math.nextafter(eps, math.inf))


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The smallest delta such that rho-zCDP implies (epsilon, delta)-DP (CKS 2020, Cor. 13)."""
    rho, epsilon = float(rho), float(epsilon)
    if rho == 0.0:
        return 0.0

    def log_delta(t: float) -> float:
        a = 1.0 + math.exp(t)
        return (a - 1.0) * (a * rho - epsilon) - math.log(a - 1.0) + a * math.log1p(-1.0 / a)

    centre = math.log(max(epsilon, rho) / (2 * rho)) if epsilon > rho else 0.0
    res = minimize_scalar(log_delta, bounds=(centre - 20, centre + 20), method="bounded")
    return min(1.0, math.exp(log_delta(res.x)))


def gaussian_delta(privacy_cost: float, epsilon: float) -> float:
    """Delta of a Gaussian mechanism with the given privacy cost at ``epsilon``.

    ``Phi(c/2 - eps/c) - exp(eps) Phi(-c/2 - eps/c)``, computed in log space so that
    it stays accurate down to ``delta ~ 1e-300`` (Balle and Wang 2018, Theorem 8).

    Parameters
    ----------
    privacy_cost : float
        ``c = Delta_2 / sigma`` (or the correlated-noise privacy cost); ``c >= 0``.
    epsilon : float
        ``epsilon >= 0``.
    """
    c, eps = float(privacy_cost), float(epsilon)
    if c < 0 or eps < 0 or not (math.isfinite(c) and math.isfinite(eps)):
        raise PlanError(f"need finite privacy_cost >= 0 and epsilon >= 0, got {c!r}, {eps!r}")
    if c == 0.0:
        return 0.0
    la = float(log_ndtr(c / 2 - eps / c))
    lb = float(log_ndtr(-c / 2 - eps / c))
    # Phi(a) - e^eps Phi(b) = Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a)))
    ratio = eps + lb - la
    if ratio >= 0.0:  # rounding only; the true value is >= 0
        return 0.0
    return float(math.exp(la) * -math.expm1(ratio))


def gaussian_max_privacy_cost(epsilon: float, delta: float) -> float:
    """The largest Gaussian privacy cost ``c`` that is (epsilon, delta)-DP.

    The calibrated i.i.d. noise for L2 sensitivity ``Delta_2`` is
    ``sigma = Delta_2 / c``. Found by bisection on the monotone
    :func:`gaussian_delta`; the returned ``c`` satisfies ``gaussian_delta(c, epsilon)
    <= delta`` exactly as evaluated in floating point.
    """
    eps = float(epsilon)
    delta = _check_delta(delta)
    if eps < 0 or not math.isfinite(eps):
        raise PlanError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, eps) <= delta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e8:  # pragma: no cover - absurd budgets
            raise PlanError("budget too large to calibrate a Gaussian mechanism")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if gaussian_delta(mid, eps) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def gaussian_sigma_for_cost(l2_sensitivity: float, privacy_cost: float) -> float:
    """``sigma = Delta_2 / c``, rounded up so the realised cost never exceeds ``c``."""
    d2 = _check_sensitivity(l2_sensitivity, "L2")
    if privacy_cost <= 0:
        raise PlanError("privacy cost must be positive to calibrate noise")
    sigma = d2 / privacy_cost
    while sigma > 0 and d2 / sigma > privacy_cost:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def _check_sensitivity(value: float, name: str) -> float:
    value = float(np.asarray(value))
    if not (math.isfinite(value) and value >= 0.0):
        raise PlanError(f"{name} sensitivity must be finite and non-negative, got {value!r}")
    return value
