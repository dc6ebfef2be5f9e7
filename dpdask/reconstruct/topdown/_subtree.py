"""What the levels below know of a unit's total: the subtree estimate of a multi-pass fit.

A top-down fit of a unit uses its own measurements and its parent's estimate; the levels
below measure the same persons again and, summed, know its total too (bottom-up least
squares uses them; issue 33: a tract's total-population error under top-down was 1.5
times least squares'). The multi-pass fit's total pass adds them as one extra row per
unit, computed before any fit from every level's measurements:

* each unit's **own estimate** of its total, ``u = 1^T G^+ A^T W y`` (``G = A^T W A``:
  unbiased when the total is estimable from the level's strategy), with variance
  ``s = 1^T G^+ 1`` (:func:`total_estimator`); a unit whose total the public constraints
  fix (an invariant, or every cell's bounds equal, as an empty block's) has it exactly,
  variance 0 (:func:`known_totals`);
* bottom-up (:func:`subtree_sums`), each unit's **subtree estimate** ``z`` with variance
  ``V``: at the finest level its own; above, the inverse-variance combination of its own
  and of ``S``, the sum of its children's subtree estimates, of variance ``V_S`` the sum of
  theirs (the two are independent: different levels' noise);
* the extra row of a unit with children is ``1^T x = S`` with weight ``1 / V_S`` (0 when
  ``V_S`` is 0: the constraints already fix the total). Its own measurements are
  already in the fit; ``S`` holds only the levels below, so nothing is counted twice.

The estimates are linear and unbiased, so sums over many units do not pile up bias;
the non-negativity and the constraints act in the fit itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.linalg as sla

from dpdask.reconstruct.topdown._constrained import Extra
from dpdask.reconstruct.topdown._constraints import Constraints

__all__ = ["known_totals", "subtree_row", "subtree_sums", "total_estimator"]


def subtree_row(S: np.ndarray, VS: np.ndarray, n: int) -> Extra:
    """The extra rows (:data:`~dpdask.reconstruct.topdown._constrained.Extra`) of units
    with subtree sums ``S`` of variances ``VS``: ``1^T x = S`` of weight ``1 / VS`` (0
    where ``VS`` is 0 or infinite)."""
    S, VS = np.asarray(S, dtype=float), np.asarray(VS, dtype=float)
    ok = np.isfinite(VS) & (VS > 0)
    u = np.where(ok, 1.0 / np.where(ok, VS, 1.0), 0.0)
    return np.ones((1, n)), np.where(ok, S, 0.0)[:, None], u[:, None]


def total_estimator(Ad: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``(p, s)``: a unit's unbiased total from its measurements is ``y @ p``, with
    variance ``s``; None when the strategy cannot estimate the total.

    Parameters
    ----------
    Ad : ndarray
        ``(m, n)`` the level's strategy.
    w : ndarray
        ``(m,)`` the rows' weights, ``1 / variance``.

    Examples
    --------
    >>> p, s = total_estimator(np.vstack([np.ones(2), np.eye(2)]), np.ones(3))
    >>> np.round(p, 6).tolist(), round(s, 6)
    ([0.666667, 0.333333, 0.333333], 0.666667)
    """
    n = Ad.shape[1]
    G = Ad.T @ (w[:, None] * Ad)
    try:  # G^+ 1: by Cholesky when G is positive definite (a full-rank strategy)
        b = sla.cho_solve(sla.cho_factor(G), np.ones(n))
    except np.linalg.LinAlgError:
        b = np.linalg.pinv(G, hermitian=True) @ np.ones(n)
    if not np.allclose(G @ b, np.ones(n), rtol=0, atol=1e-8 * n):
        return None  # the total is not in the row space of the strategy
    p: np.ndarray = w * (Ad @ b)
    return p, float(np.ones(n) @ b)


def known_totals(c: Constraints) -> tuple[np.ndarray, np.ndarray]:
    """``(known, value)`` per unit: whether the constraints fix its total, and to what
    (a total query with equal bounds, or every cell's bounds equal)."""
    finite = np.isfinite(c.upper).all(axis=1)
    cells = finite & (c.lower == c.upper).all(axis=1)
    value = np.where(cells, c.lower.sum(axis=1), 0.0)
    known = cells.copy()
    if c.queries.shape[0]:
        tot = np.flatnonzero((c.queries == 1).all(axis=1))
        for r in tot:
            inv = np.isfinite(c.lo[:, r]) & (c.lo[:, r] == c.hi[:, r]) & ~known
            value[inv] = c.lo[inv, r]
            known |= inv
    return known, value


def subtree_sums(
    own: Sequence[tuple[np.ndarray, np.ndarray]],
    parents: Sequence[np.ndarray],
    sizes: Sequence[int],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every level's children's subtree sums (module notes).

    Parameters
    ----------
    own : sequence of (ndarray, ndarray)
        For the levels below the top (level 1 to ``L - 1``), each unit's own total
        estimate and its variance (0: known exactly; ``inf``: no estimate).
    parents : sequence of ndarray
        ``parents[i]``: the parent in level ``i`` of each unit of level ``i + 1``.
    sizes : sequence of int
        The units of each level (``L`` of them).

    Returns
    -------
    list of (ndarray, ndarray)
        For levels 0 to ``L - 2``: ``S``, the sum of each unit's children's subtree
        estimates, and ``V_S``, its variance (``inf`` where some child has no estimate).

    Examples
    --------
    >>> out = subtree_sums([(np.array([4.0, 6.0]), np.array([1.0, 1.0]))],
    ...                    [np.array([0, 0])], [1, 2])
    >>> out[0][0].tolist(), out[0][1].tolist()
    ([10.0], [2.0])
    """
    L = len(sizes)
    if len(own) != L - 1 or len(parents) != L - 1:
        from dpdask.errors import ShapeError

        raise ShapeError("need an own estimate and a parent index for every level below the top")
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0), np.zeros(0))] * (L - 1)
    z, V = (np.asarray(a, dtype=float) for a in own[L - 2])  # the finest level: its own
    for i in range(L - 2, -1, -1):
        par = np.asarray(parents[i], dtype=np.int64)
        S = np.bincount(par, weights=z, minlength=sizes[i])
        VS = np.bincount(par, weights=V, minlength=sizes[i])  # inf where a child has none
        out[i] = (S, VS)
        if i == 0:
            break
        u, s = (np.asarray(a, dtype=float) for a in own[i - 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            wu = np.where(s > 0, 1.0 / s, np.inf)
            wS = np.where(VS > 0, 1.0 / VS, np.inf)
            tot = wu + wS
            mix = (wu * u + wS * np.where(np.isfinite(VS), S, 0.0)) / np.maximum(tot, 1e-300)
            z = np.where(s == 0, u, np.where(VS == 0, S, np.where(tot > 0, mix, 0.0)))
            V = np.where((s == 0) | (VS == 0), 0.0, np.where(tot > 0, 1.0 / tot, np.inf))
    return out
