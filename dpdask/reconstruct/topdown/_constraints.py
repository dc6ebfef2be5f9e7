"""What a top-down fit must honour per unit: cell bounds, query bounds and invariants.

A :class:`Constraints` describes ``k`` units (the children of one family, or a chunk of
a level) on a domain of ``n`` cells:

* **cell bounds** ``lower <= x <= upper`` (``(k, n)``; a structural zero is ``upper = 0``,
  no bound ``upper = inf``; ``lower >= 0``: counts are non-negative);
* **query bounds** ``lo <= Q x <= hi`` for the rows of one query matrix ``Q`` (``(q, n)``,
  shared by the units; ``lo``, ``hi`` ``(k, q)``, infinite where there is no bound): an
  **invariant** (a count published exactly, such as a unit's total) is a row with ``lo
  == hi``.

:func:`check_constraints` finds, before anything is charged, the conflicts a unit's own
public attributes make (a lower bound above an upper one; an invariant no point within
the cell bounds can reach; query rows inside another whose lower bounds add up to more
than its upper one, such as more facilities than an invariant total), naming the unit and
the constraints. :func:`check_family` adds the conflicts between a parent and its
children (a parent's invariant unequal to its children's invariants' sum; a parent cell
its children's bounds cannot hold); a conflict neither finds is reported by the fit
itself (:class:`~dpdask.errors.PlanError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask.errors import DataError, ShapeError

__all__ = ["Constraints", "check_constraints", "check_family", "check_hierarchy"]

_TOL = 1e-9  # relative slack of the checks (counts are integers; bounds from public data)


@dataclass(frozen=True, eq=False)
class Constraints:
    """Cell and query bounds of ``k`` units on ``n`` cells (module notes).

    Attributes
    ----------
    lower, upper : ndarray
        ``(k, n)`` float cell bounds, ``0 <= lower <= upper`` (``upper`` may be ``inf``).
    queries : ndarray
        ``(q, n)`` float query rows (``q`` may be 0).
    lo, hi : ndarray
        ``(k, q)`` float bounds on each unit's answers ``queries @ x`` (``-inf`` / ``inf``
        where there is none; equal for an invariant).
    units : tuple of str
        The units' names, for error messages.
    labels : tuple of str
        The query rows' names (e.g. ``"total"``, ``"nursing population"``).
    """

    lower: np.ndarray
    upper: np.ndarray
    queries: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    units: tuple[str, ...]
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        k, n = np.shape(self.lower)
        q = np.shape(self.queries)[0]
        if np.shape(self.upper) != (k, n) or np.shape(self.queries) != (q, n):
            raise ShapeError(f"constraints: cell bounds must be (k, n), queries (q, {n})")
        if np.shape(self.lo) != (k, q) or np.shape(self.hi) != (k, q):
            raise ShapeError(f"constraints: query bounds must be ({k}, {q})")
        if len(self.units) != k or len(self.labels) != q:
            raise ShapeError("constraints: need one name per unit and one label per query")
        if np.isnan(self.lower).any() or np.isnan(self.upper).any():
            raise DataError("constraints: cell bounds contain NaN")
        if np.isnan(self.lo).any() or np.isnan(self.hi).any():
            raise DataError("constraints: query bounds contain NaN")
        if (self.lower < 0).any() or np.isinf(self.lower).any():
            raise DataError("constraints: cell lower bounds must be finite and non-negative")

    @property
    def k(self) -> int:
        """Number of units."""
        return int(self.lower.shape[0])

    @property
    def n(self) -> int:
        """Number of cells."""
        return int(self.lower.shape[1])

    @classmethod
    def none(cls, k: int, n: int, units: Sequence[str] | None = None) -> Constraints:
        """Non-negativity alone for ``k`` units of ``n`` cells."""
        return cls(
            np.zeros((k, n)), np.full((k, n), np.inf), np.zeros((0, n)), np.zeros((k, 0)),
            np.zeros((k, 0)), _names(units, k), (),
        )  # fmt: skip

    def take(self, rows: np.ndarray | Sequence[int]) -> Constraints:
        """The constraints of the units ``rows`` (e.g. one family's children)."""
        r = np.asarray(rows, dtype=np.int64)
        return Constraints(
            self.lower[r], self.upper[r], self.queries, self.lo[r], self.hi[r],
            tuple(self.units[i] for i in r), self.labels,
        )  # fmt: skip

    def with_queries(
        self, queries: np.ndarray, lo: np.ndarray, hi: np.ndarray, labels: Sequence[str]
    ) -> Constraints:
        """These constraints and the query bounds ``lo <= queries @ x <= hi`` (``(k, r)``
        each; e.g. an earlier pass's answers within a slack)."""
        Qn = np.atleast_2d(np.asarray(queries, dtype=float))
        r = Qn.shape[0]
        lo_n = np.broadcast_to(np.asarray(lo, dtype=float), (self.k, r))
        hi_n = np.broadcast_to(np.asarray(hi, dtype=float), (self.k, r))
        return Constraints(
            self.lower, self.upper, np.vstack([self.queries, Qn]),
            np.hstack([self.lo, lo_n]), np.hstack([self.hi, hi_n]), self.units,
            (*self.labels, *labels),
        )  # fmt: skip

    def aggregate(self, parent: np.ndarray, names: Sequence[str] | None = None) -> Constraints:
        """The bounds these units imply on their parents: ``parent[i]`` is unit ``i``'s
        parent (``0 .. g - 1``); each parent's bounds (cells and queries) are its
        children's summed, so a parent's invariant is the sum of its children's when
        every child has it (and unbounded when one has no bound).

        Parameters
        ----------
        parent : ndarray
            ``(k,)`` integer parent index of each unit.
        names : sequence of str, optional
            The parents' names.
        """
        idx = np.asarray(parent)
        if idx.shape != (self.k,) or not np.issubdtype(idx.dtype, np.integer):
            raise ShapeError(f"need an integer parent index per unit ({self.k})")
        if idx.size and idx.min() < 0:
            raise ShapeError("parent indices must be non-negative")
        g = int(idx.max()) + 1 if idx.size else 0

        def add(V: np.ndarray) -> np.ndarray:
            return sum_rows(idx, V, g)

        return Constraints(
            add(self.lower), add(self.upper), self.queries, add(self.lo), add(self.hi),
            _names(names, g), self.labels,
        )  # fmt: skip

    def invariants(self) -> np.ndarray:
        """``(k, q)`` bool: which query rows are invariants (``lo == hi``) of which units."""
        out: np.ndarray = np.isfinite(self.lo) & (self.lo == self.hi)
        return out

    def satisfied(self, X: np.ndarray, atol: float = 1e-6) -> np.ndarray:
        """``(k,)`` bool: whether each row of ``X`` ``(k, n)`` meets its bounds (within
        ``atol`` times the unit's scale)."""
        X = np.asarray(X, dtype=float)
        scale = atol * np.maximum(1.0, np.abs(X).sum(axis=1))
        cells = ((X >= self.lower - scale[:, None]) & (X <= self.upper + scale[:, None])).all(1)
        A = X @ self.queries.T
        qs = ((A >= self.lo - scale[:, None]) & (A <= self.hi + scale[:, None])).all(axis=1)
        ok: np.ndarray = cells & qs
        return ok


def _names(units: Sequence[str] | None, k: int) -> tuple[str, ...]:
    if units is None:
        return tuple(f"unit {i}" for i in range(k))
    names = tuple(str(u) for u in units)
    if len(names) != k:
        raise ShapeError(f"need {k} unit names, got {len(names)}")
    return names


def _fmt(v: float) -> str:
    return f"{v:g}"


def unit_positions(rows: Any, k: int) -> np.ndarray:
    """``np.arange(k)[rows]`` (all for None) without forming all ``k`` positions for a
    slice or indices: a chunk's rows of a level of millions of units.

    Examples
    --------
    >>> unit_positions(slice(2, 5), 10).tolist(), unit_positions([-1, 0], 10).tolist()
    ([2, 3, 4], [9, 0])
    """
    if rows is None:
        return np.arange(k)
    if isinstance(rows, slice):
        return np.arange(*rows.indices(k))
    r = np.asarray(rows)
    if r.size == 0:
        return np.zeros(0, dtype=np.int64)
    if r.dtype == bool:
        out: np.ndarray = np.arange(k)[r]
        return out
    if not np.issubdtype(r.dtype, np.integer) or r.min() < -k or r.max() >= k:
        raise IndexError(f"unit positions {rows!r} are not integers in [-{k}, {k})")
    return np.where(r < 0, r + k, r).astype(np.int64)


def sum_rows(idx: np.ndarray, V: np.ndarray, g: int) -> np.ndarray:
    """``(g, m)``: row ``j`` the sum of the rows ``V[i]`` with ``idx[i] == j`` (what
    ``np.add.at`` gives, to rounding; its unbuffered scatter is many times slower on wide
    rows); zero for a ``j`` no row has.

    Examples
    --------
    >>> sum_rows(np.array([1, 0, 1]), np.array([[1.0], [2.0], [4.0]]), 3).ravel().tolist()
    [2.0, 5.0, 0.0]
    """
    V = np.asarray(V)
    out = np.zeros((g, V.shape[1]), dtype=np.result_type(V.dtype, np.float64))
    if idx.size:
        order = np.argsort(idx, kind="stable")
        s = idx[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        with np.errstate(invalid="ignore"):  # inf - inf: nan, as a sum of bounds is
            out[s[starts]] = np.add.reduceat(V[order], starts, axis=0)
    return out


def _reach(Q: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least and largest answers of the rows of ``Q`` over the cell box ``[lower,
    upper]`` (``(k, q)`` each; infinite where unbounded)."""
    pos = np.maximum(Q, 0.0)
    unbounded = np.isinf(upper)
    inf = unbounded.astype(float)
    up = np.where(unbounded, 0.0, upper)
    least = lower @ pos.T
    most = up @ pos.T
    if (Q < 0).any():  # counting queries have none: their terms are skipped
        neg = np.minimum(Q, 0.0)
        least = np.where(inf @ (neg < 0).T > 0, -np.inf, least + up @ neg.T)
        most = most + lower @ neg.T
    most = np.where(inf @ (pos > 0).T > 0, np.inf, most)
    return least, most


def check_constraints(c: Constraints) -> None:
    """Raise on a conflict among one unit's own constraints (module notes).

    Parameters
    ----------
    c : Constraints

    Raises
    ------
    DataError
        Naming the first unit with a conflict and the constraints that conflict: a cell's
        lower bound above its upper one; a query's ``lo`` above its ``hi``; an invariant or
        query bound the cell bounds cannot reach (e.g. an invariant total of 5 where every
        cell is bounded to 0); rows of 0/1 queries inside another 0/1 row, disjoint from
        each other, whose lower bounds sum above that row's upper bound (e.g. more
        facilities than an invariant total).

    Examples
    --------
    >>> c = Constraints(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)),
    ...                 np.array([[5.0]]), np.array([[5.0]]), ("block 7",), ("total",))
    >>> check_constraints(c)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpdask.errors.DataError: block 7: total must be in [5, 5] but the cell bounds allow ...
    """
    bad = np.argwhere(c.lower > c.upper)
    if bad.size:
        u, j = bad[0]
        raise DataError(
            f"{c.units[u]}: cell {j} has lower bound {_fmt(c.lower[u, j])} above its upper "
            f"bound {_fmt(c.upper[u, j])}"
        )
    bad = np.argwhere(c.lo > c.hi)
    if bad.size:
        u, r = bad[0]
        raise DataError(
            f"{c.units[u]}: {c.labels[r]} must be at least {_fmt(c.lo[u, r])} and at most "
            f"{_fmt(c.hi[u, r])}"
        )
    if not c.queries.shape[0]:
        return
    least, most = _reach(c.queries, c.lower, c.upper)
    scale = _TOL * np.maximum(1.0, np.abs(np.where(np.isfinite(c.lo), c.lo, 0.0)))
    bad = np.argwhere((c.lo > most + scale) | (c.hi < least - scale))
    if bad.size:
        u, r = bad[0]
        zeros = " (every cell bounded to 0)" if most[u, r] == 0 and least[u, r] == 0 else ""
        raise DataError(
            f"{c.units[u]}: {c.labels[r]} must be in [{_fmt(c.lo[u, r])}, {_fmt(c.hi[u, r])}] "
            f"but the cell bounds allow only [{_fmt(least[u, r])}, {_fmt(most[u, r])}]{zeros}"
        )
    _check_nested(c)


def _check_nested(c: Constraints) -> None:
    """0/1 rows inside another 0/1 row, disjoint: their lower bounds must fit under its
    upper bound."""
    Q = c.queries
    binary = ((Q == 0) | (Q == 1)).all(axis=1)
    S = Q > 0
    for a in np.flatnonzero(binary):
        inside = [
            b for b in np.flatnonzero(binary) if b != a and not (S[b] & ~S[a]).any() and S[b].any()
        ]
        if len(inside) < 2:
            continue
        sub = S[inside].astype(int)
        if (sub.sum(axis=0) > 1).any():
            continue  # overlapping rows: left to the fit
        floors = np.maximum(c.lo[:, inside], 0.0).sum(axis=1)
        bad = np.flatnonzero(floors > c.hi[:, a] * (1 + _TOL) + _TOL)
        if bad.size:
            u = bad[0]
            names = ", ".join(c.labels[b] for b in inside if c.lo[u, b] > 0)
            raise DataError(
                f"{c.units[u]}: {c.labels[a]} is at most {_fmt(c.hi[u, a])} but {names} "
                f"need at least {_fmt(floors[u])}"
            )


def check_family(
    parent: np.ndarray | None,
    children: Constraints,
    parent_constraints: Constraints | None = None,
    *,
    parent_name: str = "the parent",
) -> None:
    """Raise on a conflict between a parent and its children's constraints.

    Parameters
    ----------
    parent : ndarray or None
        ``(n,)`` the parent's fixed cells (its estimate), or None when not yet known.
    children : Constraints
        The ``K`` children's constraints (checked by :func:`check_constraints` first).
    parent_constraints : Constraints, optional
        The parent's own (one unit, the same query rows): its invariants must equal the
        sum of the children's where every child has that invariant.
    parent_name : str
        The parent's name in messages.

    Raises
    ------
    DataError
        Naming the parent and the constraints: a parent invariant unequal to the sum of its
        children's invariants, or outside what their bounds allow; a parent cell below the
        children's lower bounds' sum or above their upper bounds' sum; a query the children
        cannot answer with these cells.
    """
    check_constraints(children)
    Q = children.queries
    if parent_constraints is not None:
        if parent_constraints.k != 1 or parent_constraints.queries.shape != Q.shape:
            raise ShapeError("parent constraints must be one unit with the children's queries")
        if not np.array_equal(parent_constraints.queries, Q):
            raise ShapeError("parent constraints must have the children's query rows")
        parent_name = parent_constraints.units[0]
        inv = children.invariants()
        p_inv = parent_constraints.invariants()[0]
        for r in np.flatnonzero(p_inv & inv.all(axis=0)):
            total = float(children.lo[:, r].sum())
            want = float(parent_constraints.lo[0, r])
            if abs(total - want) > _TOL * max(1.0, abs(want)):
                raise DataError(
                    f"{parent_name}: invariant {children.labels[r]} is {_fmt(want)} but its "
                    f"children's invariants sum to {_fmt(total)}"
                )
        lo_sum, hi_sum = children.lo.sum(axis=0), children.hi.sum(axis=0)
        for r in np.flatnonzero(p_inv):
            want = float(parent_constraints.lo[0, r])
            if want < lo_sum[r] - _TOL * max(1.0, abs(want)) or want > hi_sum[r] * (1 + _TOL):
                raise DataError(
                    f"{parent_name}: invariant {children.labels[r]} is {_fmt(want)} but its "
                    f"children's bounds allow [{_fmt(lo_sum[r])}, {_fmt(hi_sum[r])}]"
                )
    if parent is None:
        return
    p = np.asarray(parent, dtype=float)
    if p.shape != (children.n,):
        raise ShapeError(f"parent has shape {p.shape}; expected ({children.n},)")
    lo_cells, hi_cells = children.lower.sum(axis=0), children.upper.sum(axis=0)
    scale = _TOL * np.maximum(1.0, np.abs(p))
    bad = np.flatnonzero((p < lo_cells - scale) | (p > hi_cells + scale))
    if bad.size:
        j = bad[0]
        raise DataError(
            f"{parent_name}: cell {j} is {_fmt(p[j])} but its children's cell bounds allow "
            f"[{_fmt(lo_cells[j])}, {_fmt(hi_cells[j])}]"
        )
    # each query's answer over the family is fixed by the parent's cells
    total = Q @ p
    bad = np.flatnonzero(
        (total < children.lo.sum(axis=0) - _TOL * np.maximum(1.0, np.abs(total)))
        | (total > children.hi.sum(axis=0) + _TOL * np.maximum(1.0, np.abs(total)))
    )
    if bad.size:
        r = bad[0]
        raise DataError(
            f"{parent_name}: {children.labels[r]} is {_fmt(total[r])} from the parent's cells "
            f"but its children's bounds need [{_fmt(children.lo[:, r].sum())}, "
            f"{_fmt(children.hi[:, r].sum())}]"
        )


def check_hierarchy(levels: Sequence[Constraints], parents: Sequence[np.ndarray]) -> None:
    """Check every level's constraints and each parent's invariants against its children's,
    from public input alone: what a release calls before any charge.

    Parameters
    ----------
    levels : sequence of Constraints
        Per level (coarsest first), its units' constraints, with the same query rows.
    parents : sequence of ndarray
        For each level but the coarsest, each unit's parent index in the level above.

    Raises
    ------
    DataError
        As :func:`check_constraints` for any level, or naming a parent whose invariant is
        not the sum of its children's (where every child has it), or outside what its
        children's query bounds allow, or a parent cell bound its children's cannot meet
        (a parent's lower bound above the sum of its children's upper bounds).
    """
    if len(parents) != len(levels) - 1:
        raise ShapeError("need one parent index array per level but the coarsest")
    for c in levels:
        check_constraints(c)
    for lvl in range(1, len(levels)):
        par, kids = levels[lvl - 1], levels[lvl]
        idx = np.asarray(parents[lvl - 1])
        if idx.shape != (kids.k,) or not np.issubdtype(idx.dtype, np.integer):
            raise ShapeError(f"level {lvl}: need an integer parent index per unit ({kids.k})")
        if kids.k and (idx.min() < 0 or idx.max() >= par.k):
            raise ShapeError(f"level {lvl}: parent indices must be in [0, {par.k})")
        if not np.array_equal(par.queries, kids.queries):
            raise ShapeError(f"level {lvl}: every level needs the same query rows")
        agg = kids.aggregate(idx.astype(np.int64), par.units[: int(idx.max()) + 1])
        g = agg.k
        inv = kids.invariants().astype(np.int64)
        all_inv = sum_rows(idx, inv, g).astype(np.int64)
        counts = np.bincount(idx, minlength=g)[:, None]
        p_inv = par.invariants()[:g]
        p_val = np.where(p_inv, par.lo[:g], 0.0)
        tol = _TOL * np.maximum(1.0, np.abs(p_val))
        exact = p_inv & (all_inv == counts) & (np.abs(agg.lo - p_val) > tol)
        # each child's answers within its query bounds and its cells' reach, summed
        least, most = _reach(kids.queries, kids.lower, kids.upper)
        eff_lo = sum_rows(idx, np.maximum(kids.lo, least), g)
        eff_hi = sum_rows(idx, np.minimum(kids.hi, most), g)
        outside = p_inv & ((p_val < eff_lo - tol) | (p_val > eff_hi + tol))
        for bad, what in ((exact, "its children's invariants sum to"), (outside, "")):
            hit = np.argwhere(bad)
            if hit.size:
                u, r = hit[0]
                tail = (
                    f"{what} {_fmt(agg.lo[u, r])}"
                    if what
                    else f"its children's bounds allow [{_fmt(eff_lo[u, r])}, {_fmt(eff_hi[u, r])}]"
                )
                raise DataError(
                    f"{par.units[u]}: invariant {kids.labels[r]} is {_fmt(p_val[u, r])} but " + tail
                )
        low = np.argwhere(par.lower[:g] > agg.upper * (1 + _TOL) + _TOL)
        if low.size:
            u, j = low[0]
            raise DataError(
                f"{par.units[u]}: cell {j} must be at least {_fmt(par.lower[u, j])} but its "
                f"children's cell bounds allow at most {_fmt(agg.upper[u, j])}"
            )
