"""Top-down estimation: each parent's non-negative estimate split among its children.

The ``K`` children of one parent are fitted jointly (:func:`fit_children`): with
``G = A^T W A`` and ``C = A^T W Y^T`` the level's Gram and linear terms, they solve

    minimise  f(X) = 1/2 sum_c ||W^1/2 (A x_c - y_c)||^2
    subject to  X >= 0,  sum_c X[c, j] = p_j,  X[:, j] = 0 where p_j = 0,

``p`` the parent's final estimate. Only the cells of the parent's support ``S`` are
variables: the problem is built on ``G[S, S]`` and ``C[S]``
(:mod:`dpdask.reconstruct._topdown_level`: a dense submatrix when the level's Gram is
small, a product restricted to ``S`` for a Kronecker strategy of small factors or a
union of them, whose cost grows with ``|S|`` and the union's marginals rather than the
domain, any other strategy through the whole domain), in the Jacobi-scaled variables
``u_cj = x_cj / s_j``, ``s = diag(G)^-1/2`` (one scale per cell, shared by the children,
so every cell's feasible set stays a simplex, scaled to ``t_j = p_j / s_j``).

**Algorithms.** Two, ``method="auto"`` choosing by the level's Gram:

* projected Newton on the cells' simplices (:mod:`dpdask.reconstruct._topdown_newton`):
  free and binding children per cell, a Newton direction by conjugate residuals in the
  null space of the cells' sums with products restricted to each child's free cells, a
  projected arc search. It starts from the children's least-squares estimates
  projected onto the cells' simplices when they are given (``from_estimates``), else,
  for a Kronecker strategy, from a few ADMM iterations on the whole domain that use the
  factors' eigenvectors (:mod:`dpdask.reconstruct._topdown_admm`), otherwise from the
  better of the simple starts below. The method for a Kronecker Gram (whose products
  restricted to a sparse free set are cheap) and for the ``"full"`` one. Should its
  KKT residual stop shrinking (it must halve every 20 iterations), FISTA takes over
  from its iterate (``details["switched"]``).
* accelerated projected gradient (FISTA, :mod:`dpdask.reconstruct._topdown_fista`) with
  adaptive restart, one product with ``G[S, S]`` per iteration (float32 for a union
  Gram until the KKT residual is below ``1e-3``, then float64), from the best (in
  ``f``) of the even split ``p / K``, the projection of ``s C`` (one Jacobi step from
  zero) and the projected least-squares estimates when given: the method for a dense
  Gram (a small domain such as P.L. 94's) and for a union of Kronecker products
  (HDMM's OPT_+ on the CPH domain), where each of its products costs about what one
  inner iteration of the Newton method does and it needs fewer of them.

**Stopping rule.** The KKT residual of the scaled problem, the root-mean-square
projected gradient ``||U - P(U - grad)|| / sqrt(K |S|)`` (``P`` the projection onto the
cells' simplices), is at most ``tol``: it is zero exactly at a KKT point (per cell a
multiplier ``nu_j`` with ``grad_cj >= nu_j``, with equality where ``u_cj > 0``). As in
:mod:`dpdask.reconstruct.nnls`, with inverse-variance weights its entries are in noise
units (each scaled gradient entry has variance one at the true data), so ``tol = 1e-2``
leaves a hundredth of the noise to optimise. Both methods stop on it, the Newton method
from a float64 gradient. The report also gives the Frank-Wolfe duality gap ``gap =
<grad, X> - sum_j p_j min_c grad_cj >= f(X) - f*`` (``details["gap"]``), a certificate:
then ``||W^1/2 A (X - X*)||_F^2 <= 2 gap`` for the optimum ``X*``.

The returned children are exactly feasible: after the last step each cell's sum is made
exact by setting its largest child to ``p_j`` minus the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import as_batch
from dpdask.reconstruct._report import ConvergenceReport, Estimate, warn_at_limit
from dpdask.reconstruct._topdown_fista import L_MARGIN, fista, lipschitz, project
from dpdask.reconstruct._topdown_level import Level
from dpdask.reconstruct._topdown_newton import simplex_newton
from dpdask.reconstruct._topdown_rounding import round_children, round_top
from dpdask.reconstruct.nnls import nnls

__all__ = ["children_fitter", "fit_children", "round_children", "round_top", "topdown_tree"]

_METHODS = ("auto", "newton", "fista")
_STARTS = ("auto", "admm", "estimates", "simple")


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's BLAS pools, found once (a limit on them is then cheap, ~10 us)."""
    return ThreadpoolController()


def _exact_sums(X: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``X`` with each column's largest child set to ``p_j`` minus the others."""
    big = np.argmax(X, axis=0)
    cols = np.arange(X.shape[1])
    X[big, cols] = 0.0
    X[big, cols] = np.maximum(p - X.sum(axis=0), 0.0)
    return X


class _Fitter:
    """The fits of one level (:func:`children_fitter`)."""

    def __init__(
        self, A: LinearQuery, weights, tol: float, maxiter: int, gram: str, method: str,
        start: str,
    ):  # fmt: skip
        if not tol > 0:
            raise ValueError(f"tol must be positive, got {tol}")
        if method not in _METHODS:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(_METHODS)}")
        self.level = Level(A, weights, gram)
        if method == "auto":
            method = "fista" if self.level.kind in ("dense", "union") else "newton"
        if start not in _STARTS:
            raise ValueError(f"unknown start {start!r}; use one of {', '.join(_STARTS)}")
        self.method, self.tol, self.maxiter, self.start = method, tol, maxiter, start
        m = A.shape[0]
        w = None if weights is None else np.broadcast_to(np.asarray(weights, dtype=float), (m,))
        self.root_w = None if w is None else np.sqrt(w)

    def _parent(self, parent: np.ndarray) -> np.ndarray:
        n = self.level.n
        p = np.asarray(parent, dtype=float)
        if p.shape != (n,):
            raise ValueError(f"parent has shape {p.shape}; expected ({n},)")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ValueError("the parent's estimate must be finite and non-negative")
        return p

    def __call__(self, Y: np.ndarray, parent: np.ndarray) -> Estimate:
        Yb, _ = as_batch(Y, self.level.A.shape[0], "measurements")
        p = self._parent(parent)
        # one BLAS thread: the products are small, and a second thread that is not
        # scheduled (a busy core) stalls each of them by milliseconds
        with _blas().limit(limits=1, user_api="blas"):
            Yw = Yb if self.root_w is None else Yb * self.root_w
            C = self.level.Aw.T.apply(Yw) * self.level.scale
            return _fit(self, C, 0.5 * float(np.vdot(Yw, Yw)), p)

    def from_estimates(self, Z: np.ndarray, parent: np.ndarray) -> Estimate:
        Zb, _ = as_batch(Z, self.level.n, "estimates")
        p = self._parent(parent)
        with _blas().limit(limits=1, user_api="blas"):
            Zs = Zb / self.level.scale
            C = self.level.gram_rows(Zs)
            return _fit(self, C, 0.5 * float(np.vdot(Zs, C)), p, Zs)


def children_fitter(
    A: LinearQuery,
    weights: np.ndarray | float | None = None,
    *,
    tol: float = 1e-2,
    maxiter: int = 5000,
    gram: str = "auto",
    method: str = "auto",
    start: str = "auto",
) -> Callable[[np.ndarray, np.ndarray], Estimate]:
    """:func:`fit_children` with the level's strategy and options fixed, for many parents.

    What the fits of one level share (the row-weighted operator, the Jacobi scale, the
    scaled Gram: dense for at most 2,048 cells, Kronecker factors for a Kronecker
    strategy of small factors, and their eigenvectors for the ADMM start) is computed
    once, here.

    Parameters
    ----------
    A, weights, tol, maxiter, method
        As for :func:`fit_children`.
    start : {"auto", "admm", "estimates", "simple"}
        Where the fit starts: ``"estimates"``, the children's least-squares estimates
        projected onto the cells' simplices (only for ``fit.from_estimates``, where they
        are given); ``"admm"``, the ADMM start (projected Newton on a Kronecker Gram);
        ``"simple"``, the better (in ``f``) of the even split and one Jacobi step (also
        the fallback of the other two). ``"auto"``: for projected Newton
        ``"estimates"`` when given, else ``"admm"``; for FISTA the best of the simple
        starts and the estimates when given.
    gram : {"auto", "dense", "kron", "full"}
        How ``G[S, S]`` is applied: a dense submatrix of the level's scaled Gram, a
        Kronecker product restricted to the support (for a union of Kronecker products,
        their sum restricted through the parts' marginals: ``details["gram"]`` is then
        ``"union"``), or the full structured product scattered and gathered (``"kron"``
        falls back to ``"full"`` for any other strategy). ``"auto"``: dense up to 2,048 cells, else
        Kronecker where possible.

    Returns
    -------
    callable
        ``fit(Y, parent)``: :func:`fit_children` of the children's measurements ``Y``
        ``(K, m)`` and the parent's estimate ``(n,)``. Also ``fit.from_estimates(Z,
        parent)``: the same fit from the children's (weighted) least-squares estimates
        ``Z`` ``(K, n)`` instead of their measurements (``||A x - y||_W^2 = ||A (x -
        z)||_W^2 + const``, so the fit is the same), through one product with the Gram
        instead of ``A^T W``; its ``details["objective"]`` is then ``1/2 sum_c ||W^1/2
        A (x_c - z_c)||^2``.
    """
    return _Fitter(A, weights, tol, maxiter, gram, method, start)


def _objective(U: np.ndarray, GU: np.ndarray, C: np.ndarray) -> float:
    return float(0.5 * np.vdot(U, GU) - np.vdot(C, U))


def _fit(
    fitter: _Fitter, Cfull: np.ndarray, const: float, p: np.ndarray, Zs: np.ndarray | None = None
) -> Estimate:
    level, method, tol, maxiter = fitter.level, fitter.method, fitter.tol, fitter.maxiter
    K, n = Cfull.shape[0], level.n
    idx = np.flatnonzero(p > 0)
    S = idx.size
    details: dict = {"children": K, "cells": n, "support": S, "variables": K * S}
    details["gram"] = level.kind
    X = np.zeros((K, n))
    name = f"topdown-{method}"
    if K == 1 or S == 0:  # the parent itself (or nothing to split)
        X[:, idx] = p[idx]
        details.update(gap=0.0, products=0)
        return Estimate(X, ConvergenceReport(name, True, 0, 0.0, tol, details))
    s = level.scale[idx]
    t = p[idx] / s
    C = Cfull[:, idx]
    gram = level.support(idx)
    start = fitter.start
    if start == "auto":  # FISTA: the best of the simple starts and the estimates
        start = "admm" if Zs is None else ("estimates" if method == "newton" else "simple")
    if start == "estimates" and Zs is not None:  # the least-squares fit, projected
        U0, GU0, details["start"] = project(Zs[:, idx], t), None, "estimates"
    elif start == "admm" and method == "newton" and level.admm is not None:
        U0, details["admm_iterations"] = level.admm(Cfull, idx, t)
        details["start"] = "admm"
        GU0 = None
    else:  # the better (in f) of the even split, one Jacobi step and the estimates
        starts = [np.broadcast_to(t / K, (K, S)).copy(), project(C, t)]
        if Zs is not None and fitter.start == "auto":
            starts.append(project(Zs[:, idx], t))
        G0 = [gram.rows(U) for U in starts]
        b = int(np.argmin([_objective(U, GU, C) for U, GU in zip(starts, G0, strict=True)]))
        U0, GU0, details["start"] = starts[b], G0[b], ("even", "jacobi", "estimates")[b]
    start_products = 0 if GU0 is None else len(starts)
    if GU0 is None and method == "fista":
        GU0, start_products = gram.rows(U0), 1
    if method == "newton":
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
    else:
        L, power = lipschitz(gram.fast_rows, S)
        U, GU, info = fista(gram.rows, C, t, U0, GU0, L * L_MARGIN, tol, maxiter, gram.fast_rows)
        details.update(products=info["iterations"] + start_products + power)
        details["power_iterations"] = power
        details.update({k: info[k] for k in ("lipschitz", "lipschitz_raised", "restarts")})
    grad = GU - C
    gap = float(np.vdot(grad, U) - np.dot(t, grad.min(axis=0)))
    details.update(objective=_objective(U, GU, C) + const, gap=max(gap, 0.0))
    X[:, idx] = _exact_sums(U * s, p[idx])
    converged = info["residual"] <= tol
    report = ConvergenceReport(name, converged, info["iterations"], info["residual"], tol, details)
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
    method: str = "auto",
) -> Estimate:
    """The children of one parent, fitted jointly, adding up to the parent.

    Minimises ``sum_c ||W^1/2 (A x_c - y_c)||^2`` over ``X >= 0`` with
    ``X.sum(axis=0) == parent`` and ``X[:, j] == 0`` wherever ``parent[j] == 0``; only
    the parent's support is a variable (the module notes give the algorithms and the
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
        Iterations (FISTA: one product with ``G[S, S]`` each; projected Newton: a few
        products and a few dozen restricted ones) before giving up with a
        :class:`~dpdask.errors.ConvergenceWarning`.
    gram : {"auto", "dense", "kron", "full"}
        How ``G[S, S]`` is applied (:func:`children_fitter`).
    method : {"auto", "newton", "fista"}
        Projected Newton or FISTA (module notes); ``"auto"``: FISTA for a dense or
        union Gram, projected Newton for a Kronecker or full one.

    Returns
    -------
    Estimate
        ``x`` of shape ``(K, n)``, non-negative, zero off the parent's support, columns
        summing to ``parent`` (up to one rounding); the report (``method``
        ``"topdown-newton"`` or ``"topdown-fista"``; ``details``: ``support`` (cells
        solved), ``variables``, ``gap`` (the duality gap, ``>= f(X) - f*``),
        ``objective``, ``products`` (of ``K`` rows with ``G[S, S]``), ``gram``,
        ``start``; projected Newton: ``inner`` (iterations of its inner solves, ``K``
        products restricted to the free children each), ``fallbacks`` (projected
        gradient steps) and ``switched`` (FISTA finished the fit); FISTA:
        ``lipschitz``, ``restarts``).

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
    fit = children_fitter(A, weights, tol=tol, maxiter=maxiter, gram=gram, method=method)
    return fit(Y, parent)


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
