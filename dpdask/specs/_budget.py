"""The one budget parser of every spec: one budget of exactly one form."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpdask.errors import SpecError
from dpdask.privacy import ApproxDP, Budget, PureDP, as_fraction, zCDP
from dpdask.specs._fields import as_mapping, check_keys

__all__ = ["BUDGET_FORMS", "BUDGET_KEYS", "parse_budget"]

BUDGET_FORMS = ("zcdp", "rho", "epsilon")
BUDGET_KEYS = (*BUDGET_FORMS, "delta")

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
    """One budget of exactly one form: ``zcdp``, ``rho``, or ``epsilon`` (with ``delta``).

    Parameters
    ----------
    raw : Any
        The spec's mapping (as read from YAML).
    where : str
        The dotted field, for messages (``privacy``, ``privacy.dataset``).
    allowed : tuple of str
        The keys the mapping may hold: the budget forms a model accepts and the other
        keys of its ``privacy`` mapping (which this function ignores). A form not in
        ``allowed`` is an unknown key.

    Returns
    -------
    Budget
        ``zCDP``, ``PureDP`` (also for ``delta: 0``) or ``ApproxDP``, its value within
        ``[1e-12, 1e6]``.

    Raises
    ------
    SpecError
        Naming ``where`` (and the key) for any problem.

    Examples
    --------
    >>> parse_budget({"epsilon": "1/2"}, "privacy")
    PureDP(epsilon=0.5)
    >>> parse_budget({"zcdp": 1, "epsilon": 1}, "privacy")
    Traceback (most recent call last):
    ...
    dpdask.errors.SpecError: privacy: give exactly one budget form, not ['zcdp', 'epsilon']
    """
    d = as_mapping(raw, where, "a mapping like {zcdp: 1} or {epsilon: 1}")
    check_keys(d, allowed, where)
    forms = [k for k in BUDGET_FORMS if k in d]
    if len(forms) > 1:
        raise SpecError(f"{where}: give exactly one budget form, not {forms}")
    if not forms:
        if "delta" in d:
            raise SpecError(f"{where}.delta: goes with epsilon; give epsilon too")
        given = [k for k in BUDGET_FORMS if k in allowed]
        raise SpecError(f"{where}: give one of {', '.join(given)}")
    form = forms[0]
    if "delta" in d and form != "epsilon":
        raise SpecError(f"{where}.delta: goes with epsilon, not with {form}")
    try:
        if isinstance(d[form], bool) or as_fraction(d[form], form) <= 0:
            raise SpecError(f"{where}.{form}: must be a positive number, got {d[form]!r}")
        if form in ("zcdp", "rho"):
            budget: Budget = zCDP(d[form])
        else:
            delta = d.get("delta")
            if delta is None or as_fraction(delta, "delta") == 0:
                budget = PureDP(d["epsilon"])
            else:
                budget = ApproxDP(d["epsilon"], delta)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    value = budget._values()[0]
    if not _BUDGET_RANGE[0] <= value <= _BUDGET_RANGE[1]:
        raise SpecError(
            f"{where}.{form}: {_approx(value)} is outside [{float(_BUDGET_RANGE[0]):g}, "
            f"{float(_BUDGET_RANGE[1]):g}]: the noise would be "
            + ("infinite" if value < _BUDGET_RANGE[0] else "meaningless")
        )
    return budget
