"""The ``privacy:`` part of a release spec: one budget of exactly one form, its split
over levels, and the dataset's total."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpdask.errors import SpecError
from dpdask.pipeline._spec_fields import as_mapping, check_keys
from dpdask.privacy import ApproxDP, Budget, PureDP, as_fraction, split_levels, zCDP

__all__ = ["BUDGET_KEYS", "PRIVACY_KEYS", "parse_budget", "parse_split"]


_BUDGET_FORMS = ("zcdp", "rho", "epsilon")
BUDGET_KEYS = (*_BUDGET_FORMS, "delta")
PRIVACY_KEYS = (*BUDGET_KEYS, "split", "dataset")


# budgets outside this range give noise scales that overflow a float (or none at all)
_BUDGET_RANGE = (Fraction(1, 10**12), Fraction(10**6))


def _approx(q: Fraction) -> str:
    """An exact value, shortly, even where it is beyond a float."""
    if q > 10**300:
        return "above 1e300"
    if 0 < q < Fraction(1, 10**300):
        return "below 1e-300"
    return f"{float(q):.3g}"


def parse_budget(raw: Any, where: str, allowed: tuple[str, ...] = BUDGET_KEYS) -> Budget:
    """One budget of exactly one form: ``zcdp``, ``rho``, or ``epsilon`` (with ``delta``)."""
    d = as_mapping(raw, where, "a mapping like {zcdp: 1} or {epsilon: 1}")
    check_keys(d, allowed, where)
    forms = [k for k in _BUDGET_FORMS if k in d]
    if len(forms) > 1:
        raise SpecError(f"{where}: give exactly one budget form, not {forms}")
    if not forms:
        if "delta" in d:
            raise SpecError(f"{where}.delta: goes with epsilon; give epsilon too")
        raise SpecError(f"{where}: give one of zcdp, rho, epsilon, or epsilon with delta")
    form = forms[0]
    if "delta" in d and form != "epsilon":
        raise SpecError(f"{where}.delta: goes with epsilon, not with {form}")
    try:
        if form in ("zcdp", "rho"):
            budget: Budget = zCDP(d[form])
        else:
            delta = d.get("delta")
            if delta is None or as_fraction(delta, "delta") == 0:
                budget = PureDP(d["epsilon"])
            else:
                budget = ApproxDP(d["epsilon"], delta)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    value = budget._values()[0]
    if not _BUDGET_RANGE[0] <= value <= _BUDGET_RANGE[1]:
        raise SpecError(
            f"{where}.{form}: {_approx(value)} is outside [{float(_BUDGET_RANGE[0]):g}, "
            f"{float(_BUDGET_RANGE[1]):g}]: the noise would be "
            + ("infinite" if value < _BUDGET_RANGE[0] else "meaningless")
        )
    return budget


def parse_split(raw: Any, levels: tuple[str, ...] | None, total: Budget) -> dict[str, Fraction]:
    d = as_mapping(raw, "privacy.split", "a mapping of level to share")
    try:
        split = {str(k): as_fraction(v, f"share of {k}") for k, v in d.items()}
    except (TypeError, ValueError) as exc:
        raise SpecError(f"privacy.split: {exc}") from None
    if any(v <= 0 for v in split.values()):
        raise SpecError("privacy.split: shares must be positive")
    if levels is not None:
        try:
            split_levels(total, levels, split)
        except ValueError as exc:
            raise SpecError(f"privacy.split: {exc}") from None
    return split
