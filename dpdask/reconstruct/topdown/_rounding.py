"""Integer output of the top-down estimator: the top level, and children that keep their sums.

:func:`round_top` rounds each unit of the top level by the same method, the unit's cells
forming one column whose sum is the unit's total rounded to the nearest integer: each
cell is within 1 of the estimate and the unit's total is kept (rounding cell by cell
instead sends the many small positive cells of a non-negative fit to zero together:
on a synthetic CPH state of one million persons the SF1 answers' error went from 6.3
to about 35 persons, against 8-9 with the total kept).
:func:`round_children` is a controlled rounding of the children of one parent: the
largest-remainder method, applied to every cell (a column of ``K`` children) at once.
For a column ``x`` (``K`` non-negative children summing to the integer ``p``) it takes
``floor(x)`` and hands the ``r = p - sum(floor(x))`` units still missing to the ``r``
children with the largest fractional parts. Then

* the column sums to ``p`` exactly (integer arithmetic);
* every entry is ``floor(x_c)`` or ``floor(x_c) + 1``, so ``|x_int - x| < 1``: the
  fractional parts sum to ``r`` and each is below one, so at least ``r + 1`` of them are
  positive when ``r > 0``, and a child that receives a unit has a positive one;
* among the integer columns with entries in ``{floor, ceil}`` and sum ``p`` it is the
  nearest to ``x`` in every ``l_q`` norm (``q >= 1``): each unit goes where it costs
  least, ``1 - 2 frac`` in ``l_1``.

Only the parent's cells are controlled: a child's total over cells (or any other
query of one child) is the sum of its rounded cells and may differ from the same
query of the fractional estimate by up to the number of cells it sums (it is less
than one per cell). Ties in the fractional parts go to the child listed first.

With ``keep_totals=True`` the children's totals are controlled too (a controlled
rounding of the ``K x n`` table in Bacharach's sense): when some child's rounded total
is 1 or more from its fractional total, the units are placed by the nearest rounding
(least ``l_1`` distance to ``X``) among those with every entry the floor or the ceiling,
every column summing to ``p`` and every child's total the floor or the ceiling of its
fractional total. That is a linear program over the transportation polytope (one
variable per positive fractional part: does it round up), whose constraint matrix is
totally unimodular, so its vertex solution (HiGHS's dual simplex) is 0/1; such a
rounding always exists (the table's fractional parts are a feasible point). On a large
domain, where a child's fractional mass is spread thinly over thousands of cells, the
largest remainders send it to the children with peaked estimates: on a synthetic CPH
state of 25,000 blocks the 1-way marginals' error at tract level halved with the totals
kept (BENCHMARKS.md). Families with more than :data:`MAX_CONTROLLED` positive
fractional parts keep the largest remainders (the program's time grows faster than
its size).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from dpdask.errors import ArgumentError, ShapeError

__all__ = ["KEEP_TOTALS_CELLS", "round_children", "round_top"]

KEEP_TOTALS_CELLS = 4096
"""Top-down releases keep the children's totals (``keep_totals``) on domains of at
least this many cells; on smaller ones (P.L. 94's 252) a family's program costs more
than its fit."""

MAX_CONTROLLED = 2_000_000
"""Most positive fractional parts a family may have for ``keep_totals`` to solve its
program; larger families keep the largest remainders."""

_SUM_TOLERANCE = 1e-6
"""Largest relative difference between a column's sum and its parent :func:`round_children`
accepts (a fractional estimate's float rounding is far smaller)."""


def round_top(x: np.ndarray) -> np.ndarray:
    """Round the top level's estimate to non-negative integers that keep each unit's total.

    Each unit (a row of ``x``; the whole of a 1-D ``x``) is ``max(x, 0)`` rounded by the
    largest-remainder method of :func:`round_children` to the nearest integer of its
    total: every cell is the floor or the ceiling of the non-negative estimate (within
    1 of it) and never negative, and the unit's total is the estimate's total rounded.
    Used for the coarsest level of a top-down release, whose cells are not constrained
    by a parent; every finer level is rounded by :func:`round_children`.

    Parameters
    ----------
    x : ndarray
        Estimates, ``(n,)`` for one unit or ``(g, n)`` for several.

    Returns
    -------
    ndarray
        ``int64`` of the shape of ``x``.

    Raises
    ------
    ValueError
        If ``x`` contains NaN or infinite values, or has more than two dimensions.

    Examples
    --------
    >>> round_top(np.array([-0.2, 0.5, 1.5, 2.49])).tolist()
    [0, 1, 1, 2]
    """
    x = np.asarray(x, dtype=float)
    if not np.isfinite(x).all():
        raise ShapeError("estimates contain NaN or infinite values")
    if x.ndim > 2:
        raise ShapeError(f"round_top takes (n,) or (g, n) estimates, got shape {x.shape}")
    rows = np.maximum(np.atleast_2d(x), 0.0)
    floors = np.floor(rows)
    frac = rows - floors
    # units still missing: the total's nearest integer minus the floors' sum, at most
    # ceil(sum frac), so never more than the cells with a positive fractional part
    missing = (np.rint(rows.sum(axis=1)) - floors.sum(axis=1)).astype(np.int64)
    out: np.ndarray = floors.astype(np.int64) + _largest_remainders(frac.T, missing).T
    return out.reshape(x.shape)


def round_children(X: np.ndarray, parent: np.ndarray, *, keep_totals: bool = False) -> np.ndarray:
    """Integer children that add up exactly to the integer parent, nearest to ``X``.

    The largest-remainder method on every cell at once (the module notes): floor every
    child, then give the units the cell still lacks to the children with the largest
    fractional parts (ties to the child listed first).

    Guarantees: every column of the result sums exactly to ``parent``; every entry is
    the floor or the ceiling of the fractional one, ``|X_int - X| < 1``; the result is
    non-negative; of all such integer columns it is the nearest to ``X`` (in ``l_1``
    and ``l_2``). A cell whose parent is zero stays zero.

    Parameters
    ----------
    X : ndarray
        ``(K, n)`` non-negative fractional children whose columns sum to ``parent``
        (to a relative ``1e-6``; entries down to ``-1e-9 * max(parent, 1)`` are
        float rounding and taken as zero).
    parent : ndarray
        ``(n,)`` non-negative integers (an integer array, or floats with integer values).
    keep_totals : bool
        Also keep every child's total within 1 of its fractional total, placing the
        units by the nearest such rounding (module notes) when the largest remainders
        do not.

    Returns
    -------
    ndarray
        ``(K, n)`` ``int64``.

    Raises
    ------
    ValueError
        If the shapes disagree, ``parent`` is not non-negative integers, ``X`` is
        negative or not finite, or a column does not sum to its parent.

    Examples
    --------
    >>> X = np.array([[0.6, 2.5, 0.0], [0.3, 0.25, 1.0], [0.1, 0.25, 0.0]])
    >>> round_children(X, np.array([1, 3, 1])).tolist()
    [[1, 3, 0], [0, 0, 1], [0, 0, 0]]
    """
    X = np.asarray(X, dtype=float)
    p = np.asarray(parent)
    if X.ndim != 2 or p.shape != (X.shape[1],):
        raise ShapeError(
            f"children have shape {X.shape} and parent {p.shape}; expected (K, n), (n,)"
        )
    if not np.issubdtype(p.dtype, np.integer):
        pf = np.asarray(p, dtype=float)
        if not np.isfinite(pf).all() or (pf != np.round(pf)).any():
            raise ArgumentError("the parent must be integers to round its children to integers")
        p = pf.astype(np.int64)
    p = p.astype(np.int64)
    if (p < 0).any():
        raise ArgumentError("the parent must be non-negative")
    if not np.isfinite(X).all():
        raise ArgumentError("children contain NaN or infinite values")
    scale = np.maximum(p, 1).astype(float)
    if (X < -1e-9 * scale).any():
        raise ShapeError("children must be non-negative")
    X = np.maximum(X, 0.0)
    if (np.abs(X.sum(axis=0) - p) > _SUM_TOLERANCE * scale).any():
        raise ShapeError("the children's columns do not sum to the parent")
    K = X.shape[0]
    F = np.floor(X)
    frac = X - F
    missing = p - F.sum(axis=0).astype(np.int64)  # in [0, K - 1] when the sums hold
    if ((missing < 0) | (missing > K)).any():  # pragma: no cover - excluded by the sum check
        raise ShapeError("the children's columns do not sum to the parent")
    up = _largest_remainders(frac, missing)
    if keep_totals:
        rho = frac.sum(axis=1)
        if (np.abs(up.sum(axis=1) - rho) >= 1).any():
            kept = _nearest_keeping_totals(frac, missing, rho)
            if kept is not None:
                up = kept
    out: np.ndarray = F.astype(np.int64) + up
    return out


def _largest_remainders(frac: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """``(K, n)`` bool: in each column ``j`` the ``missing[j]`` entries with the largest
    fractional parts (ties to the entry listed first)."""
    order = np.argsort(-frac, axis=0, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(frac.shape[0])[:, None], axis=0)
    return rank < missing[None, :]


def _nearest_keeping_totals(
    frac: np.ndarray, missing: np.ndarray, rho: np.ndarray
) -> np.ndarray | None:
    """``(K, n)`` bool: which entries round up in the nearest rounding that keeps every
    column's ``missing`` units and every child's total (``rho``, the rows' fractional
    parts summed; module notes); None when the family is too large or the program's
    solution is not 0/1 (float rounding only)."""
    K, n = frac.shape
    rows, cols = np.nonzero(frac > 0)
    E = rows.size
    if E > MAX_CONTROLLED:
        return None
    lo = np.floor(rho)
    hi = np.ceil(rho)
    a_eq = sp.csr_array((np.ones(E), (cols, np.arange(E))), shape=(n, E))
    a_row = sp.csr_array((np.ones(E), (rows, np.arange(E))), shape=(K, E))
    a_ub = sp.vstack([a_row, -a_row], format="csr")
    b_ub = np.concatenate([hi, -lo])
    res = linprog(
        1.0 - 2.0 * frac[rows, cols], A_ub=a_ub, b_ub=b_ub, A_eq=a_eq,
        b_eq=missing.astype(float), bounds=(0, 1), method="highs-ds",
    )  # fmt: skip
    if res.x is None or np.abs(np.rint(res.x) - res.x).max(initial=0.0) > 1e-6:
        return None
    up = np.zeros(frac.shape, dtype=bool)
    up[rows, cols] = np.rint(res.x) > 0
    totals = up.sum(axis=1)
    if (up.sum(axis=0) != missing).any() or (totals < lo).any() or (totals > hi).any():
        return None
    return up
