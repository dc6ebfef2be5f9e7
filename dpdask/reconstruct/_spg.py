"""The spectral projected gradient method for a convex quadratic over ``x >= 0``.

NNLS's ``method="spg"`` (Birgin, Martinez and Raydan, 2000), on the Jacobi-scaled
problem: a step ``d = P(x - alpha g) - x`` with the Barzilai-Borwein step
length ``alpha``, accepted by a non-monotone Armijo test against the largest of the last
few objective values. Because ``f`` is quadratic the objective along ``d`` is known
exactly once ``G d`` is computed, so a rejected step is replaced by the exact minimiser
along ``d`` without another product: one application of ``G`` per iteration. It starts
from the clipped least-squares estimate. All right-hand sides of a batch (geographies)
are solved together, each with its own step lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpdask.reconstruct._report import ConvergenceReport

__all__ = ["spg_quadratic"]

_MEMORY = 10  # objective values remembered by the non-monotone test
_GAMMA = 1e-4  # sufficient-decrease constant
_REFRESH = 50  # recompute G x from scratch every this many iterations


def spg_quadratic(
    gmv: Callable[[np.ndarray], np.ndarray],
    C: np.ndarray,
    X0: np.ndarray,
    *,
    tol: float,
    maxiter: int,
) -> tuple[np.ndarray, ConvergenceReport]:
    """Minimise ``1/2 x^T G x - c^T x`` over ``x >= 0`` for every column of ``C``.

    ``gmv`` maps an ``(n, k)`` array to ``G`` times it; ``C`` and ``X0`` are ``(n, k)``.
    """
    X = np.maximum(X0, 0.0)
    GX = gmv(X)
    Gr = GX - C  # the gradient
    f = 0.5 * np.einsum("ij,ij->j", X, Gr - C)
    root_n = np.sqrt(C.shape[0])
    history = np.tile(f, (_MEMORY, 1))
    PG = X - np.maximum(X - Gr, 0.0)
    rel = np.linalg.norm(PG, axis=0) / root_n  # root-mean-square projected gradient
    done = rel <= tol
    pg_inf = np.abs(PG).max(axis=0, initial=0.0)
    alpha = np.where(pg_inf > 0, 1.0 / np.maximum(pg_inf, 1e-300), 1.0)
    alpha = np.clip(alpha, 1e-10, 1e10)
    it = 0
    rejected = 0
    for it in range(1, maxiter + 1):
        if done.all():
            it -= 1
            break
        # the columns still iterating: a view while all are, else a gathered copy
        act = slice(None) if not done.any() else np.flatnonzero(~done)
        Xa, Ga, Ca = X[:, act], Gr[:, act], C[:, act]
        D = np.maximum(Xa - alpha[act] * Ga, 0.0)
        D -= Xa
        GD = gmv(D)
        gd = np.einsum("ij,ij->j", Ga, D)
        dGd = np.einsum("ij,ij->j", D, GD)
        # non-monotone Armijo test at the full step; else the exact minimiser along D
        f_full = f[act] + gd + 0.5 * dGd
        ok = f_full <= history[:, act].max(axis=0) + _GAMMA * gd
        lam = np.where(ok | (dGd <= 0), 1.0, np.minimum(1.0, -gd / np.where(dGd > 0, dGd, 1.0)))
        rejected += int((~ok).sum())
        Xa = Xa + lam * D
        GXa = GX[:, act] + lam * GD
        if it % _REFRESH == 0:
            GXa = gmv(Xa)
        Ga = GXa - Ca
        X[:, act], GX[:, act], Gr[:, act] = Xa, GXa, Ga
        f[act] = 0.5 * np.einsum("ij,ij->j", Xa, Ga - Ca)
        history[it % _MEMORY, act] = f[act]
        # Barzilai-Borwein step: s = lam D, y = lam G D
        ss = np.einsum("ij,ij->j", D, D)
        alpha[act] = np.where(dGd > 0, np.clip(ss / np.where(dGd > 0, dGd, 1.0), 1e-10, 1e10), 1e10)
        PGa = Xa - np.maximum(Xa - Ga, 0.0)
        rel[act] = np.linalg.norm(PGa, axis=0) / root_n
        done[act] = rel[act] <= tol
    report = ConvergenceReport(
        method="spg",
        converged=bool(done.all()),
        iterations=it,
        residual=float(rel.max(initial=0.0)),
        tolerance=tol,
        details={"rejected_steps": rejected},
    )
    return X, report
