"""The budget of a sum release: ``rho`` to the threshold, the rest to the measurement.

The two stages are two measurements in the ledger (sequential composition): the
threshold's charge (:func:`threshold_charge`) and the measurement's
(:func:`dpdask.measure.charge_level` on :meth:`~dpdask.sums.SumMechanism.plan`).
"""

from __future__ import annotations

from typing import Any

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.noise import SecretKey, as_secret_key
from dpdask.privacy import Charge, PureDP, as_fraction
from dpdask.sums.thresholds import ThresholdResult

__all__ = ["split_budget", "threshold_charge"]


def split_budget(privacy: PureDP, rho: Any) -> tuple[PureDP | None, PureDP]:
    """``(rho epsilon, (1 - rho) epsilon)`` exactly; ``rho = 0`` gives ``(None, privacy)``.

    Examples
    --------
    >>> split_budget(PureDP("0.01"), "0.1")
    (PureDP(epsilon=0.001), PureDP(epsilon=0.009))
    """
    if not isinstance(privacy, PureDP):
        raise BudgetTypeError(f"sum releases are pure DP; got {privacy!r}")
    r = as_fraction(rho, "rho")
    if not 0 <= r < 1:
        raise PlanError(f"rho must lie in [0, 1), got {rho!r}")
    if r == 0:
        return None, privacy
    first, second = privacy.split([r, 1 - r])
    return first, second


def threshold_charge(
    result: ThresholdResult,
    release: str,
    run_id: str,
    level: str,
    measurement: str,
    key: SecretKey | bytes,
) -> Charge:
    """The ledger charge of a threshold: its budget (one run times the number of runs).

    The mechanism is recorded as ``discrete_laplace`` with the statistic's sensitivity
    and the smallest noise scale used; SVT's guarantee is its own theorem (the recorded
    scale alone implies half of it), so the charge's ``privacy`` is the run's budget
    times the number of runs.
    """
    runs = int(result.theta.size)
    return Charge(
        release=release,
        run_id=run_id,
        level=level,
        measurement=measurement,
        mechanism="discrete_laplace",
        sensitivity=result.sensitivity,
        noise_scale=result.noise_scale,
        privacy=result.privacy * runs,
        key_fingerprint=as_secret_key(key).fingerprint(),
    )
