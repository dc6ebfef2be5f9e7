"""From a release budget to each geography level's noise: the one place it is done.

A release spends its budget over its geography levels (sequential composition:
a person is in one unit of every level) and each level's measurement adds noise
calibrated to that level's share. :func:`split_levels` makes the split (exact,
so the shares sum to the total) and :func:`~dpdask.privacy.calibrate` the
calibration; the spec (:meth:`dpdask.pipeline.ReleaseSpec.level_budgets`), the
release (:func:`dpdask.graph.level_plans`) and the plans
(:meth:`dpdask.strategy.Plan.at`) all use these two functions, so ``plan``,
``run``, the benchmarks and the published attributes agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.privacy._budget import Budget, as_fraction

__all__ = ["split_levels"]


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
    >>> from dpdask.privacy import zCDP
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
