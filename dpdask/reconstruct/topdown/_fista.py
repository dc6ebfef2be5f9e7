"""Accelerated projected gradient (FISTA) for the children's fit, and the projection.

The problem, in the Jacobi-scaled variables ``U`` ``(K, |S|)`` of one parent's support,
is ``min 1/2 <U, U H> - <C, U>`` over the product of the cells' simplices ``{u >= 0,
sum_c u_cj = t_j}`` (:mod:`dpdask.reconstruct.topdown`). :func:`project` is the
Euclidean projection onto that set (Held et al., 1974: sort the children of each cell,
find the threshold), all cells at once; :func:`fista` is FISTA with gradient-based
adaptive restart (O'Donoghue and Candes, 2015), step ``1 / L`` with ``L`` from
:func:`lipschitz` (power iteration), raised whenever a step's curvature exceeds it. One
product with ``H`` per iteration: the small-problem path (a dense Gram), and the
reference the projected Newton method is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "FAST_FLOOR",
    "KKT_EVERY",
    "L_MARGIN",
    "fista",
    "lipschitz",
    "masked",
    "project",
    "project_threshold",
]

_POWER_ITERATIONS = 50
_POWER_RTOL = 1e-3
L_MARGIN = 1.02  # the step's L over the power iteration's estimate (from below)
FAST_FLOOR = 1e-3  # fast (float32) products while the KKT residual is above this
KKT_EVERY = 4  # the KKT residual (a second projection) is taken every this many iterations

RowsOp = Callable[[np.ndarray], np.ndarray]


def project_threshold(V: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column ``V[:, j]`` projected onto ``{v >= 0, sum v = t_j}`` (``t > 0``), all at
    once, and the thresholds: sort descending, ``tau_j`` from the largest ``rho`` with
    ``u_rho > (sum_{i <= rho} u_i - t_j) / rho``, then ``max(v - tau, 0)``.

    Parameters
    ----------
    V : ndarray
        ``(K, S)``, a column per cell.
    t : ndarray
        ``(S,)``, the positive column sums.

    Returns
    -------
    ndarray, ndarray
        The projection ``(K, S)`` and ``tau`` ``(S,)``.
    """
    K = V.shape[0]
    if K == 1:
        return np.broadcast_to(t, V.shape).copy(), V[0] - t
    u = np.sort(V, axis=0)[::-1]
    # the running sums minus t, a row at a time (a reduction along the short axis 0
    # of a C-ordered array is slower than K - 1 row additions)
    css = np.empty(u.shape, dtype=np.result_type(u, t))
    np.subtract(u[0], t, out=css[0])
    for i in range(1, K):
        np.add(css[i - 1], u[i], out=css[i])
    j = np.arange(1, K + 1, dtype=css.dtype)[:, None]
    # the last index where it holds (1-based; at least 1, as t > 0)
    rho = np.maximum(np.where(u * j > css, j, 0.0).max(axis=0), 1.0)
    tau = np.take_along_axis(css, (rho.astype(np.intp) - 1)[None], axis=0)[0] / rho
    return np.maximum(V - tau, 0.0), tau


def project(V: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The projection of :func:`project_threshold` alone."""
    return project_threshold(V, t)[0]


def masked(fixed: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The projection onto the cells' simplices with the pairs ``fixed`` ``(K, S)`` held
    at zero (per-child structural zeros): each cell's other children projected onto its
    simplex. A fixed pair enters the sort far below every other value, so it is never
    above the threshold; every cell must keep a child that is not fixed."""

    def proj(V: np.ndarray, t: np.ndarray) -> np.ndarray:
        low = -2.0 * (float(np.abs(V).max(initial=0.0)) + float(np.max(t, initial=0.0)) + 1.0)
        return project(np.where(fixed, low * V.shape[0], V), t)

    return proj


def lipschitz(rows: RowsOp, size: int) -> tuple[float, int]:
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


def fista(
    rows: RowsOp, C: np.ndarray, t: np.ndarray, U0: np.ndarray, GU0: np.ndarray,
    L: float, tol: float, maxiter: int, fast: RowsOp | None = None,
    proj: Callable[[np.ndarray, np.ndarray], np.ndarray] = project,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:  # fmt: skip
    """FISTA with adaptive restart on ``1/2 <U, U G~> - <C, U>`` over the product of
    simplices (module notes). Returns the last iterate, ``U G~`` there (from ``rows``),
    and counters.

    ``fast`` (e.g. float32 products) is used while the KKT residual is above
    ``max(tol, FAST_FLOOR)``; then ``U G~`` is recomputed by ``rows`` and the iteration
    goes on (momentum dropped) with ``rows``, so the stopping test is always exact. The
    residual, which costs a projection, is taken every :data:`KKT_EVERY` iterations
    (the fit may stop up to ``KKT_EVERY - 1`` iterations after it first holds).
    ``proj`` replaces :func:`project` (e.g. :func:`masked`)."""
    N = U0.size

    def kkt(U: np.ndarray, GU: np.ndarray) -> float:
        return float(np.linalg.norm(U - proj(U - (GU - C), t)) / np.sqrt(N))

    exact = fast is None or fast is rows
    prod = rows if exact or fast is None else fast
    U, GU = U0, GU0
    V, GV = U, GU
    theta, restarts, raised = 1.0, 0, 0
    res = kkt(U, GU)
    it, fresh = 0, True  # fresh: res is the residual at U
    while it < maxiter:
        if not exact and res <= max(tol, FAST_FLOOR):  # on with exact products
            exact, prod = True, rows
            GU = rows(U)
            res, fresh = kkt(U, GU), True
            V, GV, theta = U, GU, 1.0
        if res <= tol:
            break
        it += 1
        W = GV - C  # the step V - (GV - C) / L, in place
        W *= -1.0 / L
        W += V
        U_new = proj(W, t)
        GU_new = prod(U_new)
        D = U_new - V
        dd = float(np.vdot(D, D))
        restart = False
        if dd > 0.0:
            np.subtract(GU_new, GV, out=W)
            curv = float(np.vdot(D, W)) / dd
            if curv > L:  # the estimate of L was low: raise it, drop the momentum
                L, raised, restart = L_MARGIN * curv, raised + 1, True
        fresh = it % KKT_EVERY == 0
        if fresh:
            res = kkt(U_new, GU_new)
        np.subtract(U_new, U, out=W)  # the step taken
        if restart or float(np.vdot(D, W)) < 0.0:  # <V - U_new, U_new - U> > 0
            theta, restarts = 1.0, restarts + 1
            V, GV = U_new, GU_new
        else:
            theta_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
            beta = (theta - 1.0) / theta_new
            W *= beta
            V = W
            V += U_new
            GV = np.subtract(GU_new, GU)
            GV *= beta
            GV += GU_new
            theta = theta_new
        U, GU = U_new, GU_new
    if not exact:  # stopped at the limit with fast products
        GU = rows(U)
        res = kkt(U, GU)
    elif not fresh:
        res = kkt(U, GU)
    info: dict[str, Any] = {"iterations": it, "residual": res, "restarts": restarts, "lipschitz": L}
    info["lipschitz_raised"] = raised
    return U, GU, info
