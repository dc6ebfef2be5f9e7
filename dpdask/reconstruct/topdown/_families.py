"""Fitting one parent's children (:func:`fit_children`, :func:`children_fitter`) and a
whole tree level by level (:func:`topdown_tree`); see :mod:`dpdask.reconstruct.topdown`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import as_batch
from dpdask.reconstruct._report import ConvergenceReport, Estimate
from dpdask.reconstruct.nnls import nnls
from dpdask.reconstruct.topdown._fitter import ChildrenFitter, SupportEstimate
from dpdask.reconstruct.topdown._rounding import KEEP_TOTALS_CELLS, round_children, round_top

__all__ = [
    "KEEP_TOTALS_CELLS",
    "ChildrenFitter",
    "SupportEstimate",
    "children_fitter",
    "fit_children",
    "round_children",
    "round_top",
    "topdown_tree",
]


def children_fitter(
    A: LinearQuery,
    weights: np.ndarray | float | None = None,
    *,
    tol: float = 1e-2,
    maxiter: int = 5000,
    gram: str = "auto",
    method: str = "auto",
    start: str = "auto",
) -> ChildrenFitter:
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
    ChildrenFitter
        ``fit(Y, parent)``: :func:`fit_children` of the children's measurements ``Y``
        ``(K, m)`` and the parent's estimate ``(n,)``. Also ``fit.from_estimates(Z,
        parent)``: the same fit from the children's (weighted) least-squares estimates
        ``Z`` ``(K, n)`` instead of their measurements (``||A x - y||_W^2 = ||A (x -
        z)||_W^2 + const``, so the fit is the same), through one product with the Gram
        instead of ``A^T W``; its ``details["objective"]`` is then ``1/2 sum_c ||W^1/2
        A (x_c - z_c)||^2``. And ``fit.on_support(parent, Y=... or Z=...)``: the same
        fit as a :class:`SupportEstimate` (the support, the children on it, the
        report), in memory ``O(K |S|)`` plus a few rows of ``n`` at a time.
    """
    return ChildrenFitter(A, weights, tol, maxiter, gram, method, start)


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
    method : {"auto", "newton", "fista", "active"}
        Projected Newton, FISTA or active-set FISTA (module notes; ``"active"`` is FISTA
        unless the Gram is a union); ``"auto"``: FISTA for a dense Gram, active-set
        FISTA for a union one, projected Newton for a Kronecker or full one.

    Returns
    -------
    Estimate
        ``x`` of shape ``(K, n)``, non-negative, zero off the parent's support, columns
        summing to ``parent`` (up to one rounding); the report (``method``
        ``"topdown-newton"``, ``"topdown-fista"`` or ``"topdown-active"``; ``details``:
        ``support`` (cells solved), ``variables``, ``gap`` (the duality gap, ``>= f(X)
        - f*``), ``objective``, ``products`` (of ``K`` rows with ``G[S, S]``, or on a
        working set), ``gram``, ``start``; projected Newton: ``inner`` (iterations of
        its inner solves, ``K`` products restricted to the free children each),
        ``fallbacks`` (projected gradient steps) and ``switched`` (FISTA finished the
        fit); FISTA: ``lipschitz``, ``restarts``; active-set FISTA: ``rounds``,
        ``pairs`` (of the last working set), ``dense_products`` (of the whole family)).

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
        raise ArgumentError(f"level {lvl}: need an integer parent index per unit ({n_children})")
    if n_children and (parent.min() < 0 or parent.max() >= n_parents):
        raise ShapeError(f"level {lvl}: parent indices must be in [0, {n_parents})")
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
        raise ArgumentError("need one strategy and one measurement array per level, L - 1 parents")
    w = [None] * L if weights is None else list(weights)
    if len(w) != L:
        raise ShapeError("need one weights entry per level")
    n = strategies[0].shape[1]
    if any(A.shape[1] != n for A in strategies):
        raise ShapeError("every level's strategy must have the same columns")
    if top is None:

        def top(A: LinearQuery, Y: np.ndarray, wt: np.ndarray | float | None) -> Estimate:
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
            X[ch] = (
                round_children(est.x, prev[pi], keep_totals=n >= KEEP_TOTALS_CELLS)
                if integer
                else est.x
            )
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
