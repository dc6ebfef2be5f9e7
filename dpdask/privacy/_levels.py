"""From a release budget to each geography level's noise: the one place it is done.

A release spends its budget over its geography levels (sequential composition:
a person is in one unit of every level) and each level's measurement adds noise
calibrated to that level's share. :func:`split_levels` makes the split (exact,
so the shares sum to the total) and :func:`noise_scale` the calibration; the
spec (:meth:`dpdask.pipeline.ReleaseSpec.level_budgets`), the dataflow
(:func:`dpdask.release`, :class:`~dpdask.release._level_plan.LevelPlan`)
and the plans (:class:`dpdask.strategy.Plan`) all use these two functions, so
``plan``, ``run``, the benchmarks and the published attributes agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.privacy._budget import ApproxDP, Budget, PureDP, as_fraction, zCDP

__all__ = ["noise_scale", "split_levels"]


def _share(value: object, level: str) -> Fraction:
    try:
        share = as_fraction(value, f"the share of level {level!r}")
    except TypeError as exc:
        raise PlanError(str(exc)) from None
    if share <= 0:
        raise PlanError(f"the share of level {level!r} must be positive, got {value!r}")
    return share


def split_levels(
    total: Budget,
    levels: Sequence[str],
    shares: Mapping[str, object] | Sequence[object] | None = None,
) -> dict[str, Budget]:
    """Split a release budget over its geography levels, exactly.

    Parameters
    ----------
    total : PureDP, zCDP or ApproxDP
        The release's budget.
    levels : sequence of str
        The released levels (distinct), in release order.
    shares : mapping of level to number, sequence of numbers, or None
        Each level's share (relative weights, positive; exact numbers as for
        :func:`~dpdask.privacy.as_fraction`): a mapping with exactly the released
        levels, a sequence in the order of ``levels``, or ``None`` for an even split.

    Returns
    -------
    dict of str to Budget
        Each level's budget, in the order of ``levels``, of the type of ``total``;
        the budgets sum exactly to ``total`` (:meth:`~dpdask.privacy.Budget.split`).

    Raises
    ------
    TypeError
        If ``total`` is not a budget.
    ValueError
        For no levels, repeated levels, a mapping with missing or extra levels, a
        sequence of the wrong length, or a share that is not a positive number.

    Examples
    --------
    >>> split_levels(zCDP(1), ["state", "county"], {"state": 1, "county": 3})
    {'state': zCDP(rho=0.25), 'county': zCDP(rho=0.75)}
    """
    if not isinstance(total, Budget):
        raise BudgetTypeError(f"total must be a PureDP, zCDP or ApproxDP budget, got {total!r}")
    if isinstance(levels, str):
        raise PlanError(f"levels must be a sequence of level names, not the string {levels!r}")
    levels = tuple(levels)
    if not levels:
        raise PlanError("no levels to split the budget over")
    repeated = sorted({lv for lv in levels if levels.count(lv) > 1})
    if repeated:
        raise PlanError(f"level(s) {repeated} are repeated")
    if shares is None:
        weights = [Fraction(1)] * len(levels)
    elif isinstance(shares, Mapping):
        missing = [lv for lv in levels if lv not in shares]
        if missing:
            raise PlanError(f"no share for level(s) {missing}")
        extra = sorted(str(k) for k in set(shares) - set(levels))
        if extra:
            raise PlanError(f"level(s) {extra} have a share but are not released {list(levels)}")
        weights = [_share(shares[lv], lv) for lv in levels]
    elif isinstance(shares, str | bytes) or not isinstance(shares, Sequence):
        raise PlanError(f"shares must be a mapping of level to share or a sequence, got {shares!r}")
    else:
        if len(shares) != len(levels):
            raise PlanError(f"{len(shares)} budget shares for {len(levels)} levels {list(levels)}")
        weights = [_share(s, lv) for s, lv in zip(shares, levels, strict=True)]
    return dict(zip(levels, total.split(weights), strict=True))


def noise_scale(mechanism: str, sensitivity: float, budget: Budget) -> float:
    """The noise scale of one measurement spending exactly ``budget``.

    Parameters
    ----------
    mechanism : {"laplace", "gaussian"}
        Laplace noise for a :class:`~dpdask.privacy.PureDP` budget, Gaussian noise for
        a :class:`~dpdask.privacy.zCDP` or :class:`~dpdask.privacy.ApproxDP` one.
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
    TypeError
        If ``budget`` is not a budget.
    ValueError
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
        raise BudgetTypeError(f"budget must be a PureDP, zCDP or ApproxDP budget, got {budget!r}")
    if mechanism not in ("laplace", "gaussian"):
        raise PlanError(f"unknown mechanism {mechanism!r}; expected 'laplace' or 'gaussian'")
    if isinstance(budget, PureDP):
        if mechanism != "laplace":
            raise PlanError(f"a pure-DP budget needs Laplace noise, not {mechanism}")
        return float(budget.laplace_scale(sensitivity))
    if isinstance(budget, zCDP | ApproxDP):
        if mechanism != "gaussian":
            raise PlanError(
                f"a {type(budget).__name__} budget needs Gaussian noise, not {mechanism}"
            )
        return float(budget.gaussian_sigma(sensitivity))
    raise BudgetTypeError(f"unsupported budget {budget!r}")  # pragma: no cover - no other budgets
