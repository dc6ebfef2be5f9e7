"""The ``privacy:`` part of a release spec: one budget of exactly one form, its split
over levels, the dataset's total (budgets are read by the one parser of every kind
of spec, :func:`dpdask.specs.parse_budget`) and the neighbour relation they are stated
in (:mod:`dpdask.privacy.neighbours`)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpdask.errors import PlanError, SpecError
from dpdask.privacy import Budget, as_fraction, split_levels
from dpdask.privacy.neighbours import ADD_REMOVE, NEIGHBOURS, Neighbours, convert
from dpdask.specs import BUDGET_KEYS, as_mapping, parse_budget

__all__ = [
    "BUDGET_KEYS", "NEIGHBOUR_NAMES", "PRIVACY_KEYS", "charged_budget", "parse_budget",
    "parse_neighbours", "parse_split",
]  # fmt: skip


PRIVACY_KEYS = (*BUDGET_KEYS, "split", "dataset", "neighbours")
#: the relations ``privacy.neighbours`` may name (the first is the default)
NEIGHBOUR_NAMES = tuple(NEIGHBOURS)


def parse_neighbours(raw: Any) -> Neighbours:
    """The relation ``privacy.neighbours`` names (absent: add/remove one person).

    Raises
    ------
    SpecError
        Naming ``privacy.neighbours`` for anything but a known relation's name.
    """
    if raw is None:
        return ADD_REMOVE
    if not isinstance(raw, str) or raw not in NEIGHBOURS:
        raise SpecError(f"privacy.neighbours: {raw!r} is not one of {list(NEIGHBOUR_NAMES)}")
    return NEIGHBOURS[raw]


def charged_budget(stated: Budget, neighbours: Neighbours, where: str) -> Budget:
    """The add/remove budget dpdask charges and calibrates with for a budget ``stated``
    in ``neighbours``: the same noise (for counting queries, whose strategies have no
    negative Gram entry: :func:`dpdask.privacy.neighbours.convert`).

    Raises
    ------
    SpecError
        Naming ``where`` for a budget with no exact conversion ((epsilon, delta)).
    """
    try:
        return convert(stated, neighbours, ADD_REMOVE)
    except PlanError as exc:
        raise SpecError(f"{where}: under privacy.neighbours: {neighbours}, {exc}") from None


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
