"""The variance of one draw of each sampler, exactly as drawn.

The integer samplers' laws are not their continuous namesakes': the discrete
Laplace of scale ``t`` (``P(k)`` proportional to ``exp(-|k| / t)``) has variance
``2 q / (1 - q)**2`` with ``q = exp(-1 / t)``, a little below ``2 t**2`` (by about
``1/6``); the discrete Gaussian of scale ``sigma`` (``P(k)`` proportional to
``exp(-k**2 / (2 sigma**2))``) has variance ``sum k**2 P(k)``, below ``sigma**2`` by a
term of order ``exp(-2 pi**2 sigma**2)`` (Poisson summation): negligible from
``sigma = 2`` on, 15% at ``sigma = 0.5``. A published variance must be that of
the noise drawn, so releases use :func:`draw_variance`.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpdask.errors import PlanError

__all__ = ["draw_variance"]

# beyond this sigma the discrete Gaussian's variance equals sigma**2 in double
# precision: the relative gap is below 8 pi**2 sigma**2 exp(-2 pi**2 sigma**2) < 1e-300
_GAUSS_EXACT_FROM = 8.0


def _discrete_gaussian_variance(sigma: float) -> float:
    if sigma >= _GAUSS_EXACT_FROM:
        return sigma * sigma
    n = math.ceil(40 * sigma) + 2  # terms beyond exp(-800) do not change a double
    weights = [math.exp(-(k * k) / (2.0 * sigma * sigma)) for k in range(1, n + 1)]
    mass = 1.0 + 2.0 * math.fsum(weights)
    return 2.0 * math.fsum(k * k * w for k, w in enumerate(weights, start=1)) / mass


def draw_variance(mechanism: str, scale: float | Fraction) -> float:
    """The variance of one draw of ``mechanism`` at ``scale``.

    Parameters
    ----------
    mechanism : str
        ``"discrete_laplace"``, ``"discrete_gaussian"`` (the integer samplers, exact
        laws), ``"laplace"`` or ``"gaussian"`` (their continuous forms).
    scale : float or Fraction
        Laplace ``t`` (or ``b``) or Gaussian ``sigma``, positive.

    Returns
    -------
    float

    Raises
    ------
    dpdask.errors.PlanError
        For an unknown mechanism or a scale that is not positive and finite.

    Examples
    --------
    >>> draw_variance("gaussian", 3.0)
    9.0
    >>> round(draw_variance("discrete_laplace", 1.0), 4)  # 2 t**2 would be 2
    1.8413
    """
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise PlanError(f"noise scale must be positive and finite, got {scale!r}")
    if mechanism == "gaussian":
        return s * s
    if mechanism == "laplace":
        return 2.0 * s * s
    if mechanism == "discrete_gaussian":
        return _discrete_gaussian_variance(s)
    if mechanism == "discrete_laplace":
        q = math.exp(-1.0 / s)
        return 2.0 * q / (-math.expm1(-1.0 / s)) ** 2
    raise PlanError(f"unknown mechanism {mechanism!r}")
