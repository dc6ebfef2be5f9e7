"""What a noise mechanism costs, and whether a calibration fits a budget.

A measurement adds noise of one scale to every row of ``A x``. Its privacy
loss depends on the mechanism, the strategy's sensitivity in the mechanism's
norm and the noise scale:

============================  =========  ===================================================
mechanism                     norm       guarantee of one measurement
============================  =========  ===================================================
``laplace``                   L1         ``PureDP(D1 / b)``
``discrete_laplace``          L1         ``PureDP(D1 / b)`` (integer queries)
``gaussian``                  L2         ``zCDP(D2**2 / (2 sigma**2))``; exact (eps, delta)
                                         curve of Balle and Wang (2018)
``discrete_gaussian``         L2         ``zCDP(D2**2 / (2 sigma**2))`` (integer queries, CKS
                                         Theorem 14)
============================  =========  ===================================================

:func:`check_calibration` accepts a measurement only if that guarantee fits
within the budget the plan charges for it, checking in exact rational
arithmetic where the comparison is algebraic.

Samplers and budget types. Every release measurement draws exact integer noise
(:mod:`dpdask.noise._table`: inversion tables decided by integer comparisons,
with exact resolution of undecided draws, so the total variation distance from
the discrete law is zero): ``discrete_laplace`` for PureDP plans,
``discrete_gaussian`` for zCDP and ApproxDP plans, on a grid of step ``2**-k``
when the data is float or the strategy non-integral
(:func:`dpdask.measure.lattice`). The guarantees in the table therefore hold as
stated for the discrete rows, with no added delta, for all three budget types. An
ApproxDP plan calibrated for the continuous Gaussian (Balle and Wang) gets a
discrete Gaussian whose sigma is raised until its zCDP conversion fits. The
``laplace`` and ``gaussian`` rows describe the plan's nominal mechanism (and the
unsafe floating-point samplers, used only with ``unsafe_float=True`` outside
releases); the charge is the plan's budget, which bounds the discrete
measurement's loss.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.privacy._budget import ApproxDP, Budget, PureDP, zCDP
from dpdask.privacy._convert import _check_sensitivity, zcdp_delta

__all__ = ["MECHANISM_NORM", "check_calibration", "mechanism_guarantee"]

MECHANISM_NORM = {"laplace": 1, "discrete_laplace": 1, "gaussian": 2, "discrete_gaussian": 2}


def _check_mechanism(mechanism: str) -> int:
    if mechanism not in MECHANISM_NORM:
        raise PlanError(
            f"unknown mechanism {mechanism!r}; expected one of {sorted(MECHANISM_NORM)}"
        )
    return MECHANISM_NORM[mechanism]


def mechanism_guarantee(mechanism: str, sensitivity: float, noise_scale: float) -> PureDP | zCDP:
    """The natural guarantee of one measurement (see the module table), exact.

    Parameters
    ----------
    mechanism : str
        ``"laplace"``, ``"discrete_laplace"``, ``"gaussian"`` or ``"discrete_gaussian"``.
    sensitivity : float
        L1 (Laplace) or L2 (Gaussian) sensitivity of the strategy.
    noise_scale : float
        Laplace scale ``b`` or Gaussian ``sigma``.

    Returns
    -------
    PureDP or zCDP

    Examples
    --------
    >>> mechanism_guarantee("laplace", 2.0, 4.0)
    PureDP(epsilon=0.5)
    >>> mechanism_guarantee("gaussian", 1.0, 1.0)
    zCDP(rho=0.5)
    """
    norm = _check_mechanism(mechanism)
    d = Fraction(_check_sensitivity(sensitivity, f"L{norm}"))
    scale = float(noise_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise PlanError(f"noise scale must be positive and finite, got {noise_scale!r}")
    s = Fraction(scale)
    if norm == 1:
        return PureDP(d / s)
    return zCDP(d * d / (2 * s * s))


def check_calibration(
    mechanism: str, sensitivity: float, noise_scale: float, privacy: Budget
) -> Budget:
    """Raise unless one measurement with this calibration fits within ``privacy``.

    Returns the measurement's natural guarantee (:func:`mechanism_guarantee`).

    Raises
    ------
    TypeError
        If ``privacy`` is not a budget.
    ValueError
        If the noise is too small for the budget, or the mechanism cannot be
        accounted in that kind of budget (a Gaussian in a pure-DP budget).
    """
    if not isinstance(privacy, Budget):
        raise BudgetTypeError(
            f"the plan's privacy must be a PureDP, ApproxDP or zCDP, got {privacy!r}"
        )
    natural = mechanism_guarantee(mechanism, sensitivity, noise_scale)
    ok: bool
    if isinstance(privacy, PureDP | zCDP):
        try:
            ok = natural <= privacy
        except TypeError:
            raise PlanError(
                f"a {mechanism} measurement gives {natural!r}, which cannot be charged "
                f"to a {type(privacy).__name__} budget"
            ) from None
    elif isinstance(privacy, ApproxDP):
        if isinstance(natural, PureDP):
            ok = natural.epsilon <= privacy.epsilon
        elif mechanism == "gaussian":
            ok = privacy.admits_gaussian(float(sensitivity) / float(noise_scale))
        else:  # discrete Gaussian: rho-zCDP, converted with the CKS bound
            ok = privacy.delta > 0 and zcdp_delta(
                math.nextafter(float(natural.rho), math.inf), float(privacy.epsilon)
            ) <= float(privacy.delta)
    else:  # pragma: no cover - no other budget classes
        raise BudgetTypeError(f"unsupported budget {privacy!r}")
    if not ok:
        raise PlanError(
            f"{mechanism} noise of scale {noise_scale!r} on a strategy of "
            f"L{MECHANISM_NORM[mechanism]} sensitivity {sensitivity!r} gives {natural!r}, "
            f"which exceeds the plan's privacy {privacy!r}"
        )
    return natural
