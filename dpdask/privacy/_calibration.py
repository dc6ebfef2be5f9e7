"""From a budget and a strategy to the noise of one measurement: the one calibration.

A budget decides the mechanism (:func:`mechanism_for`: Laplace noise for pure DP,
Gaussian noise for zCDP and approximate DP), the mechanism the norm its sensitivity is
taken in (L1, L2: :data:`~dpdask.privacy.MECHANISM_NORM`), and the budget and
sensitivity the noise scale (:func:`noise_scale`). Plans, level plans, the audit and the
measure step all take these from :func:`calibrate`;
what the measure step then samples (integer noise, maybe on a lattice with a larger
scale) is :class:`dpdask.measure.Lattice`, whose ``variance`` is what releases publish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.noise import draw_variance
from dpdask.privacy._budget import ApproxDP, Budget, PureDP, zCDP
from dpdask.privacy._mechanisms import MECHANISM_NORM

__all__ = ["Calibration", "calibrate", "mechanism_for", "noise_scale"]


class _HasSensitivity(Protocol):
    def sensitivity(self, p: int) -> float: ...


def mechanism_for(budget: Budget) -> str:
    """The nominal mechanism a budget is spent with: ``"laplace"`` for pure DP,
    ``"gaussian"`` for zCDP and approximate DP.

    Raises
    ------
    dpdask.errors.BudgetTypeError
        If ``budget`` is not a budget (a ``TypeError``).

    Examples
    --------
    >>> mechanism_for(PureDP(1)), mechanism_for(zCDP("0.5"))
    ('laplace', 'gaussian')
    """
    if isinstance(budget, PureDP):
        return "laplace"
    if isinstance(budget, zCDP | ApproxDP):
        return "gaussian"
    raise BudgetTypeError(
        f"privacy must be a dpdask.privacy budget (PureDP, zCDP or ApproxDP), got {budget!r}"
    )


def noise_scale(mechanism: str, sensitivity: float, budget: Budget) -> float:
    """The noise scale of one measurement spending exactly ``budget``.

    Parameters
    ----------
    mechanism : {"laplace", "gaussian"}
        The budget's mechanism (:func:`mechanism_for`).
    sensitivity : float
        The strategy's sensitivity in the mechanism's norm (L1 for Laplace, L2 for
        Gaussian).
    budget : PureDP, zCDP or ApproxDP
        What the measurement may spend.

    Returns
    -------
    float
        The Laplace scale ``b = Delta_1 / epsilon`` (:meth:`PureDP.laplace_scale`), or the
        Gaussian ``sigma``: ``Delta_2 / sqrt(2 rho)`` for zCDP (:meth:`zCDP.gaussian_sigma`),
        the analytic Gaussian's for (epsilon, delta) (:meth:`ApproxDP.gaussian_sigma`);
        each rounded so that the measurement never spends more than ``budget``.

    Raises
    ------
    dpdask.errors.BudgetTypeError
        If ``budget`` is not a budget (a ``TypeError``).
    dpdask.errors.PlanError
        If the mechanism does not go with the kind of budget (or is unknown), or the
        sensitivity or budget cannot calibrate noise (negative, zero budget, no delta).

    Examples
    --------
    >>> noise_scale("laplace", 2.0, PureDP("0.5"))
    4.0
    >>> noise_scale("gaussian", 1.0, zCDP("0.5"))
    1.0
    """
    if not isinstance(budget, Budget):
        raise BudgetTypeError(f"budget must be a PureDP, ApproxDP or zCDP budget, got {budget!r}")
    if mechanism not in ("laplace", "gaussian"):
        raise PlanError(f"unknown mechanism {mechanism!r}; expected 'laplace' or 'gaussian'")
    needed = mechanism_for(budget)
    if mechanism != needed:
        kind = "pure-DP" if needed == "laplace" else type(budget).__name__
        raise PlanError(f"a {kind} budget needs {needed.capitalize()} noise, not {mechanism}")
    if isinstance(budget, PureDP):
        return float(budget.laplace_scale(sensitivity))
    if isinstance(budget, zCDP | ApproxDP):
        return float(budget.gaussian_sigma(sensitivity))
    raise BudgetTypeError(f"unsupported budget {budget!r}")  # pragma: no cover - no others


@dataclass(frozen=True)
class Calibration:
    """The nominal noise of one measurement spending exactly ``budget``.

    Attributes
    ----------
    mechanism : str
        ``"laplace"`` or ``"gaussian"`` (:func:`mechanism_for`).
    norm : int
        The norm of the sensitivity: 1 (Laplace) or 2 (Gaussian).
    sensitivity : float
        The strategy's sensitivity in that norm.
    scale : float
        The Laplace ``b`` or Gaussian ``sigma`` (:func:`~dpdask.privacy.noise_scale`).
    budget : Budget
        What the measurement spends.
    """

    mechanism: str
    norm: int
    sensitivity: float
    scale: float
    budget: Budget

    @property
    def variance(self) -> float:
        """The nominal (continuous) variance of one noise draw: ``2 b**2`` or
        ``sigma**2``."""
        return draw_variance(self.mechanism, self.scale)

    def at(self, budget: Budget) -> Calibration:
        """The same mechanism and sensitivity spending ``budget`` instead.

        Raises
        ------
        dpdask.errors.PlanError
            If ``budget`` is spent with another mechanism (a strategy's sensitivity is
            in one norm).
        """
        mechanism = mechanism_for(budget)
        if mechanism != self.mechanism:
            raise PlanError(
                f"a {self.mechanism} calibration cannot spend {budget!r} ({mechanism} noise); "
                "calibrate the strategy for that budget"
            )
        return Calibration(
            mechanism, self.norm, self.sensitivity,
            noise_scale(mechanism, self.sensitivity, budget), budget,
        )  # fmt: skip


def calibrate(budget: Budget, strategy: _HasSensitivity) -> Calibration:
    """Calibrate the noise of measuring ``strategy`` with exactly ``budget``.

    Parameters
    ----------
    budget : PureDP, zCDP or ApproxDP
        What the measurement spends.
    strategy : LinearQuery
        Anything with ``sensitivity(p)``, the largest column ``p``-norm.

    Returns
    -------
    Calibration

    Raises
    ------
    dpdask.errors.PlanError
        If ``budget`` is not a budget or the sensitivity is not positive and finite.

    Examples
    --------
    >>> from dpdask.linalg import Identity
    >>> c = calibrate(zCDP("0.5"), Identity(4))
    >>> c.mechanism, c.norm, c.sensitivity, c.scale, c.variance
    ('gaussian', 2, 1.0, 1.0, 1.0)
    """
    mechanism = mechanism_for(budget)
    norm = MECHANISM_NORM[mechanism]
    sens = float(strategy.sensitivity(norm))
    if not (sens > 0 and sens != float("inf")):
        raise PlanError(f"the strategy's L{norm} sensitivity is {sens}; it must be positive")
    return Calibration(mechanism, norm, sens, noise_scale(mechanism, sens, budget), budget)
