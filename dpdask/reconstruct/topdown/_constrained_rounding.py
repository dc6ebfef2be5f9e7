"""Integer children that keep each pass's answers, the parent's cells and the constraints.

:func:`round_constrained` rounds a family's fractional fit ``X`` (``(K, n)``, columns
summing to the integer parent) to integers: every entry the floor or the ceiling of its
fractional value (one variable ``u_cj`` in ``{0, 1}``, "rounds up", per entry with a
fractional part), every column summing exactly to the parent, every cell bound and query
bound of the :class:`~dpdask.reconstruct.topdown.Constraints` kept (integer bounds:
``ceil(lo) <= Q x <= floor(hi)``, so an integer invariant exactly), and for each pass in
priority order (default: the total) its integer answers kept within 1 of the fractional
ones, ``floor(a) <= Q_k x_c <= ceil(a)``.

**Objective, stage by stage.** Stage ``k`` (one per pass, in order) minimises the
pass's answers' distance to the fractional ones, ``sum_{c, r} |Q_k x_c - a_{k,cr}|``, and
fixes the integer answers it found for the later stages; the last stage minimises the
cells' distance ``sum_{c, j} |x_cj - X_cj|`` (the objective of
:func:`~dpdask.reconstruct.topdown.round_children`; a pass of the cells themselves is
that stage). With every answer between its floor
and ceiling, ``|Q x - a| = frac(a) + (Q x - floor(a)) (1 - 2 frac(a))`` is linear, so each
stage is a linear program in ``u``. When the query rows of each child form a laminar
family (the total, disjoint groups inside it such as the group-quarters types, single
cells), its constraint matrix, with the columns' sums, is the union of two laminar
families and totally unimodular: the vertex HiGHS's dual simplex returns is integral, and
feasible since the fractional fit is a point of the relaxation (every band holds it).
Otherwise a stage whose vertex is fractional is solved as an integer program
(:func:`scipy.optimize.milp`). A stage with no solution raises
:class:`~dpdask.errors.PlanError` naming the family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.reconstruct.topdown._constraints import Constraints

__all__ = ["round_constrained"]

_SNAP = 1e-9  # entries this close (relative) to an integer are that integer
_SUM_TOLERANCE = 1e-6  # as round_children: the columns' sums against the parent


def _as_queries(passes: Sequence[Any] | None, n: int) -> list[np.ndarray]:
    """Each pass's query matrix (a :class:`~dpdask.reconstruct.topdown.Pass`'s
    ``queries``, or the matrix itself)."""
    if passes is None:
        return [np.ones((1, n))]
    out = []
    for ps in passes:
        Q = np.atleast_2d(np.asarray(getattr(ps, "queries", ps), dtype=float))
        if Q.shape[1] != n:
            raise ShapeError(f"a pass's queries must have {n} columns, got {Q.shape}")
        out.append(Q)
    return out


def _integer_parent(parent: np.ndarray, n: int) -> np.ndarray:
    p = np.asarray(parent)
    if p.shape != (n,):
        raise ShapeError(f"parent has shape {p.shape}; expected ({n},)")
    pf = np.asarray(p, dtype=float)
    if not np.isfinite(pf).all() or (pf != np.round(pf)).any() or (pf < 0).any():
        raise ArgumentError("the parent must be non-negative integers")
    return pf.astype(np.int64)


def _is_identity(Q: np.ndarray) -> bool:
    if Q.shape[0] != Q.shape[1] or np.count_nonzero(Q) != Q.shape[0]:
        return False
    return bool((np.diagonal(Q) == 1).all())


class _Program:
    """The rounding's linear constraints in the variables ``u`` (module notes)."""

    def __init__(self, F: np.ndarray, rows: np.ndarray, cols: np.ndarray, K: int, n: int):
        self.F, self.rows, self.cols, self.K, self.n = F, rows, cols, K, n
        self.E = rows.size
        self.blocks: list[sp.csr_array] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []

    def query_matrix(self, Q: np.ndarray) -> sp.csr_array:
        """``(K q, E)``: row ``(c, r)`` is ``Q[r]`` on child ``c``'s variables."""
        q = Q.shape[0]
        sub = sp.coo_array(sp.csc_array(Q)[:, self.cols])  # (q, E), only its non-zeros
        r_idx = self.rows[sub.coords[1]] * q + sub.coords[0]
        return sp.csr_array((sub.data, (r_idx, sub.coords[1])), shape=(self.K * q, self.E))

    def add(self, A: sp.csr_array, lo: np.ndarray, hi: np.ndarray) -> None:
        self.blocks.append(A)
        self.lo.append(lo)
        self.hi.append(hi)

    def add_queries(self, Q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> sp.csr_array:
        """``lo <= Q x_c <= hi`` (``(K, q)`` each, integers or infinite) for ``x = F + u``."""
        base = (self.F @ Q.T).ravel()
        A = self.query_matrix(Q)
        self.add(A, lo.ravel() - base, hi.ravel() - base)
        return A

    def solve(self, cost: np.ndarray, ub: np.ndarray, lb: np.ndarray, name: str) -> np.ndarray:
        """The optimal 0/1 ``u`` of ``cost``: the LP's vertex when integral, else by MILP."""
        A = sp.vstack(self.blocks, format="csr") if self.blocks else None
        lo = np.concatenate(self.lo) if self.blocks else np.zeros(0)
        hi = np.concatenate(self.hi) if self.blocks else np.zeros(0)
        if A is not None and A.shape[0]:
            fin_hi, fin_lo = np.isfinite(hi), np.isfinite(lo)
            is_eq = fin_hi & fin_lo & (lo == hi)
            eq = np.flatnonzero(is_eq)
            ub_rows = np.flatnonzero(fin_hi & ~is_eq)
            lb_rows = np.flatnonzero(fin_lo & ~is_eq)
            res = linprog(
                cost,
                A_ub=sp.vstack([A[ub_rows], -A[lb_rows]], format="csr"),
                b_ub=np.concatenate([hi[ub_rows], -lo[lb_rows]]),
                A_eq=A[eq] if eq.size else None,
                b_eq=lo[eq] if eq.size else None,
                bounds=np.column_stack([lb, ub]),
                method="highs-ds",
            )
        else:
            res = linprog(cost, bounds=np.column_stack([lb, ub]), method="highs-ds")
        if res.status == 2:
            raise PlanError(f"{name}: no integer rounding meets the constraints")
        if res.x is not None and np.abs(res.x - np.rint(res.x)).max(initial=0.0) <= 1e-9:
            out: np.ndarray = np.rint(res.x)
            return out
        cons = [] if A is None or not A.shape[0] else [LinearConstraint(A, lo, hi)]
        mres = milp(cost, constraints=cons, integrality=np.ones(self.E), bounds=Bounds(lb, ub))
        if mres.x is None:
            raise PlanError(f"{name}: no integer rounding meets the constraints")
        out = np.rint(mres.x)
        return out


def round_constrained(
    X: np.ndarray,
    parent: np.ndarray | None,
    constraints: Constraints | None = None,
    *,
    passes: Sequence[Any] | None = None,
    parent_name: str = "the parent",
) -> np.ndarray:
    """Integer children keeping the parent, the constraints and each pass's answers.

    Parameters
    ----------
    X : ndarray
        ``(K, n)`` the fractional fit (within its constraints, columns summing to
        ``parent`` to a relative ``1e-6``).
    parent : ndarray or None
        ``(n,)`` the integer parent, or None for units without one (the top level).
    constraints : Constraints, optional
        The children's; default non-negativity.
    passes : sequence of Pass or ndarray, optional
        The passes' queries in priority order (default: the total).
    parent_name : str
        For error messages.

    Returns
    -------
    ndarray
        ``(K, n)`` ``int64``: each entry the floor or ceiling of ``X``; columns summing to
        ``parent``; every pass's answers within 1 of the fractional ones and, stage by
        stage, nearest to them; the cells nearest to ``X`` given those (module notes).

    Raises
    ------
    ShapeError, ArgumentError
        For shapes that disagree, a parent that is not non-negative integers, or
        columns that do not sum to it.
    PlanError
        If no rounding meets the constraints.

    Examples
    --------
    >>> X = np.array([[0.7, 0.6, 0.55], [0.3, 0.4, 0.45]])
    >>> round_constrained(X, np.array([1, 1, 1])).tolist()  # totals 1.85, 1.15: 2 and 1
    [[1, 1, 0], [0, 0, 1]]
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or not np.isfinite(X).all():
        raise ShapeError(f"X must be a finite (K, n) array, got shape {X.shape}")
    K, n = X.shape
    c = Constraints.none(K, n) if constraints is None else constraints
    if (c.k, c.n) != (K, n):
        raise ShapeError(f"constraints are for {c.k} units of {c.n} cells; need {K} of {n}")
    p = None if parent is None else _integer_parent(parent, n)
    if p is not None:
        err = np.abs(X.sum(axis=0) - p)
        if (err > _SUM_TOLERANCE * np.maximum(p, 1)).any():
            raise ShapeError("the children's columns do not sum to the parent")
    # a pass of the cells themselves is the last stage's (its band holds by construction)
    Qs = [Q for Q in _as_queries(passes, n) if not _is_identity(Q)]
    R = np.rint(X)
    snap = np.abs(X - R) <= _SNAP * np.maximum(1.0, np.abs(X))
    Xs = np.where(snap, R, X)
    F = np.floor(Xs)
    frac = Xs - F
    rows, cols = np.nonzero(frac > 0)
    prog = _Program(F, rows, cols, K, n)
    name = f"{parent_name}, the family of {', '.join(c.units[:5])}" + (", ..." if K > 5 else "")
    # cell bounds: integers inside the bounds
    lb = np.zeros(rows.size)
    ub = np.ones(rows.size)
    lo_c = np.ceil(c.lower[rows, cols] - _SNAP)
    hi_c = np.floor(c.upper[rows, cols] + _SNAP)
    lb[F[rows, cols] < lo_c] = 1.0
    ub[F[rows, cols] + 1 > hi_c] = 0.0
    tol = 1e-7 * np.maximum(1.0, np.abs(Xs))
    if (Xs < c.lower - tol).any() or (Xs > c.upper + tol).any() or (lb > ub).any():
        raise PlanError(f"{name}: the fractional fit is outside its cell bounds")
    if p is not None:  # the columns' sums
        A = sp.csr_array((np.ones(rows.size), (cols, np.arange(rows.size))), shape=(n, rows.size))
        missing = (p - F.sum(axis=0)).astype(float)
        prog.add(A, missing, missing)
    if c.queries.shape[0]:  # the query bounds, as integers
        prog.add_queries(c.queries, np.ceil(c.lo - _SNAP), np.floor(c.hi + _SNAP))
    answers = [Xs @ Q.T for Q in Qs]
    mats = [prog.add_queries(Q, np.floor(a), np.ceil(a)) for Q, a in zip(Qs, answers, strict=True)]
    u = np.zeros(rows.size)
    for a, A in zip(answers, mats, strict=True):
        if not rows.size:
            break
        fa = a - np.floor(a)
        cost = (1.0 - 2.0 * fa).ravel() @ A  # (E,)
        u = prog.solve(np.asarray(cost, dtype=float), ub, lb, name)
        got = A @ u  # this pass's integer answers (less the floors'), kept
        prog.add(A, got, got)
    if rows.size:
        u = prog.solve(1.0 - 2.0 * frac[rows, cols], ub, lb, name)
    out = F.astype(np.int64)
    out[rows, cols] += u.astype(np.int64)
    return out
