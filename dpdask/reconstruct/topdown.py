"""Top-down estimation: each parent's non-negative estimate split among its children.

The ``K`` children of one parent are fitted jointly (:func:`fit_children`): with
``G = A^T W A`` and ``C = A^T W Y^T`` the level's Gram and linear terms, they solve

    minimise  f(X) = 1/2 sum_c ||W^1/2 (A x_c - y_c)||^2
    subject to  X >= 0,  sum_c X[c, j] = p_j,  X[:, j] = 0 where p_j = 0,

``p`` the parent's final estimate. Only the cells of the parent's support ``S`` are
variables: the problem is built on ``G[S, S]`` and ``C[S]`` (a dense submatrix when the
level's Gram is small, a product restricted to ``S`` for a Kronecker strategy of small
factors, otherwise the full product scattered and gathered). Its feasible set is, cell
by cell, a simplex scaled to ``p_j`` across the children.

**Algorithm.** Accelerated projected gradient (FISTA) with gradient-based adaptive
restart (O'Donoghue and Candes, 2015) in the Jacobi-scaled variables
``u_cj = x_cj / s_j``, ``s = diag(G)^-1/2`` (one scale per cell, shared by the children,
so every cell's feasible set stays a simplex, scaled to ``p_j / s_j``). The step is
``1 / L`` with ``L`` the largest eigenvalue of the scaled ``G[S, S]`` (unit diagonal),
estimated by power iteration and raised whenever a step's curvature
``<d, G d> / <d, d>`` (free: ``G`` is linear, so ``G`` at the extrapolated point is
combined from the products at the iterates) exceeds it; the projection (Held et al.,
1974: sort the children of each cell, find the threshold) runs on all cells at once.
One product with ``G[S, S]`` per iteration. The start is the better (in ``f``) of the
even split ``p / K`` and the projection of ``s C``, one Jacobi step from zero.

**Stopping rule.** The KKT residual of the scaled problem, the root-mean-square
projected gradient ``||U - P(U - grad)|| / sqrt(K |S|)``, is at most ``tol``: it is zero
exactly at a KKT point (per cell a multiplier ``nu_j`` with ``grad_cj >= nu_j``, with
equality where ``u_cj > 0``). As in :mod:`dpdask.reconstruct.nnls`, with inverse-variance
weights its entries are in noise units (each scaled gradient entry has variance one at
the true data), so ``tol = 1e-2`` leaves a hundredth of the noise to optimise. The
report also gives the Frank-Wolfe duality gap ``gap = <grad, X> - sum_j p_j min_c
grad_cj >= f(X) - f*`` (``details["gap"]``), a certificate: then
``||W^1/2 A (X - X*)||_F^2 <= 2 gap`` for the optimum ``X*``.

The returned children are exactly feasible: after the last projection each cell's sum
is made exact by setting its largest child to ``p_j`` minus the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import as_batch, row_weighted
from dpdask.reconstruct._kron_gram import scaled_kron_gram
from dpdask.reconstruct._report import ConvergenceReport, Estimate, warn_at_limit
from dpdask.reconstruct._topdown_rounding import round_children, round_top
from dpdask.reconstruct.nnls import nnls

__all__ = ["children_fitter", "fit_children", "round_children", "round_top", "topdown_tree"]

_DENSE_GRAM = 2048
"""Levels with at most this many cells keep their scaled Gram dense (at most 32 MB)."""
_POWER_ITERATIONS = 50
_POWER_RTOL = 1e-3
_L_MARGIN = 1.02  # the step's L over the power iteration's estimate (from below)
_GRAMS = ("auto", "dense", "kron", "full")

RowsOp = Callable[[np.ndarray], np.ndarray]


def _project(V: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Each column ``V[:, j]`` projected onto ``{v >= 0, sum v = t_j}`` (``t > 0``), all at
    once: sort descending, ``tau_j`` from the largest ``rho`` with ``u_rho > (sum_{i <=
    rho} u_i - t_j) / rho``, then ``max(v - tau, 0)``."""
    K = V.shape[0]
    if K == 1:
        return np.broadcast_to(t, V.shape).copy()
    u = -np.sort(-V, axis=0)
    css = np.cumsum(u, axis=0)
    css -= t
    cond = u * np.arange(1, K + 1)[:, None] > css
    rho = K - np.argmax(cond[::-1], axis=0)  # the last index where it holds (1-based)
    tau = np.take_along_axis(css, (rho - 1)[None], axis=0)[0] / rho
    return np.maximum(V - tau, 0.0)


class _Level:
    """What every fit of one level shares: the row-weighted operator, the Jacobi scale,
    and the scaled Gram (dense when small, Kronecker factors when structured)."""

    def __init__(self, A: LinearQuery, weights: np.ndarray | float | None, gram: str):
        if gram not in _GRAMS:
            raise ValueError(f"unknown gram {gram!r}; use one of {', '.join(_GRAMS)}")
        self.A, self.weights = A, weights
        self.Aw = row_weighted(A, weights)
        self.n = A.shape[1]
        d = self.Aw.column_norms(2) ** 2
        self.scale = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)
        self.G = self.Aw.gram()
        if gram == "auto":
            gram = "dense" if self.n <= _DENSE_GRAM else "kron"
        self.kron = scaled_kron_gram(self.Aw, np.float64) if gram == "kron" else None
        if gram == "kron" and self.kron is None:
            gram = "full"
        self.kind = gram
        self.dense: np.ndarray | None = None
        if gram == "dense":
            Gd = self.G.dense()
            Gd = 0.5 * (Gd + Gd.T)
            self.dense = self.scale[:, None] * Gd * self.scale[None, :]

    def restricted(self, idx: np.ndarray) -> RowsOp:
        """``U -> U G~[S, S]`` for rows ``U`` ``(k, |S|)``, ``G~`` the scaled Gram."""
        if self.dense is not None:
            sub = np.ascontiguousarray(self.dense[np.ix_(idx, idx)])
            return lambda U: U @ sub
        if self.kron is not None:
            op = self.kron.restricted(idx, np.float64)
            return lambda U: np.stack([op(u) for u in U])
        s = self.scale[idx]
        n, G = self.n, self.G

        def full(U: np.ndarray) -> np.ndarray:
            Z = np.zeros((U.shape[0], n))
            Z[:, idx] = U * s
            return G.apply(Z)[:, idx] * s

        return full


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's BLAS pools, found once (a limit on them is then cheap, ~10 us)."""
    return ThreadpoolController()


def _lipschitz(rows: RowsOp, size: int) -> tuple[float, int]:
    """Power iteration for the largest eigenvalue of the PSD ``G~[S, S]`` (from ones:
    the Perron vector of a non-negative Gram), and the products it took."""
    v = np.full((1, size), 1.0 / np.sqrt(size))
    lam = 0.0
    for it in range(1, _POWER_ITERATIONS + 1):
        w = rows(v)
        new = float(np.linalg.norm(w))
        if new == 0.0:
            return 1.0, it  # G[S, S] = 0: any step is exact
        v = w / new
        if abs(new - lam) <= _POWER_RTOL * new:
            return new, it
        lam = new
    return lam, _POWER_ITERATIONS


def _fista(
    rows: RowsOp, C: np.ndarray, t: np.ndarray, U0: np.ndarray, GU0: np.ndarray,
    L: float, tol: float, maxiter: int,
) -> tuple[np.ndarray, np.ndarray, dict]:  # fmt: skip
    """FISTA with adaptive restart on ``1/2 <U, U G~> - <C, U>`` over the product of
    simplices (module notes). Returns the last iterate, ``U G~`` there, and counters."""
    N = U0.size

    def kkt(U: np.ndarray, GU: np.ndarray) -> float:
        return float(np.linalg.norm(U - _project(U - (GU - C), t)) / np.sqrt(N))

    U, GU = U0, GU0
    V, GV = U, GU
    theta, restarts, raised = 1.0, 0, 0
    res = kkt(U, GU)
    it = 0
    while res > tol and it < maxiter:
        it += 1
        U_new = _project(V - (GV - C) / L, t)
        GU_new = rows(U_new)
        D = U_new - V
        dd = float(np.vdot(D, D))
        restart = False
        if dd > 0.0:
            curv = float(np.vdot(D, GU_new - GV)) / dd
            if curv > L:  # the estimate of L was low: raise it, drop the momentum
                L, raised, restart = _L_MARGIN * curv, raised + 1, True
        res = kkt(U_new, GU_new)
        if restart or float(np.vdot(V - U_new, U_new - U)) > 0.0:
            theta, restarts = 1.0, restarts + 1
            V, GV = U_new, GU_new
        else:
            theta_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
            beta = (theta - 1.0) / theta_new
            V = U_new + beta * (U_new - U)
            GV = GU_new + beta * (GU_new - GU)
            theta = theta_new
        U, GU = U_new, GU_new
    info = {"iterations": it, "residual": res, "restarts": restarts, "lipschitz": L}
    info["lipschitz_raised"] = raised
    return U, GU, info


def _exact_sums(X: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``X`` with each column's largest child set to ``p_j`` minus the others."""
    big = np.argmax(X, axis=0)
    cols = np.arange(X.shape[1])
    X[big, cols] = 0.0
    X[big, cols] = np.maximum(p - X.sum(axis=0), 0.0)
    return X


def children_fitter(
    A: LinearQuery,
    weights: np.ndarray | float | None = None,
    *,
    tol: float = 1e-2,
    maxiter: int = 5000,
    gram: str = "auto",
) -> Callable[[np.ndarray, np.ndarray], Estimate]:
    """:func:`fit_children` with the level's strategy and options fixed, for many parents.

    What the fits of one level share (the row-weighted operator, the Jacobi scale, the
    scaled Gram: dense for at most 2,048 cells, Kronecker factors for a Kronecker
    strategy of small factors) is computed once, here.

    Parameters
    ----------
    A, weights, tol, maxiter
        As for :func:`fit_children`.
    gram : {"auto", "dense", "kron", "full"}
        How ``G[S, S]`` is applied: a dense submatrix of the level's scaled Gram, a
        Kronecker product restricted to the support, or the full structured product
        scattered and gathered (``"kron"`` falls back to ``"full"`` for a strategy that
        is not a Kronecker product of small factors). ``"auto"``: dense up to 2,048
        cells, else Kronecker where possible.

    Returns
    -------
    callable
        ``fit(Y, parent)``: :func:`fit_children` of the children's measurements ``Y``
        ``(K, m)`` and the parent's estimate ``(n,)``.
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    level = _Level(A, weights, gram)
    m, n = A.shape
    w = None if weights is None else np.broadcast_to(np.asarray(weights, dtype=float), (m,))

    def fit(Y: np.ndarray, parent: np.ndarray) -> Estimate:
        Yb, _ = as_batch(Y, m, "measurements")
        p = np.asarray(parent, dtype=float)
        if p.shape != (n,):
            raise ValueError(f"parent has shape {p.shape}; expected ({n},)")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ValueError("the parent's estimate must be finite and non-negative")
        # one BLAS thread: the products are small, and a second thread that is not
        # scheduled (a busy core) stalls each of them by milliseconds
        with _blas().limit(limits=1, user_api="blas"):
            return _fit(level, Yb if w is None else Yb * np.sqrt(w), p, tol, maxiter)

    return fit


def _fit(level: _Level, Yw: np.ndarray, p: np.ndarray, tol: float, maxiter: int) -> Estimate:
    K, n = Yw.shape[0], level.n
    idx = np.flatnonzero(p > 0)
    S = idx.size
    details: dict = {"children": K, "cells": n, "support": S, "variables": K * S}
    details["gram"] = level.kind
    X = np.zeros((K, n))
    if K == 1 or S == 0:  # the parent itself (or nothing to split)
        X[:, idx] = p[idx]
        details.update(gap=0.0, products=0)
        report = ConvergenceReport("topdown-fista", True, 0, 0.0, tol, details)
        return Estimate(X, report)
    s = level.scale[idx]
    t = p[idx] / s
    C = level.Aw.T.apply(Yw)[:, idx] * s
    rows = level.restricted(idx)
    L, power = _lipschitz(rows, S)
    L *= _L_MARGIN
    # start: the better of the even split and one Jacobi step from zero, projected
    starts = [np.broadcast_to(t / K, (K, S)).copy(), _project(C, t)]
    G0 = [rows(U) for U in starts]
    vals = [0.5 * np.vdot(U, GU) - np.vdot(C, U) for U, GU in zip(starts, G0, strict=True)]
    b = int(np.argmin(vals))
    U, GU, info = _fista(rows, C, t, starts[b], G0[b], L, tol, maxiter)
    grad = GU - C
    gap = float(np.vdot(grad, U) - np.dot(t, grad.min(axis=0)))
    const = 0.5 * float(np.vdot(Yw, Yw))
    details.update(
        start=("even", "jacobi")[b],
        lipschitz=info["lipschitz"],
        lipschitz_raised=info["lipschitz_raised"],
        restarts=info["restarts"],
        power_iterations=power,
        products=info["iterations"] + 2 + power,
        objective=float(0.5 * np.vdot(U, GU) - np.vdot(C, U)) + const,
        gap=max(gap, 0.0),
    )
    X[:, idx] = _exact_sums(U * s, p[idx])
    converged = info["residual"] <= tol
    report = ConvergenceReport(
        "topdown-fista", converged, info["iterations"], info["residual"], tol, details
    )
    warn_at_limit(report, maxiter, stacklevel=4)
    return Estimate(X, report)


def fit_children(
    A: LinearQuery,
    Y: np.ndarray,
    parent: np.ndarray,
    *,
    weights: np.ndarray | float | None = None,
    tol: float = 1e-2,
    maxiter: int = 5000,
    gram: str = "auto",
) -> Estimate:
    """The children of one parent, fitted jointly, adding up to the parent.

    Minimises ``sum_c ||W^1/2 (A x_c - y_c)||^2`` over ``X >= 0`` with
    ``X.sum(axis=0) == parent`` and ``X[:, j] == 0`` wherever ``parent[j] == 0``; only
    the parent's support is a variable (the module notes give the algorithm and the
    stopping rule). With one child the answer is the parent.

    Parameters
    ----------
    A : LinearQuery
        The level's strategy, ``m x n``, implicit.
    Y : ndarray
        ``(K, m)``: the noisy measurements of the ``K`` children.
    parent : ndarray
        ``(n,)``: the parent's final, non-negative estimate.
    weights : ndarray or float, optional
        Per-row weights ``W`` (usually ``1 / variance``; ``tol`` is then in noise units).
    tol : float
        Stop when the root-mean-square KKT residual (projected gradient) of the
        Jacobi-scaled problem is at most ``tol``.
    maxiter : int
        FISTA iterations (one product with ``G[S, S]`` each) before giving up with a
        :class:`~dpdask.errors.ConvergenceWarning`.
    gram : {"auto", "dense", "kron", "full"}
        How ``G[S, S]`` is applied (:func:`children_fitter`).

    Returns
    -------
    Estimate
        ``x`` of shape ``(K, n)``, non-negative, zero off the parent's support, columns
        summing to ``parent`` (up to one rounding); the report (``method``
        ``"topdown-fista"``; ``details``: ``support`` (cells solved), ``variables``,
        ``gap`` (the duality gap, ``>= f(X) - f*``), ``objective``, ``lipschitz``,
        ``restarts``, ``products``, ``gram``, ``start``).

    Raises
    ------
    ValueError
        If shapes disagree, or the measurements or parent are not finite, or the
        parent is negative.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> A = VStack([Identity(3), Total(3)])
    >>> Y = np.array([[2.0, 1.0, 0.0, 3.0], [1.0, 2.0, 0.0, 3.0]])
    >>> x, report = fit_children(A, Y, np.array([2.0, 4.0, 0.0]), tol=1e-10)
    >>> np.round(x, 6).tolist(), report.details["support"]
    ([[1.5, 1.5, 0.0], [0.5, 2.5, 0.0]], 2)
    """
    return children_fitter(A, weights, tol=tol, maxiter=maxiter, gram=gram)(Y, parent)


def _group(parent: np.ndarray, n_parents: int, n_children: int, lvl: int) -> list[np.ndarray]:
    """The children of each parent (indices into the level), in order."""
    parent = np.asarray(parent)
    if parent.shape != (n_children,) or not np.issubdtype(parent.dtype, np.integer):
        raise ValueError(f"level {lvl}: need an integer parent index per unit ({n_children})")
    if n_children and (parent.min() < 0 or parent.max() >= n_parents):
        raise ValueError(f"level {lvl}: parent indices must be in [0, {n_parents})")
    order = np.argsort(parent, kind="stable")
    return np.split(order, np.cumsum(np.bincount(parent, minlength=n_parents))[:-1])


def topdown_tree(
    strategies: Sequence[LinearQuery],
    measurements: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    *,
    weights: Sequence[np.ndarray | float | None] | None = None,
    integer: bool = False,
    top: Callable[..., Estimate] | None = None,
    tol: float = 1e-2,
    maxiter: int = 5000,
) -> list[Estimate]:
    """Top-down estimates of a whole (small, in-memory) geography tree.

    The top level by NNLS (rounded by :func:`round_top` when ``integer``); then, level by
    level, the children of each parent by :func:`fit_children` from the parent's final
    estimate (its integer one when ``integer``, the children then rounded by
    :func:`round_children`). Every level adds up to its parent level cell by cell.

    Parameters
    ----------
    strategies : sequence of LinearQuery
        Each level's strategy ``A_l`` (coarsest first), all with the same columns.
    measurements : sequence of ndarray
        Each level's measurements, ``(n_units_l, m_l)``.
    parents : sequence of ndarray
        For each level but the coarsest, the index of each unit's parent in the level
        above (as for :func:`~dpdask.reconstruct.tree_consistent`).
    weights : sequence, optional
        Each level's row weights (``None``, a scalar or ``(m_l,)``).
    integer : bool
        Integer output that adds up exactly at every level.
    top : callable, optional
        ``top(A, Y, weights) -> Estimate`` for the top level; default
        :func:`~dpdask.reconstruct.nnls` with ``tol`` and ``maxiter``.
    tol, maxiter
        For :func:`fit_children` (and the default ``top``).

    Returns
    -------
    list of Estimate
        One per level: ``x`` ``(n_units_l, n)`` (``int64`` when ``integer``) and a
        report (for the finer levels: ``converged`` if every parent's fit did,
        ``iterations`` and ``residual`` the largest over parents, ``details``:
        ``parents`` fitted and ``variables``, their sum).
    """
    L = len(strategies)
    if L == 0 or len(measurements) != L or len(parents) != L - 1:
        raise ValueError("need one strategy and one measurement array per level, L - 1 parents")
    w = [None] * L if weights is None else list(weights)
    if len(w) != L:
        raise ValueError("need one weights entry per level")
    n = strategies[0].shape[1]
    if any(A.shape[1] != n for A in strategies):
        raise ValueError("every level's strategy must have the same columns")
    if top is None:

        def top(A, Y, wt):
            return nnls(A, Y, wt, tol=tol, maxiter=maxiter)

    Y0, _ = as_batch(measurements[0], strategies[0].shape[0], "level 0 measurements")
    first = top(strategies[0], Y0, w[0])
    x = np.maximum(np.asarray(first.x, dtype=float).reshape(Y0.shape[0], n), 0.0)
    out = [Estimate(round_top(x) if integer else x, first.report)]
    for lvl in range(1, L):
        Yl, _ = as_batch(measurements[lvl], strategies[lvl].shape[0], f"level {lvl} measurements")
        prev = out[-1].x
        groups = _group(parents[lvl - 1], prev.shape[0], Yl.shape[0], lvl)
        fit = children_fitter(strategies[lvl], w[lvl], tol=tol, maxiter=maxiter)
        X = np.zeros((Yl.shape[0], n), dtype=np.int64 if integer else float)
        reports = []
        for pi, ch in enumerate(groups):
            if ch.size == 0:
                continue
            est = fit(Yl[ch], prev[pi])
            X[ch] = round_children(est.x, prev[pi]) if integer else est.x
            reports.append(est.report)
        report = ConvergenceReport(
            "topdown",
            all(r.converged for r in reports),
            max((r.iterations for r in reports), default=0),
            max((r.residual for r in reports), default=0.0),
            tol,
            {"parents": len(reports), "variables": sum(r.details["variables"] for r in reports)},
        )
        out.append(Estimate(X, report))
    return out
