"""The ``privacy:`` part of a release spec: one budget of exactly one form, its split
over levels, and the dataset's total (budgets are read by the one parser of every kind
of spec, :func:`dpdask.specs.parse_budget`)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpdask.errors import SpecError
from dpdask.privacy import Budget, as_fraction, split_levels
from dpdask.specs import BUDGET_KEYS, as_mapping, parse_budget

__all__ = ["BUDGET_KEYS", "PRIVACY_KEYS", "parse_budget", "parse_split"]


PRIVACY_KEYS = (*BUDGET_KEYS, "split", "dataset")


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
