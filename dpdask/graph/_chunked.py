"""Constraints a release builds a chunk of units at a time (issue 33, large states).

A level's :class:`~dpdask.reconstruct.topdown.Constraints` hold ``(units, cells)``
bounds: 700,000 blocks of the 2,016-cell P.L. 94 histogram would be 22 GB per array.
:class:`ChunkedConstraints` is what a release takes instead, per level: an object that
builds any units' constraints on demand (:meth:`~ChunkedConstraints.take`) from what
its units are (a spec's are :class:`dpdask.pipeline.invariants.LevelConstraints`, from
the units' public attributes). Chunked constraints are complete up the hierarchy as
given (a level's bounds already meet the sum of its children's) and check themselves,
a block of families at a time (:meth:`~ChunkedConstraints.check`), before any charge:
:func:`chunked_levels` takes them as they are. Each task of the multi-pass top-down
gets its chunk's :meth:`~ChunkedConstraints.part` (its units' attributes, small to
send) and builds its :class:`Constraints` on its worker (:func:`chunk_constraints`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, ShapeError
from dpdask.reconstruct.topdown import Constraints

__all__ = [
    "ChunkedConstraints",
    "chunk_constraints",
    "chunked_levels",
    "constraint_counts",
    "level_chunk_constraints",
]


@runtime_checkable
class ChunkedConstraints(Protocol):
    """A level's constraints built a chunk of units at a time (module notes)."""

    @property
    def k(self) -> int:
        """Number of units."""

    @property
    def n(self) -> int:
        """Number of cells."""

    @property
    def queries(self) -> np.ndarray:
        """``(q, n)`` the query rows, the same at every level."""

    @property
    def labels(self) -> tuple[str, ...]:
        """The query rows' names."""

    def take(self, rows: Any = None) -> Constraints:
        """The constraints of the units ``rows`` (all by default)."""

    def part(self, rows: Any) -> ChunkedConstraints:
        """The units ``rows`` alone, small to send to a task."""

    def check(self) -> None:
        """Raise a :class:`~dpdask.errors.DataError` for conflicting constraints at or
        between the levels, from public input alone (once: a no-op once passed)."""

    def counts(self) -> dict[str, int]:
        """``invariants`` (answers with ``lo == hi``) and ``structural_zeros`` (cells
        bounded to 0) over the units."""


def chunked_levels(
    given: Mapping[str, Any], levels: Sequence[str], units: Sequence[Sequence[str]], n: int
) -> dict[str, ChunkedConstraints]:
    """A release's chunked constraints, checked (module notes): one per released level,
    each of its level's units and cells, the same query rows at every level.

    Raises
    ------
    ArgumentError, ArgumentTypeError, ShapeError
        For a level without them, a value that is not chunked constraints, one of the
        wrong shape, or levels with other query rows.
    DataError
        For conflicting constraints (:meth:`ChunkedConstraints.check`), naming the unit.
    """
    for lv, c in given.items():
        if not isinstance(c, Constraints | ChunkedConstraints):
            raise ArgumentTypeError(f"constraints[{lv!r}] must be a Constraints")
    dense = sorted(lv for lv, c in given.items() if isinstance(c, Constraints))
    if dense:
        raise ArgumentTypeError(
            f"constraints: chunked constraints at every level or none (dense at {dense})"
        )
    missing = [lv for lv in levels if lv not in given]
    if missing:
        raise ArgumentError(
            f"constraints: chunked constraints are complete up the hierarchy; give every "
            f"released level's (missing {missing})"
        )
    first = given[levels[0]]
    for i, lv in enumerate(levels):
        c = given[lv]
        if (c.k, c.n) != (len(units[i]), n):
            raise ShapeError(
                f"constraints[{lv!r}] holds {c.k} units of {c.n} cells; the level has "
                f"{len(units[i])} units of {n} cells"
            )
        if c.labels != first.labels or not np.array_equal(c.queries, first.queries):
            raise ShapeError(f"constraints[{lv!r}]: every level needs the same query rows")
    for lv in levels:
        given[lv].check()
    return {lv: given[lv] for lv in levels}


def _build(part: ChunkedConstraints) -> Constraints:
    return part.take()


def chunk_constraints(cons: Constraints | ChunkedConstraints, rows: np.ndarray) -> Any:
    """What a task takes for its chunk's ``rows`` of a level's constraints: their
    :class:`Constraints` (dense constraints: the rows), or a task that builds them on
    the worker from the chunk's :meth:`~ChunkedConstraints.part`."""
    if isinstance(cons, Constraints):
        return cons.take(rows)
    return (_build, cons.part(rows))


def level_chunk_constraints(
    constraints: Mapping[str, Constraints | ChunkedConstraints] | None, level: str,
    lo: int, hi: int,
) -> Any:  # fmt: skip
    """:func:`chunk_constraints` of units ``lo:hi`` of ``level`` in a release's
    ``constraints`` (None without: non-negativity alone)."""
    if constraints is None:
        return None
    return chunk_constraints(constraints[level], np.arange(lo, hi))


def constraint_counts(c: Constraints | ChunkedConstraints) -> dict[str, int]:
    """How many answers are invariants and how many cells structural zeros."""
    if isinstance(c, Constraints):
        return {
            "invariants": int(c.invariants().sum()),
            "structural_zeros": int((c.upper == 0).sum()),
        }
    return c.counts()
