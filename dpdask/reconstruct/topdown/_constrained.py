"""One family's children fitted under cell bounds, query bounds and invariants.

:func:`fit_constrained_children` generalises :func:`~dpdask.reconstruct.topdown.fit_children`:
the ``K`` children of one parent solve

    minimise  1/2 sum_c ||W^1/2 (A x_c - y_c)||^2
    subject to  sum_c X[c, j] = p_j              (every cell, when a parent is given),
                lower_c <= x_c <= upper_c         (cell bounds; zeros are upper = 0),
                lo_c <= Q x_c <= hi_c             (query bounds; invariants lo = hi).

A child may also carry its own extra rows (``extra``: estimates ``v_c`` of queries
``E x_c`` with per-child weights ``u_c``, such as the sum of the levels below's
estimates of its total), adding ``1/2 sum_c ||U_c^1/2 (E x_c - v_c)||^2`` to the
objective: a rank-``r`` term in the child's Hessian block.

Without a parent (the top level) it is a bounded least-squares fit of each unit. Pairs
whose bounds are equal (structural zeros) and the cells where the parent is zero are
fixed and not variables, so they hold exactly; a query bound the (tightened) cell
bounds already imply is dropped (a total of at least 0), each other one with ``lo <
hi`` becomes an equality with a bounded slack variable; the problem goes to the
interior-point solver of :mod:`dpdask.reconstruct.topdown._qp`, whose Hessian is
block diagonal (one block per child: the Gram on its free cells, from the level's Gram
when given), so each iteration costs the cube of each child's free cells plus that of
the equalities (:mod:`~dpdask.reconstruct.topdown._qp_blocks`), not of the family's.

With noise off and the truth inside the constraints, the truth is a feasible point of
zero objective, so the fit returns it (to the solver's tolerance) when the strategy has
full column rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.errors import PlanError, ShapeError
from dpdask.linalg import LinearQuery
from dpdask.reconstruct._report import ConvergenceReport, Estimate
from dpdask.reconstruct.topdown._constraints import Constraints, _reach, check_family
from dpdask.reconstruct.topdown._qp import solve_qp

__all__ = ["Extra", "dense_strategy", "fit_constrained_children"]

Extra = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per-child extra rows: queries ``E`` ``(r, n)``, estimates ``(K, r)``, weights ``(K, r)``."""


def check_extra(extra: Extra | None, K: int, n: int) -> Extra | None:
    """``extra`` as float arrays of consistent shapes, finite, weights non-negative."""
    if extra is None:
        return None
    E, v, u = (np.asarray(a, dtype=float) for a in extra)
    E = np.atleast_2d(E)
    r = E.shape[0]
    if E.shape != (r, n) or np.shape(v) != (K, r) or np.shape(u) != (K, r):
        raise ShapeError(f"extra rows: need queries (r, {n}), estimates and weights ({K}, r)")
    if not (np.isfinite(E).all() and np.isfinite(v).all() and np.isfinite(u).all()):
        raise ShapeError("extra rows must be finite")
    if (u < 0).any():
        raise ShapeError("extra rows' weights must be non-negative")
    return E, v, u


def take_extra(extra: Extra | None, rows: Any) -> Extra | None:
    """The children ``rows`` of ``extra``."""
    return None if extra is None else (extra[0], extra[1][rows], extra[2][rows])


def dense_strategy(A: LinearQuery | np.ndarray) -> np.ndarray:
    """The strategy as a dense float64 matrix ``(m, n)``."""
    if isinstance(A, LinearQuery):
        return np.asarray(A.dense(), dtype=float)
    Ad = np.asarray(A, dtype=float)
    if Ad.ndim != 2:
        raise ShapeError(f"the strategy must be a matrix, got shape {Ad.shape}")
    return Ad


def weighted_gram(Ad: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``A^T W A`` ``(n, n)`` (through a sparse product when ``A`` is mostly zeros, as
    the marginals of a Census strategy are)."""
    if np.count_nonzero(Ad) <= 0.1 * Ad.size:
        As = sp.csr_array(Ad)
        out: np.ndarray = (As.T @ (As * w[:, None])).toarray()
        return out
    dense: np.ndarray = Ad.T @ (w[:, None] * Ad)
    return dense


def _weights(w: np.ndarray | float | None, m: int) -> np.ndarray:
    if w is None:
        return np.ones(m)
    wv = np.broadcast_to(np.asarray(w, dtype=float), (m,))
    if not np.isfinite(wv).all() or (wv < 0).any():
        raise ShapeError("weights must be finite and non-negative")
    return np.array(wv)


def fit_constrained_children(
    A: LinearQuery | np.ndarray,
    Y: np.ndarray,
    parent: np.ndarray | None,
    constraints: Constraints | None = None,
    *,
    weights: np.ndarray | float | None = None,
    tol: float = 1e-10,
    maxiter: int = 200,
    check: bool = True,
    parent_name: str = "the parent",
    gram: np.ndarray | None = None,
    extra: Extra | None = None,
) -> Estimate:
    """The children of one parent fitted under their constraints (module notes).

    Parameters
    ----------
    A : LinearQuery or ndarray
        The level's strategy, ``m x n``.
    Y : ndarray
        ``(K, m)`` the children's measurements.
    parent : ndarray or None
        ``(n,)`` the parent's fixed cells, or None for units without a parent (the top
        level: each unit fitted on its own).
    constraints : Constraints, optional
        The children's (``K`` units of ``n`` cells); default non-negativity alone.
    weights : ndarray or float, optional
        Per-row weights ``W`` (usually ``1 / variance``).
    tol, maxiter
        For :func:`~dpdask.reconstruct.topdown._qp.solve_qp`.
    check : bool
        Check the constraints against each other and the parent first
        (:func:`~dpdask.reconstruct.topdown.check_family`), for errors that name them.
    parent_name : str
        The parent's name in error messages.
    gram : ndarray, optional
        ``(n, n)`` the weighted Gram ``A^T W A`` when known (a level's families share
        it); default computed from ``A`` on the cells some child is free in.
    extra : tuple of ndarray, optional
        Per-child extra rows (module notes): queries ``(r, n)``, their estimates and
        weights ``(K, r)``.

    Returns
    -------
    Estimate
        ``x`` ``(K, n)``: within the cell bounds exactly (fixed pairs exactly at their
        bound), the cells' sums and query bounds to the solver's tolerance; the report
        (``method`` ``"topdown-constrained"``; ``details``: ``variables``,
        ``equalities``, ``objective`` ``1/2 sum_c ||W^1/2 (A x_c - y_c)||^2``, with the
        extra rows' terms).

    Raises
    ------
    DataError
        A conflict among the constraints or with the parent that the checks name.
    PlanError
        The constraints admit no solution (naming the family's units).

    Examples
    --------
    >>> from dpdask.linalg import Identity
    >>> c = Constraints.none(2, 3).with_queries(np.ones(3), [[2.0], [4.0]], [[2.0], [4.0]],
    ...                                         ["total"])
    >>> Y = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    >>> x, _ = fit_constrained_children(Identity(3), Y, np.array([2.0, 3.0, 1.0]), c)
    >>> np.round(x, 6).tolist()
    [[1.75, 0.25, 0.0], [0.25, 2.75, 1.0]]
    """
    Ad = dense_strategy(A)
    m, n = Ad.shape
    Yb = np.asarray(Y, dtype=float)
    if Yb.ndim != 2 or Yb.shape[1] != m:
        raise ShapeError(f"measurements have shape {Yb.shape}; expected (K, {m})")
    if not np.isfinite(Yb).all():
        raise ShapeError("measurements contain NaN or infinite values")
    K = Yb.shape[0]
    c = Constraints.none(K, n) if constraints is None else constraints
    if (c.k, c.n) != (K, n):
        raise ShapeError(f"constraints are for {c.k} units of {c.n} cells; need {K} of {n}")
    if gram is not None and np.shape(gram) != (n, n):
        raise ShapeError(f"the Gram has shape {np.shape(gram)}; expected ({n}, {n})")
    p = None if parent is None else np.asarray(parent, dtype=float)
    if p is not None and (p.shape != (n,) or not np.isfinite(p).all()):
        raise ShapeError(f"the parent must be a finite ({n},) vector")
    extra = check_extra(extra, K, n)
    if check:
        check_family(p, c, parent_name=parent_name)
    if p is None and K > 1:  # units without a parent are separate problems
        ests = [
            fit_constrained_children(
                Ad, Yb[k : k + 1], None, c.take([k]), weights=weights, tol=tol,
                maxiter=maxiter, check=False, parent_name=c.units[k], gram=gram,
                extra=take_extra(extra, [k]),
            )
            for k in range(K)
        ]  # fmt: skip
        reports = [e.report for e in ests]
        summed: dict[str, Any] = {
            "variables": sum(r.details["variables"] for r in reports),
            "objective": sum(r.details["objective"] for r in reports),
            "constant": sum(r.details["constant"] for r in reports),
        }
        return Estimate(
            np.vstack([e.x for e in ests]),
            ConvergenceReport(
                "topdown-constrained", True, max(r.iterations for r in reports),
                max(r.residual for r in reports), tol, summed,
            ),
        )  # fmt: skip
    w = _weights(weights, m)
    const = 0.5 * float(np.sum(w * Yb * Yb))
    if extra is not None:
        const += 0.5 * float(np.sum(extra[2] * extra[1] ** 2))
    lower, upper = _presolve(c, p)
    fixed = lower >= upper
    Xfix = np.where(fixed, lower, 0.0)
    x, iterations, residual = _solve(
        (Ad, w, Yb, gram),
        p,
        c,
        (lower, upper, fixed, Xfix),
        tol,
        maxiter,
        parent_name,
        extra,
    )
    X = Xfix.copy()
    X[~fixed] = x
    X = np.clip(X, c.lower, c.upper)
    _verify(X, p, c, parent_name)
    R = X @ Ad.T - Yb
    objective = 0.5 * float(np.sum(w * R * R))
    if extra is not None:
        Re = X @ extra[0].T - extra[1]
        objective += 0.5 * float(np.sum(extra[2] * Re * Re))
    details: dict[str, Any] = {"variables": int((~fixed).sum()), "objective": objective}
    details["constant"] = const
    report = ConvergenceReport("topdown-constrained", True, iterations, residual, tol, details)
    return Estimate(X, report)


def _verify(X: np.ndarray, p: np.ndarray | None, c: Constraints, parent_name: str) -> None:
    """Fail closed: the fit must meet every constraint (to ``1e-7`` of the unit's scale)."""
    names = ", ".join(c.units[:5]) + (", ..." if c.k > 5 else "")
    bad = ~c.satisfied(X, atol=1e-7)
    if bad.any():
        raise PlanError(
            f"{parent_name}, the family of {names}: the constraints admit no solution "
            f"({c.units[int(np.argmax(bad))]} cannot meet them)"
        )
    if p is not None:
        err = np.abs(X.sum(axis=0) - p)
        if (err > 1e-7 * np.maximum(1.0, np.abs(p).sum())).any():
            raise PlanError(
                f"{parent_name}, the family of {names}: the constraints admit no solution "
                f"(cell {int(np.argmax(err))} cannot add up to the parent)"
            )


def _presolve(c: Constraints, p: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The cell bounds tightened where a constraint leaves no room: an invariant of
    non-negative coefficients at the least (or largest) answer the cells allow fixes its
    cells at their lower (upper) bounds, and so does a parent cell at its children's
    lower (upper) bounds' sum, repeated while anything changes. (A set of solutions
    without interior, such as the cells of a child whose total is fixed at zero, stalls
    the interior-point iteration.)"""
    lower, upper = c.lower.copy(), c.upper.copy()
    if p is not None:
        upper[:, p <= 0] = np.minimum(upper[:, p <= 0], lower[:, p <= 0])
    Q = c.queries
    pos = np.asarray((Q >= 0).all(axis=1) & (Q > 0).any(axis=1), dtype=bool)
    inv = c.invariants() & pos[None, :]
    for _ in range(4):
        changed = False
        up = np.where(np.isinf(upper), 0.0, upper)
        least, most = lower @ Q.T, up @ Q.T
        bounded = (np.isinf(upper).astype(float) @ (Q > 0).T) == 0
        eps = 1e-9 * np.maximum(1.0, np.abs(np.where(inv, c.lo, 0.0)))
        for k, r in np.argwhere(inv & (c.lo <= least + eps)):
            cells = (Q[r] > 0) & (upper[k] > lower[k])
            upper[k, cells] = lower[k, cells]
            changed |= bool(cells.any())
        for k, r in np.argwhere(inv & bounded & (c.hi >= most - eps)):
            cells = (Q[r] > 0) & (upper[k] > lower[k])
            lower[k, cells] = upper[k, cells]
            changed |= bool(cells.any())
        if p is not None:
            tight = lower.sum(axis=0) >= p - 1e-9 * np.maximum(1.0, p)
            loose = upper > lower
            cols = tight & loose.any(axis=0)
            upper[:, cols] = lower[:, cols]
            full = upper.sum(axis=0) <= p + 1e-9 * np.maximum(1.0, p)
            cols = full & (upper > lower).any(axis=0)
            lower[:, cols] = upper[:, cols]
            changed |= bool(cols.any()) or bool((tight & loose.any(axis=0)).any())
        if not changed:
            break
    return lower, upper


def _solve(
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None], p: np.ndarray | None,
    c: Constraints,
    bounds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tol: float, maxiter: int,
    parent_name: str, extra: Extra | None = None,
) -> tuple[np.ndarray, int, float]:  # fmt: skip
    """The free pairs' values (child by child, cell order), from the QP of the module
    notes, with the solver's iterations and residual."""
    lower, upper, fixed, Xfix = bounds
    Ad, w, Yb, gram = data
    K, n = lower.shape
    free = [np.flatnonzero(~fixed[k]) for k in range(K)]
    offsets = np.cumsum([0, *(f.size for f in free)])
    Nx = int(offsets[-1])
    if Nx == 0:
        return np.zeros(0), 0, 0.0
    Q = c.queries
    # equality and slack rows as triplets (row, variable, value)
    ri: list[np.ndarray] = []
    vi: list[np.ndarray] = []
    xi: list[np.ndarray] = []
    rhs: list[float] = []
    slack_lo: list[float] = []
    slack_hi: list[float] = []
    n_rows = 0
    if p is not None:
        cells = np.concatenate(free)
        used = np.flatnonzero(np.bincount(cells, minlength=n) > 0)
        ri.append(np.searchsorted(used, cells))
        vi.append(np.arange(Nx))
        xi.append(np.ones(Nx))
        rhs.extend((p - Xfix.sum(axis=0))[used])
        n_rows = used.size
    slack_of: list[int] = []  # the row of each slack variable
    # a bound the cell bounds imply (e.g. a total of at least 0) is not a constraint
    least, most = _reach(Q, lower, upper)
    lo_k = np.where(c.lo <= least, -np.inf, c.lo)
    hi_k = np.where(c.hi >= most, np.inf, c.hi)
    for k in range(K):
        f = free[k]
        for r in range(Q.shape[0]):
            lo, hi = float(lo_k[k, r]), float(hi_k[k, r])
            if lo == -np.inf and hi == np.inf:
                continue
            if c.lo[k, r] == c.hi[k, r]:
                lo = hi = float(c.lo[k, r])  # an invariant stays an equality
            coef = Q[r, f]
            if not (np.isfinite(lo) or np.isfinite(hi)) or not coef.any():
                continue  # no bound, or fixed by the cells (checked by check_constraints)
            off = float(Q[r] @ Xfix[k])
            nz = np.flatnonzero(coef)
            ri.append(np.full(nz.size, n_rows))
            vi.append(offsets[k] + nz)
            xi.append(coef[nz])
            if lo == hi:
                rhs.append(lo - off)
            else:
                rhs.append(0.0)
                slack_of.append(n_rows)
                slack_lo.append(lo - off)
                slack_hi.append(hi - off)
            n_rows += 1
    S = len(slack_of)
    N = Nx + S
    ri.append(np.asarray(slack_of, dtype=np.int64))
    vi.append(Nx + np.arange(S))
    xi.append(-np.ones(S))
    M = sp.csr_array(
        (np.concatenate(xi), (np.concatenate(ri), np.concatenate(vi))), shape=(n_rows, N)
    )
    b = np.asarray(rhs, dtype=float)
    lo_s, hi_s = np.asarray(slack_lo), np.asarray(slack_hi)
    # the Gram restricted to the cells some child is free in (never the whole domain's)
    union = np.flatnonzero((~fixed).any(axis=0))
    if gram is None:
        Au = Ad[:, union]
        G = Au.T @ (w[:, None] * Au)
    else:
        G = gram[np.ix_(union, union)]
    # the linear terms A^T W (A x_fixed - y) of every child at once
    R = -Yb if not Xfix.any() else Xfix @ Ad.T - Yb
    Z = (R * w) @ Ad
    blocks = []
    q = np.zeros(N)
    for k in range(K):
        f = free[k]
        loc = np.searchsorted(union, f)
        blocks.append(G[np.ix_(loc, loc)])
        q[offsets[k] : offsets[k + 1]] = Z[k, f]
    if extra is not None:  # each child's own rows: a rank-r term in its block
        E, v, u = extra
        Re = Xfix @ E.T - v
        for k in range(K):
            f = free[k]
            Ef = E[:, f]
            blocks[k] = blocks[k] + (Ef.T * u[k]) @ Ef
            q[offsets[k] : offsets[k + 1]] += Ef.T @ (u[k] * Re[k])
    if S:
        blocks.append(sp.csr_array((S, S)))
    P = sp.block_diag(blocks, format="csr")
    lo_v = np.concatenate([lower[~fixed], lo_s])
    hi_v = np.concatenate([upper[~fixed], hi_s])
    try:
        try:
            res = solve_qp(P, q, M, b, lo_v, hi_v, tol=tol, maxiter=maxiter, blocks=blocks[:K])
        except PlanError:  # only the sparse LU's verdict is trusted
            res = solve_qp(P, q, M, b, lo_v, hi_v, tol=tol, maxiter=maxiter)
    except PlanError as e:
        names = ", ".join(c.units[:5]) + (", ..." if K > 5 else "")
        raise PlanError(f"{parent_name}, the family of {names}: {e}") from e
    return res.v[:Nx], res.iterations, res.residual
