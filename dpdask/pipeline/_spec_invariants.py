"""The ``invariants:`` and ``constraints:`` parts of a release spec: counts published
without noise, and the bounds and structural zeros the estimates must keep.

::

    invariants:                       # level -> counts published exactly (no noise)
      state: [total]                  # the state's total population (from the data)
      block: [housing_units]          # a public block attribute the data carries
    constraints:
      empty_units: true               # nobody in a block with no housing unit and no
                                      # group-quarters facility (or {facilities:
                                      # gq_population}: a type's facility is there where
                                      # its public population is positive)
      nursing_minors: true            # nobody under 18 in nursing facilities (pl94-full)
      gq_bounds: {capacity: 50}       # each type's population at least its facilities,
                                      # at most 50 per facility (or an attribute's name);
                                      # true: the lower bound alone (pl94-full)
      cells:                          # the sum of the masked cells of each unit
        - {level: block, mask: {hhgq: [3], votingage: [0]}, upper: 0}

An invariant holds at its level and every level above (its sums); the block
attributes' constraints hold at the data's finest level and, summed, above. Names are
checked here against the spec (its levels, its domain, the attributes its data format
can carry); :func:`check_data_attributes` checks them against the data once it is read.
Every problem is a :class:`~dpdask.errors.SpecError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import SpecError
from dpdask.pipeline._spec_fields import as_bool, as_mapping, check_keys

__all__ = [
    "ATTRIBUTE_INVARIANTS",
    "CONSTRAINT_KEYS",
    "INVARIANT_NAMES",
    "NO_INVARIANTS",
    "CellBound",
    "Invariants",
    "check_data_attributes",
    "parse_invariants",
]

#: the counts ``invariants:`` may name, and what each publishes exactly
INVARIANT_NAMES: dict[str, str] = {
    "total": "the total population (the data's own count)",
    "housing_units": "housing units (a public unit attribute)",
    "gq_facilities": "group-quarters facilities by type (a public unit attribute)",
    "gq_population": "population by household / group-quarters type (a public attribute)",
}
#: the invariants that are public unit attributes of the data
ATTRIBUTE_INVARIANTS = ("housing_units", "gq_facilities", "gq_population")
CONSTRAINT_KEYS = ("empty_units", "nursing_minors", "gq_bounds", "cells")
FACILITY_SOURCES = ("gq_facilities", "gq_population")
#: the unit attributes a data format may carry (``store``: whatever its metadata lists)
FORMAT_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "pl94": ("housing_units", "occupied_units", "gq_population"),
    "synthetic-blocks": ("gq_facilities", "gq_population", "housing_units"),
    "synthetic": (),
    "ri2010": (),
    "records": (),
}
_FULL = "the pl94-full domain (an hhgq axis of the 8 household / group-quarters types)"


@dataclass(frozen=True)
class CellBound:
    """``lower <= sum of the masked cells <= upper`` for each unit of ``level`` (and,
    summed, above). ``mask`` holds, per attribute, the codes selected (the cells are
    those with a selected code on every attribute named); ``upper`` ``None``: no bound."""

    level: str
    mask: tuple[tuple[str, tuple[int, ...]], ...]
    lower: int = 0
    upper: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"level": self.level, "mask": {a: list(c) for a, c in self.mask}}
        if self.lower:
            d["lower"] = self.lower
        if self.upper is not None:
            d["upper"] = self.upper
        return d


@dataclass(frozen=True)
class Invariants:
    """A spec's invariants and constraints, checked (module notes).

    Attributes
    ----------
    levels : tuple of (str, tuple of str)
        Each level named under ``invariants:`` and its invariants, in the spec's order.
    empty_units : str or None
        The attribute a block's facilities are read from (``gq_facilities``, or
        ``gq_population``: a type is present where its population is positive) when
        ``empty_units`` is on; ``None`` otherwise.
    nursing_minors : bool
    gq_bounds : bool
    capacity : str or int or None
        ``gq_bounds``' upper bound: an attribute's name (``(n, 8)`` per block) or the
        persons per facility; ``None``: none.
    cells : tuple of CellBound
    """

    levels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    empty_units: str | None = None
    nursing_minors: bool = False
    gq_bounds: bool = False
    capacity: str | int | None = None
    cells: tuple[CellBound, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.levels) or self.has_constraints

    @property
    def has_constraints(self) -> bool:
        """Whether any constraint is stated."""
        return bool(self.empty_units or self.nursing_minors or self.gq_bounds or self.cells)

    def names(self, level: str) -> tuple[str, ...]:
        """The invariants declared at ``level`` (none: ``()``)."""
        return dict(self.levels).get(level, ())

    def attributes(self) -> tuple[str, ...]:
        """The unit attributes of the data these invariants and constraints read."""
        used = {n for _lv, names in self.levels for n in names if n in ATTRIBUTE_INVARIANTS}
        if self.empty_units:
            used |= {"housing_units", self.empty_units}
        if self.gq_bounds:
            used.add("gq_facilities")
        if isinstance(self.capacity, str):
            used.add(self.capacity)
        return tuple(sorted(used))

    def constraints_dict(self) -> dict[str, Any]:
        """The constraints, JSON-safe, as a spec states them (normalised)."""
        out: dict[str, Any] = {}
        if self.empty_units:
            out["empty_units"] = {"facilities": self.empty_units}
        if self.nursing_minors:
            out["nursing_minors"] = True
        if self.gq_bounds:
            out["gq_bounds"] = {} if self.capacity is None else {"capacity": self.capacity}
        if self.cells:
            out["cells"] = [c.to_dict() for c in self.cells]
        return out

    def statement(self) -> dict[str, Any] | None:
        """What a release states about them (plan, ledger binding, release attributes):
        ``{"invariants": {level: [names]}, "constraints": {...}, "attributes": [...]}``;
        ``None`` when the spec has neither."""
        if not self:
            return None
        return {
            "invariants": {lv: list(names) for lv, names in self.levels},
            "constraints": self.constraints_dict(),
            "attributes": list(self.attributes()),  # public attributes they read
        }


NO_INVARIANTS = Invariants()


def _levels_check(level: Any, levels: tuple[str, ...] | None, where: str) -> str:
    if not isinstance(level, str):
        raise SpecError(f"{where}: a level name, got {level!r}")
    if levels is not None and level not in levels:
        raise SpecError(f"{where}: {level!r} is not a released level ({list(levels)})")
    return level


def _full(domain: Domain) -> bool:
    return "hhgq" in domain and domain["hhgq"] == len(census.HHGQ) and "votingage" in domain


def _needs_full(domain: Domain, where: str) -> None:
    if not _full(domain):
        raise SpecError(f"{where}: needs {_FULL}; the spec's domain is {domain.to_dict()}")


def _carried(fmt: str, name: str, where: str) -> None:
    have = FORMAT_ATTRIBUTES.get(fmt)
    if have is not None and name not in have:
        raise SpecError(
            f"{where}: data of format {fmt!r} carries no unit attribute {name!r} "
            f"(it carries: {', '.join(have) or 'none'})"
        )


def _invariants(
    raw: Any, levels: tuple[str, ...] | None, domain: Domain, fmt: str
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    d = as_mapping(raw, "invariants", "a mapping of level to a list of invariant names")
    out = []
    for level, names in d.items():
        where = f"invariants.{level}"
        _levels_check(level, levels, "invariants")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            raise SpecError(f"{where}: expected a list of {list(INVARIANT_NAMES)}, got {names!r}")
        for name in names:
            if not isinstance(name, str) or name not in INVARIANT_NAMES:
                raise SpecError(f"{where}: {name!r} is not one of {list(INVARIANT_NAMES)}")
            if name in ATTRIBUTE_INVARIANTS:
                _carried(fmt, name, where)
            if name == "gq_population":
                _needs_full(domain, where)
        if len(set(names)) != len(names):
            raise SpecError(f"{where}: {names} repeats a name")
        out.append((level, tuple(names)))
    return tuple(out)


def _nonneg(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _mask(raw: Any, domain: Domain, where: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    d = as_mapping(raw, where, "a mapping of attribute to a list of codes")
    if not d:
        raise SpecError(f"{where}: name at least one attribute")
    out = []
    for attr, codes in d.items():
        if attr not in domain:
            raise SpecError(f"{where}: {attr!r} is not an attribute of the domain {list(domain)}")
        codes = [codes] if isinstance(codes, int) and not isinstance(codes, bool) else codes
        ok = isinstance(codes, list) and codes
        if not ok or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < domain[attr] for c in codes
        ):
            raise SpecError(
                f"{where}.{attr}: expected a list of codes in [0, {domain[attr]}), got {codes!r}"
            )
        out.append((str(attr), tuple(sorted(set(codes)))))
    return tuple(out)


def _cells(raw: Any, levels: tuple[str, ...] | None, domain: Domain) -> tuple[CellBound, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError("constraints.cells: expected a list of {level, mask, lower, upper}")
    out = []
    for i, item in enumerate(raw):
        where = f"constraints.cells[{i}]"
        d = as_mapping(item, where, "a mapping with level, mask and lower or upper")
        check_keys(d, ["level", "mask", "lower", "upper"], where)
        if "level" not in d or "mask" not in d:
            raise SpecError(f"{where}: needs level and mask")
        if "lower" not in d and "upper" not in d:
            raise SpecError(f"{where}: needs lower or upper")
        level = _levels_check(d["level"], levels, f"{where}.level")
        lower = _nonneg(d.get("lower", 0), f"{where}.lower")
        upper = None if d.get("upper") is None else _nonneg(d["upper"], f"{where}.upper")
        if upper is not None and lower > upper:
            raise SpecError(f"{where}: lower {lower} is above upper {upper}")
        out.append(CellBound(level, _mask(d["mask"], domain, f"{where}.mask"), lower, upper))
    return tuple(out)


def _empty_units(raw: Any, fmt: str) -> str | None:
    if isinstance(raw, bool):
        facilities: Any = "gq_facilities" if raw else None
    else:
        d = as_mapping(raw, "constraints.empty_units", "true, false or {facilities: NAME}")
        check_keys(d, ["facilities"], "constraints.empty_units")
        facilities = d.get("facilities", "gq_facilities")
        if facilities not in FACILITY_SOURCES:
            raise SpecError(
                f"constraints.empty_units.facilities: {facilities!r} is not one of "
                f"{list(FACILITY_SOURCES)}"
            )
    if facilities is not None:
        _carried(fmt, "housing_units", "constraints.empty_units")
        _carried(fmt, facilities, "constraints.empty_units")
    return None if facilities is None else str(facilities)


def _gq_bounds(raw: Any, domain: Domain, fmt: str) -> tuple[bool, str | int | None]:
    if isinstance(raw, bool):
        on, capacity = raw, None
    else:
        d = as_mapping(raw, "constraints.gq_bounds", "true, false or {capacity: ...}")
        check_keys(d, ["capacity"], "constraints.gq_bounds")
        on, capacity = True, d.get("capacity")
        if isinstance(capacity, str):
            _carried(fmt, capacity, "constraints.gq_bounds.capacity")
        elif capacity is not None:
            capacity = _nonneg(capacity, "constraints.gq_bounds.capacity")
    if on:
        _needs_full(domain, "constraints.gq_bounds")
        _carried(fmt, "gq_facilities", "constraints.gq_bounds")
    return on, capacity


def parse_invariants(
    invariants: Any, constraints: Any, levels: tuple[str, ...] | None, domain: Domain, fmt: str
) -> Invariants:
    """The spec's ``invariants:`` and ``constraints:`` (either may be ``None``), checked
    against its ``levels`` (``None``: the data's, checked by :func:`check_data_attributes`),
    ``domain`` and data format ``fmt``.

    Raises
    ------
    SpecError
        Naming the field: an unknown key or invariant name, a level not released, an
        attribute the data format cannot carry, a constraint that needs the pl94-full
        domain on another, a mask outside the domain, a lower bound above an upper one.

    Examples
    --------
    >>> from dpdask.census import pl94_domain
    >>> inv = parse_invariants({"state": ["total"]}, {"empty_units": {"facilities":
    ...     "gq_population"}}, ("state", "block"), pl94_domain(), "pl94")
    >>> inv.statement()["invariants"], inv.attributes()
    ({'state': ['total']}, ('gq_population', 'housing_units'))
    """
    levels_ = () if invariants is None else _invariants(invariants, levels, domain, fmt)
    if constraints is None:
        return Invariants(levels_)
    c = as_mapping(constraints, "constraints", f"a mapping of {list(CONSTRAINT_KEYS)}")
    check_keys(c, CONSTRAINT_KEYS, "constraints")
    nursing = as_bool(c.get("nursing_minors", False), "constraints.nursing_minors")
    if nursing:
        _needs_full(domain, "constraints.nursing_minors")
    gq_bounds, capacity = _gq_bounds(c.get("gq_bounds", False), domain, fmt)
    cells = _cells(c["cells"], levels, domain) if c.get("cells") is not None else ()
    empty = _empty_units(c.get("empty_units", False), fmt)
    return Invariants(levels_, empty, nursing, gq_bounds, capacity, cells)


def check_data_attributes(
    inv: Invariants, data_levels: tuple[str, ...], released: tuple[str, ...], carried: Any
) -> None:
    """Refuse invariants the data cannot give: a level not released, an attribute it does
    not carry (``carried``: the names it does).

    Raises
    ------
    SpecError
        Naming ``invariants.<level>`` or ``constraints``.
    """
    named = [lv for lv, _ in inv.levels] + [c.level for c in inv.cells]
    for lv in named:
        if lv not in released:
            where = "invariants" if lv in dict(inv.levels) else "constraints.cells"
            raise SpecError(f"{where}: {lv!r} is not a released level ({list(released)})")
    have = tuple(carried)
    for name in inv.attributes():
        if name not in have:
            where = next(
                (f"invariants.{lv}" for lv, names in inv.levels if name in names),
                _constraint_using(inv, name),
            )
            raise SpecError(
                f"{where}: the data carries no unit attribute {name!r} "
                f"(it carries: {', '.join(have) or 'none'}; data levels {list(data_levels)})"
            )


def _constraint_using(inv: Invariants, name: str) -> str:
    """The constraint field that reads attribute ``name``."""
    if inv.empty_units and name in ("housing_units", inv.empty_units):
        return "constraints.empty_units"
    if name == inv.capacity:
        return "constraints.gq_bounds.capacity"
    return "constraints.gq_bounds"
