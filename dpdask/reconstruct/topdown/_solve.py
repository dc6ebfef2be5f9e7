"""One family's fit on its parent's support, from the linear terms restricted to it.

:func:`solve_support` is the core every entry point of
:mod:`dpdask.reconstruct.topdown` shares: given the Jacobi-scaled linear terms ``C``
``(K, |S|)`` on the parent's support ``S`` (and, when known, the children's scaled
least-squares estimates there), it picks the start, runs projected Newton or FISTA,
and returns the children on ``S``, exactly feasible (each cell's largest child set to
the parent minus the others), with the report and its certificate (the KKT residual and
the Frank-Wolfe duality gap). Nothing here is of the domain's size unless the ADMM start
is asked for (it runs on the whole domain; ``full_C`` then gives its linear terms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError
from dpdask.reconstruct._report import ConvergenceReport, warn_at_limit
from dpdask.reconstruct.topdown._active import active_fista
from dpdask.reconstruct.topdown._fista import L_MARGIN, fista, lipschitz, masked, project
from dpdask.reconstruct.topdown._newton import simplex_newton
from dpdask.reconstruct.topdown._working_gram import WorkingGram

__all__ = ["exact_sums", "objective", "proportional", "solve_support"]


def exact_sums(X: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``X`` with each column's largest child set to ``p_j`` minus the others."""
    big = np.argmax(X, axis=0)
    cols = np.arange(X.shape[1])
    X[big, cols] = 0.0
    X[big, cols] = np.maximum(p - X.sum(axis=0), 0.0)
    return X


def proportional(W: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Each cell's ``t_j`` split in proportion to the positive parts of ``W[:, j]`` (evenly
    where none is positive)."""
    W = np.maximum(W, 0.0)
    total = W.sum(axis=0)
    share = W / np.where(total > 0, total, 1.0)
    share[:, total <= 0] = 1.0 / W.shape[0]
    split: np.ndarray = share * t
    return split


def objective(U: np.ndarray, GU: np.ndarray, C: np.ndarray) -> float:
    """``1/2 <U, U H> - <C, U>`` from ``U H``."""
    return float(0.5 * np.vdot(U, GU) - np.vdot(C, U))


class _Totals:
    """A support's Gram with each child's extra total row: ``rows(U)`` is ``U H`` plus,
    per child ``c``, ``u_c (s^T U_c) s`` (the row ``1^T x_c = s^T U_c`` in the scaled
    variables, weight ``u_c``); ``extra`` bounds what it adds to the Lipschitz constant
    (``max u_c ||s||^2``: the power iteration runs on one row, with no child's weight)."""

    def __init__(self, gram: Any, s: np.ndarray, u: np.ndarray) -> None:
        self.gram, self.s, self.u = gram, s, u
        self.extra = float(u.max(initial=0.0)) * float(s @ s)

    def _add(self, out: np.ndarray, U: np.ndarray) -> np.ndarray:
        if U.shape[0] != self.u.shape[0]:  # the power iteration's single row
            return out
        added: np.ndarray = out + ((U @ self.s) * self.u)[:, None] * self.s[None, :]
        return added

    def rows(self, U: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.gram.rows(U)
        return self._add(out, U)

    def fast_rows(self, U: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.gram.fast_rows(U)
        return self._add(out, U)


def solve_support(
    fitter: Any,
    C: np.ndarray,
    const: float,
    p: np.ndarray,
    idx: np.ndarray,
    Zs: np.ndarray | None = None,
    full_C: Callable[[], np.ndarray] | None = None,
    margins: np.ndarray | None = None,
    stacklevel: int = 5,
    fixed: np.ndarray | None = None,
    totals: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, ConvergenceReport]:
    """The children ``(K, |S|)`` on the support ``idx`` and the report.

    Parameters
    ----------
    fitter
        The level's fitter (``level``, ``method``, ``tol``, ``maxiter``, ``start``).
    C : ndarray
        ``(K, |S|)`` Jacobi-scaled linear terms on the support.
    const : float
        The objective's constant (``details["objective"]`` is ``f + const``).
    p : ndarray
        ``(n,)`` the parent's estimate (positive exactly on ``idx``).
    idx : ndarray
        The support, sorted cell indices.
    Zs : ndarray, optional
        ``(K, |S|)`` the children's scaled least-squares estimates on the support.
    full_C : callable, optional
        The whole-domain linear terms ``(K, n)``, for the ADMM start (else it is not
        taken).
    margins : ndarray, optional
        ``(K, |S|)`` the children's least-squares estimates summed into a marginal, at
        each cell's marginal cell: the ``"marginal"`` start splits each cell's parent in
        proportion to their positive parts.
    stacklevel : int
        For the warning at the iteration limit.
    fixed : ndarray, optional
        ``(K, |S|)`` bool, pairs held at zero (structural zeros), FISTA only: every
        projection keeps them at zero (:func:`~dpdask.reconstruct.topdown._fista.masked`).
    totals : tuple of ndarray, optional
        ``(v, u)``, each ``(K,)``: every child's extra row ``1^T x_c = v_c`` of weight
        ``u_c`` in the objective (the levels below's estimate of its total), FISTA only:
        a rank-one term per child in the products (:class:`_Totals`).
    """
    level, method, tol, maxiter = fitter.level, fitter.method, fitter.tol, fitter.maxiter
    K, n, S = C.shape[0], level.n, idx.size
    details: dict[str, Any] = {"children": K, "cells": n, "support": S, "variables": K * S}
    details["gram"] = level.kind
    name = f"topdown-{method}"
    proj: Callable[[np.ndarray, np.ndarray], np.ndarray] = project
    if fixed is not None:
        proj = masked(np.asarray(fixed, dtype=bool))
    if (fixed is not None or totals is not None) and method != "fista":
        raise ArgumentError("structural zeros and extra totals need the FISTA fit (a dense Gram)")
    if K == 1 or S == 0:  # the parent itself (or nothing to split)
        details.update(gap=0.0, products=0)
        x = np.broadcast_to(p[idx], (K, S)).copy()
        return x, ConvergenceReport(name, True, 0, 0.0, tol, details)
    s = level.scale[idx]
    t = p[idx] / s
    gram: Any = level.support(idx)
    if totals is not None:  # x_c = s u_c: the row is s^T u_c (module notes of _Totals)
        gram = _Totals(gram, s, np.asarray(totals[1], dtype=float))
        C = C + (totals[1] * totals[0])[:, None] * s[None, :]
        const += 0.5 * float(np.sum(totals[1] * totals[0] ** 2))
    start = fitter.start
    if start == "auto":  # FISTA: the best of the simple starts and the estimates
        start = "admm" if Zs is None else ("estimates" if method == "newton" else "simple")
    use_admm = start == "admm" and method == "newton" and level.admm is not None
    start_products = 0
    if start == "estimates" and Zs is not None:  # the least-squares fit, projected
        U0, GU0, details["start"] = proj(Zs, t), None, "estimates"
    elif use_admm and full_C is not None:
        U0, details["admm_iterations"] = level.admm(full_C(), idx, t)
        details["start"] = "admm"
        GU0 = None
    else:  # the better (in f) of the even split, one Jacobi step and the estimates
        starts = [proj(np.broadcast_to(t / K, (K, S)).copy(), t), proj(C, t)]
        names = ["even", "jacobi"]
        if Zs is not None and (fitter.start == "auto" or use_admm):
            starts.append(proj(Zs, t))
            names.append("estimates")
        if margins is not None and fitter.start == "auto" and fixed is None:
            starts.append(proportional(margins, t))
            names.append("marginal")
        active = method == "active" and level.unions
        # (active-set FISTA computes its own exact products: the choice needs no more
        # than fast ones)
        rows = gram.fast_rows if active else gram.rows
        G0 = [rows(U) for U in starts]
        b = int(np.argmin([objective(U, GU, C) for U, GU in zip(starts, G0, strict=True)]))
        U0, GU0, details["start"] = starts[b], (None if active else G0[b]), names[b]
        start_products = len(starts)
    union = level.unions.get(np.dtype(np.float64))
    if method == "active" and union is not None:
        U, GU, info = active_fista(WorkingGram(union, idx, K), C, t, U0, tol, maxiter)
        products = info["products"] + info["exact"] + info["dense"] + info["power"]
        details.update(products=products + start_products, rounds=info["rounds"])
        details.update(pairs=info["pairs"], dense_products=info["dense"])
    elif method == "newton":
        U, GU, info = simplex_newton(gram, C, t, U0, tol, maxiter)
        details.update(products=info["products"] + start_products)
        details.update(inner=info["inner"], fallbacks=info["fallbacks"], switched=False)
        if info["stalled"]:  # FISTA from where Newton stalled (module notes)
            L, power = lipschitz(gram.rows, S)
            left = maxiter - info["iterations"]
            GU = gram.rows(U)  # float64 (Newton's may hold float32 steps)
            U, GU, more = fista(gram.rows, C, t, U, GU, L * L_MARGIN, tol, left, gram.fast_rows)
            details.update(switched=True, fista_iterations=more["iterations"])
            details["products"] += more["iterations"] + power + 1
            info.update(
                iterations=info["iterations"] + more["iterations"], residual=more["residual"]
            )
    else:  # FISTA (also "active" without a union Gram)
        if GU0 is None:
            GU0, start_products = gram.rows(U0), start_products + 1
        L, power = lipschitz(gram.fast_rows, S)
        L += gram.extra if totals is not None else 0.0
        U, GU, info = fista(
            gram.rows, C, t, U0, GU0, L * L_MARGIN, tol, maxiter, gram.fast_rows, proj
        )
        details.update(products=info["iterations"] + start_products + power)
        details["power_iterations"] = power
        details.update({k: info[k] for k in ("lipschitz", "lipschitz_raised", "restarts")})
    grad = GU - C
    free = grad if fixed is None else np.where(fixed, np.inf, grad)
    gap = float(np.vdot(grad, U) - np.dot(t, free.min(axis=0)))
    details.update(objective=objective(U, GU, C) + const, gap=max(gap, 0.0))
    x = exact_sums(U * s, p[idx])
    converged = info["residual"] <= tol
    report = ConvergenceReport(name, converged, info["iterations"], info["residual"], tol, details)
    warn_at_limit(report, maxiter, stacklevel=stacklevel)
    return x, report
