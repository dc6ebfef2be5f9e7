"""A release's invariants and constraints as the estimator sees them, from public input.

:func:`release_constraints` turns a spec's ``invariants:`` and ``constraints:``
(:mod:`dpdask.pipeline._spec_invariants`) and its data (the store's public unit
attributes, and for ``total`` the data's own totals, which the agency declares public)
into a :class:`ReleaseConstraints`: per released level the units'
:class:`~dpdask.reconstruct.topdown.Constraints` (:meth:`ReleaseConstraints.at`, for
all units or a slice), the invariants' values, and the statement the plan, the ledger
and the release make. Every bound holds at its level and, summed, at every level above:
a coarser unit's bounds are those of its descendants added up (a unit has a structural
zero where each of its blocks has), so the levels agree by construction and a conflict
is a fact of the public input. :meth:`ReleaseConstraints.check` finds it before any
charge (:func:`~dpdask.reconstruct.topdown.check_hierarchy`, by families).

The query rows, the same at every level: ``total``; on the ``pl94-full`` domain the
population of each group-quarters type (``<type> population``); one per
``constraints.cells`` entry (``cells[i]``).

Until an estimator honours them, a spec that states invariants or constraints is
refused before any charge (:func:`check_estimator`): :data:`HONOURED_BY` names the
``reconstruct:`` methods that do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask import census
from dpdask.errors import ArgumentError, DataError, SpecError
from dpdask.pipeline._spec_invariants import (
    ATTRIBUTE_INVARIANTS,
    CONSTRAINT_KEYS,
    FACILITY_SOURCES,
    INVARIANT_NAMES,
    Invariants,
)
from dpdask.reconstruct.topdown import Constraints, check_hierarchy, unit_positions, unpack
from dpdask.reconstruct.topdown import pack_binary as pack

__all__ = [
    "CONSTRAINT_KEYS",
    "FACILITY_SOURCES",
    "HONOURED_BY",
    "INVARIANT_NAMES",
    "Invariants",
    "LevelConstraints",
    "ReleaseConstraints",
    "check_estimator",
    "checked_constraints",
    "release_constraints",
    "unit_totals",
]

#: the ``reconstruct:`` methods whose estimates honour invariants and constraints: the
#: top-down fit, given them as one constrained pass per family (``dpdask.graph``)
HONOURED_BY: frozenset[str] = frozenset({"topdown"})
_CELLS_PER_CHECK = 1 << 22  # (units x cells) per block of constraints checked at once


def check_estimator(spec: Any) -> None:
    """Refuse a spec with invariants or constraints its ``reconstruct`` method would not
    honour (publishing noisy counts the release says are exact).

    Raises
    ------
    SpecError
        Naming ``reconstruct`` and the methods that honour them.
    """
    from dpdask.pipeline._marginal_run import is_marginal_spec

    inv: Invariants = spec.invariants
    if spec.passes is not None and is_marginal_spec(spec):
        raise SpecError(
            "reconstruct.passes: a marginal (residual) release has no top-down fit to run "
            "by passes; remove reconstruct.passes"
        )
    if inv and is_marginal_spec(spec):  # released by the residual path, no top-down fit
        raise SpecError(
            "invariants: a marginal (residual) release does not honour invariants or "
            "constraints; remove invariants: and constraints:"
        )
    if inv and spec.reconstruct not in HONOURED_BY:
        which = ", ".join(sorted(HONOURED_BY)) or "none yet"
        raise SpecError(
            f"reconstruct: {spec.reconstruct!r} does not honour invariants or constraints "
            f"(methods that do: {which}); remove invariants: and constraints: or choose one"
        )


def unit_totals(store: Any, rows_per_block: int | None = None) -> np.ndarray:
    """Each finest unit's total count (int64, ``(n_units,)``), read a block of rows at a
    time."""
    n = store.geography.n_units()
    step = rows_per_block or max(1, _CELLS_PER_CHECK // max(1, store.domain.size))
    out = np.zeros(n, dtype=np.int64)
    for a in range(0, n, step):
        b = min(n, a + step)
        out[a:b] = np.asarray(store.rows(a, b)).reshape(b - a, -1).sum(axis=1)
    return out


def _sum_to(values: np.ndarray, ancestor: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros((k, *values.shape[1:]), dtype=np.int64)
    np.add.at(out, ancestor, values)
    return out


@dataclass(frozen=True, eq=False)
class LevelConstraints:
    """One released level's constraints (or some of its units'), built a chunk of units
    at a time from the units' attributes: what a release holds per level and each of its
    tasks builds its chunk's :class:`~dpdask.reconstruct.topdown.Constraints` from
    (:meth:`take`, :meth:`part`), never the level's ``(units, cells)`` bounds at once.

    Attributes
    ----------
    invariants : Invariants
    level : str
    units : tuple of str
        The units' ids.
    queries, labels
        As :class:`ReleaseConstraints`'.
    values, attrs, below
        The units' invariants' values, public attributes (summed to the level) and
        number of units of each ``constraints.cells`` level below them.
    source : ReleaseConstraints or None
        The release's, which checks every level (:meth:`check`); None for a part.
    """

    invariants: Invariants
    level: str
    units: tuple[str, ...]
    queries: np.ndarray
    labels: tuple[str, ...]
    values: dict[str, np.ndarray]
    shape: tuple[int, ...]
    axes: dict[str, int]
    attrs: dict[str, np.ndarray] = field(repr=False)
    below: np.ndarray = field(repr=False)
    source: ReleaseConstraints | None = field(default=None, repr=False)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)  # memo of counts()

    @property
    def k(self) -> int:
        """Number of units."""
        return len(self.units)

    @property
    def n(self) -> int:
        """Number of cells."""
        return int(np.prod(self.shape))

    def __getstate__(self) -> dict[str, Any]:
        # a part travels inside each of its chunk's tasks: its 0/1 query rows as bits
        # (the same rows in every part, 16 KB a row of the 2,016-cell domain otherwise)
        return {**self.__dict__, "queries": pack(self.queries)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "queries": unpack(state["queries"])})

    def part(self, rows: slice | Sequence[int] | np.ndarray) -> LevelConstraints:
        """The units ``rows`` alone: small to send to a task (their attributes only)."""
        r = unit_positions(rows, self.k)
        attrs = {a: v[r] for a, v in self.attrs.items()}
        sliced = {id(self.attrs[a]): v for a, v in attrs.items()}  # an invariant's values
        values = {a: sliced[id(v)] if id(v) in sliced else v[r] for a, v in self.values.items()}
        return LevelConstraints(
            self.invariants, self.level, tuple(self.units[i] for i in r), self.queries,
            self.labels, values, self.shape, self.axes, attrs, self.below[r],
        )  # fmt: skip

    def check(self) -> None:
        """Check every level's constraints against each other, once
        (:meth:`ReleaseConstraints.check`); what a release calls before any charge.

        Raises
        ------
        DataError
            Naming the unit and the constraints that conflict.
        ArgumentError
            For a part (it cannot check the levels).
        """
        if self.source is None:
            raise ArgumentError(f"constraints of {self.level!r}: a part cannot check the levels")
        self.source.check_once()

    def counts(self) -> dict[str, int]:
        """How many query answers are invariants (``lo == hi``) and how many cells are
        bounded to 0 (structural zeros), over the level's units: a block at a time, once."""
        if not self._counts:
            per = max(1, _CELLS_PER_CHECK // max(1, self.n))
            inv = zeros = 0
            for a in range(0, self.k, per):
                c = self.take(slice(a, a + per))
                inv += int(c.invariants().sum())
                zeros += int((c.upper == 0).sum())
            self._counts.update(invariants=inv, structural_zeros=zeros)
        return dict(self._counts)

    def take(self, rows: slice | Sequence[int] | np.ndarray | None = None) -> Constraints:
        """The constraints of the units ``rows`` (all by default).

        Returns
        -------
        Constraints
            Cell bounds ``(k, n)`` (dense: ask for a slice of a large level), the query
            rows of :attr:`queries` and their bounds.
        """
        r = unit_positions(rows, len(self.units))
        k, n = r.size, self.n
        attrs = {name: v[r] for name, v in self.attrs.items()}
        upper = np.full((k, *self.shape), np.inf)
        inv = self.invariants
        full = "hhgq" in self.axes
        if inv.empty_units:
            hu, fac = attrs["housing_units"], attrs[inv.empty_units]
            if full:
                self._zero(upper, hu == 0, hhgq=0)
                for t in range(1, len(census.HHGQ)):
                    self._zero(upper, fac[:, t] == 0, hhgq=t)
            else:
                upper[(hu == 0) & (fac[:, 1:].sum(axis=1) == 0)] = 0.0
        if inv.nursing_minors:
            self._zero(
                upper, np.ones(k, dtype=bool), hhgq=census.HHGQ.index("nursing"), votingage=0
            )
        q = self.queries.shape[0]
        lo, hi = np.full((k, q), -np.inf), np.full((k, q), np.inf)
        lo[:, 0] = 0.0
        types = len(census.HHGQ) - 1 if full else 0
        if full:
            lo[:, 1 : 1 + types] = 0.0
        if inv.gq_bounds:
            fac = attrs["gq_facilities"]
            lo[:, 1 : 1 + types] = fac[:, 1:]
            if isinstance(inv.capacity, str):
                hi[:, 1 : 1 + types] = attrs[inv.capacity][:, 1:]
            elif inv.capacity is not None:
                hi[:, 1 : 1 + types] = fac[:, 1:] * inv.capacity
        values = {name: v[r] for name, v in self.values.items()}
        if "gq_population" in values:
            gq = values["gq_population"]
            lo[:, 1 : 1 + types] = np.maximum(lo[:, 1 : 1 + types], gq[:, 1:])
            hi[:, 1 : 1 + types] = np.minimum(hi[:, 1 : 1 + types], gq[:, 1:])
            lo[:, 0] = hi[:, 0] = gq.sum(axis=1)
        if "total" in values:
            self._check_totals(r, values)
            lo[:, 0] = hi[:, 0] = values["total"]
        for i, c in enumerate(inv.cells):
            col = 1 + types + i
            count = self.below[r, i]  # the units of c.level under each unit
            lo[:, col] = c.lower * count
            if c.upper is not None:  # none where c.level is coarser than this level
                hi[:, col] = np.where(count > 0, c.upper * count, np.inf)
                if c.upper == 0:  # a structural zero of every masked cell
                    upper.reshape(k, n)[np.ix_(count > 0, self.queries[col] > 0)] = 0.0
        return Constraints(
            np.zeros((k, n)), upper.reshape(k, n), self.queries, lo, hi,
            tuple(f"{self.level} {self.units[i]}" for i in r), self.labels,
        )  # fmt: skip

    def _zero(self, upper: np.ndarray, where: np.ndarray, **codes: int) -> None:
        index: list[Any] = [np.flatnonzero(where)] + [slice(None)] * len(self.shape)
        for attr, code in codes.items():
            index[1 + self.axes[attr]] = code
        upper[tuple(index)] = 0.0

    def _check_totals(self, r: np.ndarray, values: dict[str, np.ndarray]) -> None:
        if "gq_population" not in values:
            return
        bad = np.flatnonzero(values["gq_population"].sum(axis=1) != values["total"])
        if bad.size:
            u = self.units[r[bad[0]]]
            raise DataError(
                f"{self.level} {u}: invariant total is {values['total'][bad[0]]} but its invariant "
                f"gq_population sums to {values['gq_population'][bad[0]].sum()}"
            )


@dataclass(frozen=True, eq=False)
class ReleaseConstraints:
    """Invariants and constraints of a release, per released level (module notes).

    Attributes
    ----------
    invariants : Invariants
        As the spec states them.
    levels : tuple of str
        The released levels, coarsest first.
    units : dict of str to tuple of str
        Each level's unit ids.
    parents : tuple of ndarray
        For each level but the coarsest, each unit's parent index in the level above.
    queries : ndarray
        ``(q, n)`` the query rows; ``labels`` their names.
    exact : dict of str to tuple of str
        Per level, what is published exactly there: its invariants and those declared at
        a finer level (their sums).
    values : dict of str to dict of str to ndarray
        Per level, the invariants' values per unit (``total`` ``(k,)``, attributes as
        the store holds them).
    """

    invariants: Invariants
    levels: tuple[str, ...]
    units: dict[str, tuple[str, ...]]
    parents: tuple[np.ndarray, ...]
    queries: np.ndarray
    labels: tuple[str, ...]
    exact: dict[str, tuple[str, ...]]
    values: dict[str, dict[str, np.ndarray]]
    _shape: tuple[int, ...]
    _axes: dict[str, int]
    _attrs: dict[str, dict[str, np.ndarray]] = field(repr=False)  # per level, summed
    _below: dict[str, np.ndarray] = field(repr=False)  # per level: units of each cell level
    _checked: list[bool] = field(default_factory=list, repr=False)  # check() passed

    def statement(self) -> dict[str, Any]:
        """The JSON-safe statement of the plan, ledger and release attributes, with what
        is published exactly at each level (:attr:`exact`)."""
        out = self.invariants.statement() or {"invariants": {}, "constraints": {}}
        return {**out, "exact": {lv: list(v) for lv, v in self.exact.items() if v}}

    def at(self, level: str, rows: slice | Sequence[int] | np.ndarray | None = None) -> Constraints:
        """The constraints of ``level``'s units ``rows`` (all by default): cell bounds
        ``(k, n)`` (dense: ask for a slice of a large level), the query rows of
        :attr:`queries` and their bounds (:meth:`LevelConstraints.take`)."""
        return self.level(level).take(rows)

    def level(self, level: str) -> LevelConstraints:
        """``level``'s constraints, built a chunk of units at a time (no copy)."""
        return LevelConstraints(
            self.invariants, level, self.units[level], self.queries, self.labels,
            self.values[level], self._shape, self._axes, self._attrs[level], self._below[level],
            self,
        )  # fmt: skip

    def lazy(self) -> dict[str, LevelConstraints]:
        """Every released level's :class:`LevelConstraints`, what a release takes as its
        ``constraints`` (:func:`dpdask.graph.release`: each task builds its chunk's)."""
        return {lv: self.level(lv) for lv in self.levels}

    def check_once(self) -> None:
        """:meth:`check`, unless it has passed already."""
        if not self._checked:
            self.check()

    def check(self, cells_per_block: int = _CELLS_PER_CHECK) -> None:
        """Check every level's constraints and each family's against its parent's
        (:func:`~dpdask.reconstruct.topdown.check_hierarchy`), a block of families at a
        time; what a release calls before any charge.

        Raises
        ------
        DataError
            Naming the unit and the constraints that conflict.
        """
        n = max(1, int(np.prod(self._shape)))
        per = max(1, cells_per_block // n)
        if len(self.levels) == 1:
            lv = self.levels[0]
            for a in range(0, len(self.units[lv]), per):
                check_hierarchy([self.at(lv, slice(a, a + per))], [])
            self._checked.append(True)
            return
        for i in range(1, len(self.levels)):
            top, kids = self.levels[i - 1], self.levels[i]
            parent = self.parents[i - 1]
            order = np.argsort(parent, kind="stable")
            starts = np.searchsorted(parent[order], np.arange(len(self.units[top]) + 1))
            a = 0
            while a < len(self.units[top]):
                b = a + 1  # families until the children fill a block (one at least)
                while b < len(self.units[top]) and starts[b + 1] - starts[a] <= per:
                    b += 1
                children = order[starts[a] : starts[b]]
                check_hierarchy(
                    [self.at(top, slice(a, b)), self.at(kids, children)], [parent[children] - a]
                )
                a = b
        self._checked.append(True)


def release_constraints(spec: Any, store: Any, levels: Sequence[str]) -> ReleaseConstraints:
    """The invariants and constraints of ``spec``'s release of ``store`` at ``levels``.

    Parameters
    ----------
    spec : ReleaseSpec
        A spec with ``invariants:`` or ``constraints:`` (or neither: no bounds but
        non-negativity and the ``total`` row).
    store : DataStore
        The release's input: its unit attributes and, for ``total`` invariants, its
        totals (read here, before any charge: the agency publishes them exactly).
    levels : sequence of str
        The released levels, coarsest first; the finest is the data's finest.

    Returns
    -------
    ReleaseConstraints

    Raises
    ------
    SpecError
        Naming ``invariants`` or ``constraints`` for a level not released or an
        attribute the data does not carry.
    DataError
        For attribute values the constraints cannot use (a negative count).
    """
    from dpdask.pipeline._spec_invariants import check_data_attributes

    inv: Invariants = spec.invariants
    geo = store.geography
    levels = tuple(levels)
    check_data_attributes(inv, geo.levels, levels, store.unit_attribute_names)
    if levels[-1] != geo.levels[-1]:
        raise SpecError(
            f"levels: the finest released level must be the data's finest, {geo.levels[-1]!r}"
        )
    domain = spec.domain
    axes = {a: i for i, a in enumerate(domain.attrs)}
    full = "hhgq" in axes and domain["hhgq"] == len(census.HHGQ)
    finest = {name: store.unit_attribute(name) for name in inv.attributes()}
    declared = dict(inv.levels)
    # the units' totals are private: kept only where an invariant publishes them
    totals = unit_totals(store) if any("total" in v for v in declared.values()) else None
    units, attrs, values, exact, below = {}, {}, {}, {}, {}
    for j, lv in enumerate(levels):
        anc = geo.ancestor_index(lv)
        k = geo.n_units(lv)
        units[lv] = tuple(geo.ids[geo.level_index(lv)])
        attrs[lv] = {name: _sum_to(v, anc, k) for name, v in finest.items()}
        here = {n for fine in levels[j:] for n in declared.get(fine, ())}
        if "gq_population" in here:
            here.add("total")
        exact[lv] = tuple(n for n in ("total", *ATTRIBUTE_INVARIANTS) if n in here)
        if "total" in exact[lv]:  # the data's, or the sum of the invariant gq_population
            total = (
                attrs[lv]["gq_population"].sum(axis=1)
                if totals is None
                else _sum_to(totals, anc, k)
            )
        values[lv] = {n: total if n == "total" else attrs[lv][n] for n in exact[lv]}
        below[lv] = np.zeros((k, len(inv.cells)), dtype=np.int64)
        for i, c in enumerate(inv.cells):
            if levels.index(c.level) >= j:  # declared here or finer: count its units
                src = geo.ancestor_index(lv, c.level)
                below[lv][:, i] = np.bincount(src, minlength=k)
    parents = tuple(geo.ancestor_index(levels[i - 1], levels[i]) for i in range(1, len(levels)))
    queries, labels = _queries(domain, full, inv)
    return ReleaseConstraints(
        inv, levels, units, parents, queries, labels, exact, values, tuple(domain.shape),
        axes, attrs, below,
    )  # fmt: skip


def _queries(domain: Any, full: bool, inv: Invariants) -> tuple[np.ndarray, tuple[str, ...]]:
    n = int(domain.size)
    rows, labels = [np.ones(n)], ["total"]
    if full:
        hhgq = np.broadcast_to(
            np.arange(domain["hhgq"]).reshape([-1 if a == "hhgq" else 1 for a in domain.attrs]),
            tuple(domain.shape),
        ).reshape(n)
        for t in range(1, len(census.HHGQ)):
            rows.append((hhgq == t).astype(float))
            labels.append(f"{census.HHGQ[t]} population")
    for i, c in enumerate(inv.cells):
        m = np.ones(tuple(domain.shape), dtype=bool)
        for attr, codes in c.mask:
            sel = np.zeros(domain[attr], dtype=bool)
            sel[list(codes)] = True
            m &= sel.reshape([-1 if a == attr else 1 for a in domain.attrs])
        rows.append(m.reshape(n).astype(float))
        labels.append(f"cells[{i}]")
    return np.vstack(rows), tuple(labels)


def checked_constraints(spec: Any, store: Any, levels: Sequence[str]) -> ReleaseConstraints | None:
    """:func:`release_constraints`, checked (:meth:`ReleaseConstraints.check`), for a spec
    that states invariants or constraints (``None`` otherwise): what ``validate`` and
    ``run`` call once the data is read, before anything is charged.

    Raises
    ------
    SpecError, DataError
        As :func:`release_constraints` and :meth:`ReleaseConstraints.check`.
    """
    if not spec.invariants:
        return None
    rc = release_constraints(spec, store, levels)
    rc.check()
    return rc
