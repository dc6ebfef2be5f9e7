"""Active-set FISTA for the children's fit on a union Gram: few pairs, cheap iterations.

The problem (:mod:`dpdask.reconstruct.topdown`) has ``K x |S|`` variables, ``U >= 0``
with each cell's children summing to ``t_j``, but at its solution only a few children
of each cell are positive (on the CPH domain about 5-10% of the pairs: a cell of a
county's support is shared by a few of its tracts). Each *round*:

1. The whole family's gradient, exactly (one float64 product read at every pair), and
   its KKT residual: the fit stops when it is at most ``tol`` (the stopping rule of
   the other methods, on the same variables).
2. The working set becomes the positive pairs, each cell's largest child, and the
   pairs at zero whose reduced gradient ``grad_cj - nu_j`` (``nu_j`` the mean gradient
   of the cell's positive children) is below minus a threshold: the most violating
   ones, so that the violations left fill at most half of the stopping rule's budget
   (:func:`dpdask.reconstruct._newton._freeing_threshold`).
3. FISTA (as :mod:`dpdask.reconstruct.topdown._fista`, with adaptive restart) on the
   working set only, every other pair held at zero: the products with ``H`` child by
   child through the parts' marginals over the working set's pairs
   (:class:`~dpdask.reconstruct.topdown._working_gram.WorkingGram`), the projection onto
   the cells' simplices over its pairs
   (:func:`~dpdask.reconstruct.topdown._working_gram.segment_project`).
   Products are float32 on the difference from a reference point whose product is
   exact (float64; refreshed every :data:`REFRESH` iterations and each round), so
   their rounding shrinks with the steps. The round ends once the working set's own
   KKT residual (its norm, against the stopping rule's ``tol sqrt(K |S|)``) is at
   most :data:`THETA` times the whole family's at the round's start, or
   :data:`ETA` ``x tol``: early rounds are inexact, since the working set changes
   between them.

The certificate is that of the whole problem: the KKT residual and the duality gap from
the exact gradient of step 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpdask.reconstruct._newton import _freeing_threshold
from dpdask.reconstruct.topdown._fista import L_MARGIN, project
from dpdask.reconstruct.topdown._working_gram import (
    WorkingGram,
    WorkingSet,
    segment_project,
    segment_thresholds,
)

__all__ = ["active_fista"]

ETA = 0.8  # the working set's KKT budget, a fraction of tol
THETA = 0.35  # each round's target: this fraction of the residual it starts from
REFRESH = 40  # exact reference products every this many FISTA iterations
ROUNDS = 50  # working-set rounds at most
_POWER = 30
POWER_RTOL = 2e-2  # (an estimate from below is raised by the steps' curvature)


def _kkt(ws: WorkingSet, u: np.ndarray, R: np.ndarray, t: np.ndarray) -> float:
    """The whole family's KKT residual ``||U - P(U - R)|| / sqrt(K |S|)`` (``R`` the
    gradient ``(K, |S|)``, ``U`` zero off the working set, ``u`` on it). A pair off the
    working set (``U = 0``) counts only if ``-R`` exceeds its cell's threshold over the
    working set's pairs (which the whole column's can only exceed): such cells are
    projected whole, the others through the working set."""
    v = u - R[ws.ch, ws.cell]
    tau = segment_thresholds(v, ws, t)
    inside = np.zeros(R.shape, dtype=bool)
    inside[ws.ch, ws.cell] = True
    over = np.flatnonzero(((-R > tau) & ~inside).any(axis=0))
    d = u - np.maximum(v - tau[ws.cell], 0.0)
    keep = ~np.isin(ws.cell, over)
    total = float(np.dot(d[keep], d[keep]))
    if over.size:
        U = np.zeros((R.shape[0], over.size))
        mine = ~keep
        U[ws.ch[mine], np.searchsorted(over, ws.cell[mine])] = u[mine]
        W = U - project(U - R[:, over], t[over])
        total += float(np.vdot(W, W))
    return float(np.sqrt(total / R.size))


class _Products:
    """``H v`` on a working set: float32 products of ``v - ref`` plus ``H ref`` exact."""

    def __init__(self, gram: WorkingGram, ws: WorkingSet, counts: dict[str, Any]):
        self.gram, self.ws, self.counts = gram, ws, counts
        self.ref: np.ndarray | None = None
        self.Href: np.ndarray | None = None

    def exact(self, v: np.ndarray) -> np.ndarray:
        self.counts["exact"] += 1
        self.ref, self.Href = v.copy(), self.gram.rows(self.ws, v, exact=True)
        return self.Href.copy()

    def __call__(self, v: np.ndarray) -> np.ndarray:
        self.counts["products"] += 1
        if self.ref is None or self.Href is None:
            return self.exact(v)
        Hv: np.ndarray = self.Href + self.gram.rows(self.ws, v - self.ref)
        return Hv


def _lipschitz(prod: _Products, n: int) -> tuple[float, int]:
    """The largest eigenvalue of ``H`` on the working set (power iteration, float32)."""
    v = np.full(n, 1.0 / np.sqrt(n))
    lam = 0.0
    for it in range(1, _POWER + 1):
        w = prod.gram.rows(prod.ws, v)
        new = float(np.linalg.norm(w))
        if new == 0.0:
            return 1.0, it
        v = w / new
        if abs(new - lam) <= POWER_RTOL * new:
            return new, it
        lam = new
    return lam, _POWER


def _fista(
    prod: _Products, c: np.ndarray, t: np.ndarray, u: np.ndarray, L: float, target: float,
    maxiter: int,
) -> tuple[np.ndarray, np.ndarray, int, float]:  # fmt: skip
    """FISTA on the working set to ``||u - P(u - grad)|| <= target``; returns ``u``,
    its exact-referenced product, the iterations and the residual norm."""
    ws = prod.ws
    gu = prod.exact(u)
    y, gy, theta = u, gu, 1.0
    res = float(np.linalg.norm(u - segment_project(u - (gu - c), ws, t)))
    it = 0
    while it < maxiter and res > target:
        it += 1
        un = segment_project(y - (gy - c) / L, ws, t)
        if it % REFRESH == 0:
            gun = prod.exact(un)
        else:
            gun = prod(un)
        D = un - y
        dd = float(np.dot(D, D))
        restart = False
        if dd > 0.0:
            curv = float(np.dot(D, gun - gy)) / dd
            if curv > L:
                L, restart = L_MARGIN * curv, True
        if it % 4 == 0 or it == maxiter:
            P = segment_project(un - (gun - c), ws, t)
            res = float(np.linalg.norm(un - P))
        step = un - u
        if restart or float(np.dot(D, step)) < 0.0:
            theta, y, gy = 1.0, un, gun
        else:
            theta_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
            beta = (theta - 1.0) / theta_new
            y = un + beta * step
            gy = gun + beta * (gun - gu)
            theta = theta_new
        u, gu = un, gun
    return u, gu, it, res


def _grow(U: np.ndarray, G: np.ndarray, t: np.ndarray, tol: float) -> tuple[np.ndarray, int]:
    """The next working set (a ``(K, |S|)`` mask, module notes) and the pairs added."""
    S = U.shape[1]
    cols = np.arange(S)
    pos = U > 0
    top = np.argmax(U, axis=0)
    pos[top, cols] = True
    nu = np.where(pos, G, 0.0).sum(axis=0) / pos.sum(axis=0)
    red = G - nu
    cand = ~pos & (red < 0)
    gz = red[cand]
    budget = U.size * tol * tol
    rms = float(np.sqrt(np.dot(gz, gz) / U.size))
    threshold = _freeing_threshold(gz, np.ones(gz.size, bool), 2.0 * rms, budget)
    add = cand & (red <= -threshold)
    if not add.any() and cand.any():  # at least the worst violations
        add = cand & (red <= np.quantile(gz, 0.1))
    return pos | add, int(add.sum())


def active_fista(
    gram: WorkingGram, C: np.ndarray, t: np.ndarray, U0: np.ndarray, tol: float, maxiter: int
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Active-set FISTA from the feasible ``U0`` ``(K, |S|)`` (module notes).

    Returns the iterate ``(K, |S|)``, the exact ``U H`` there and counters
    (``iterations`` of FISTA in all, ``residual`` the whole family's KKT residual,
    ``rounds``, ``products`` and ``exact`` products on working sets, ``dense``
    products, ``pairs`` of the last working set).
    """
    K, S = C.shape
    counts: dict[str, Any] = {"products": 0, "exact": 0, "dense": 0, "power": 0}
    mask = U0 > 0
    mask[np.argmax(U0, axis=0), np.arange(S)] = True
    U = U0
    it = rounds = 0
    final = ETA * tol * np.sqrt(K * S)
    cell, ch = np.nonzero(mask.T)
    ws = gram.working_set(ch, cell)
    u = segment_project(U[ch, cell], ws, t)
    while True:
        U = np.zeros((K, S))
        U[ch, cell] = u
        G = gram.dense(ws, u)  # exact
        counts["dense"] += 1
        res = _kkt(ws, u, G - C, t)
        counts.setdefault("round_residuals", []).append(res)
        if res <= tol or it >= maxiter or rounds >= ROUNDS:
            break
        rounds += 1
        mask, _ = _grow(U, G - C, t, tol)
        cell, ch = np.nonzero(mask.T)
        ws = gram.working_set(ch, cell)
        prod = _Products(gram, ws, counts)
        L, power = _lipschitz(prod, ws.size)
        counts["power"] += power
        # each round reduces the residual by THETA at least (inexact rounds: the working
        # set changes between them), the last to the final target
        target = max(final, THETA * res * np.sqrt(K * S))
        u, _, used, _ = _fista(
            prod, C[ch, cell], t, U[ch, cell], L * L_MARGIN, target, maxiter - it
        )
        it += used
        counts.setdefault("round_iterations", []).append(used)
        counts.setdefault("round_pairs", []).append(int(ws.size))
    info: dict[str, Any] = {"iterations": it, "residual": res, "rounds": rounds}
    info["pairs"] = int(ws.size)
    info.update(counts)
    return U, G, info
