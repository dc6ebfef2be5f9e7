"""The optimal Gaussian strategy of the matrix mechanism ("CA") and its weighted variants.

For Gaussian noise the matrix mechanism's total squared error is
``||A||_2^2 ||W A^+||_F^2`` (``||A||_2`` the largest column L2 norm), and with
``X = A^T A`` the best strategy solves the convex program (CA)::

    minimise tr(G X^+)  over X >= 0 (PSD) with diag(X) <= 1,   G = W^T D W

(``D`` = diag of query weights, identity by default). Write ``G = F F^T`` with
``F`` (``n x r``, ``r`` = rank of ``W``) of full column rank. With a multiplier
``lambda_i >= 0`` per diagonal constraint the Lagrange dual is::

    maximise g(lambda) = 2 tr(K^{1/2}) - sum(lambda),   K = F^T diag(lambda) F  (r x r)

because ``min_X tr(G X^+) + tr(diag(lambda) X) = 2 tr(K^{1/2})``, attained at
``X(lambda) = F K^{-1/2} F^T``, which has exactly the range of ``G`` and so
supports ``W``; a factor is ``A = K^{-1/4} U^T F^T`` (``K = U diag U^T``). The
gradient is ``dg/dlambda_i = X_ii - 1``: at the optimum every cell whose
multiplier is positive has ``X_ii = 1`` (a rank-deficient ``W`` may leave some
constraints slack, with ``lambda_i = 0``). We maximise ``g`` by projected Newton
with conjugate gradients (Hessian-vector products by the Daleckii-Krein formula
for the derivative of ``K^{-1/2}`` in ``K``'s eigenbasis, damped on the flat
directions of rank-deficient problems) and an Armijo search along the projection
onto ``lambda >= 0``. Every iterate carries a certificate: with
``T = tr(K^{1/2})``, the strategy scaled to sensitivity 1 has error exactly
``T max_i X_ii``, and weak duality bounds the error of every strategy from below
by ``max_c g(c lambda) = T^2 / sum(lambda)``; the solver stops when the two agree
to ``tol`` (strong duality holds: ``X = I / 2`` is strictly feasible). Cells that
no query touches get zero columns.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ConvergenceError, ConvergenceWarning, ShapeError
from dpdask.linalg import Dense, Diagonal, Identity, Sparse, aslinearquery, check_dense_size
from dpdask.strategy._tridiag import tridiagonal_ca

__all__ = [
    "CONVEX_MAX_N",
    "ConvexSolution",
    "ca_solve",
    "ca_solve_gram",
    "convex_ca",
    "wca_i",
    "wca_ii",
    "workload_gram",
]

#: Largest attribute solved densely here; prefix, all-range of any size by :mod:`._tridiag`.
CONVEX_MAX_N = 2048

# -- the convex optimum (CA) --------------------------------------------------
_EXPLICIT_GRAMS = (Dense, Sparse, Identity, Diagonal)
_GRAM_BLOCK_ELEMENTS = 4_000_000


def _query_weights(weights: Any, m: int) -> np.ndarray:
    w = np.asarray(weights, dtype=float).ravel()
    if w.shape != (m,):
        raise ShapeError(f"the workload has {m} queries but {w.size} weights were given")
    if not np.isfinite(w).all() or (w <= 0).any():
        raise ArgumentError("query weights must be finite and positive")
    return w


def workload_gram(W: Any, weights: Any = None) -> np.ndarray:
    """The dense weighted Gram matrix ``W^T diag(weights) W`` (``n x n``).

    Uses the workload's structured Gram where it has one (prefix, all-range,
    explicit matrices); otherwise applies ``W`` to blocks of identity columns, so
    the ``m x n`` matrix of a large workload is never formed whole.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload, ``m x n``.
    weights : array_like of float, optional
        A positive weight per query (default all 1).

    Returns
    -------
    ndarray
        The symmetric ``n x n`` Gram matrix.

    Raises
    ------
    dpdask.errors.ShapeError, dpdask.errors.ArgumentError
        If the weights do not match the queries or are not finite and positive.
    MemoryError
        If ``n x n`` exceeds ``dpdask.linalg.max-dense-elements``.
    """
    W = aslinearquery(W)
    m, n = W.shape
    check_dense_size(n * n, f"the {n} x {n} Gram matrix of a workload")
    if weights is None:
        G = W.gram()
        if isinstance(G, _EXPLICIT_GRAMS):
            return np.asarray(G.dense(), dtype=float)
        w = np.ones(m)
    else:
        w = _query_weights(weights, m)
    out = np.empty((n, n))
    block = max(1, _GRAM_BLOCK_ELEMENTS // max(m, n, 1))
    for start in range(0, n, block):
        stop = min(n, start + block)
        E = np.zeros((n, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        out[:, start:stop] = W.T @ (w[:, None] * (W @ E))
    return (out + out.T) / 2


@dataclass(frozen=True)
class ConvexSolution:
    """The result of :func:`ca_solve`, with its optimality certificate.

    Attributes
    ----------
    strategy : Dense
        ``A`` (``r x n``, ``r`` the rank of the workload) with largest column L2
        norm 1; ``A^T A`` is the optimal ``X``.
    error : float
        Upper bound on ``A``'s weighted total squared error at L2 sensitivity 1,
        ``sum_i w_i Var_i`` with unit-variance noise (equal to it when ``W`` has
        full column rank).
    lower_bound : float
        A lower bound, from the dual, on the error of every strategy.
    multipliers : ndarray
        The dual variables ``lambda`` (one per cell; 0 for cells no query uses).
    iterations : int
        Newton iterations taken.
    converged : bool
        Whether the relative gap reached the tolerance.
    """

    strategy: Dense
    error: float
    lower_bound: float
    multipliers: np.ndarray
    iterations: int
    converged: bool

    @property
    def gap(self) -> float:
        """The relative duality gap ``error / lower_bound - 1`` (0 at the optimum)."""
        return self.error / self.lower_bound - 1.0


class _DualPoint:
    """The dual at ``lam``: ``K = F^T diag(lam) F`` in its eigenbasis, and ``diag X(lam)``."""

    def __init__(self, F: np.ndarray, lam: np.ndarray):
        kappa, U = np.linalg.eigh(F.T @ (lam[:, None] * F))
        self.lam, self.F = lam, F
        self.ok = bool(kappa[0] > kappa[-1] * kappa.size * np.finfo(float).eps)
        if not self.ok:  # K singular: g's gradient is unbounded here
            self.g = -np.inf
            return
        self.kappa, self.U = kappa, U
        self.sk = np.sqrt(kappa)
        self.T = float(self.sk.sum())  # tr(K^{1/2}) = ||W diag(lam)^{1/2}||_*
        self.FU = F @ U
        self.H = self.FU / np.sqrt(self.sk)[None, :]  # F U K^{-1/4}: A = H^T
        self.Xd = np.einsum("ij,ij->i", self.H, self.H)  # diag X(lam) = dg/dlam + 1
        self.g = 2.0 * self.T - float(lam.sum())

    def rescale(self) -> None:
        """Scale ``lam`` by the best constant ``c`` (``max_c g(c lam)``), in place."""
        root_c = self.T / float(self.lam.sum())
        c = root_c * root_c
        self.lam = self.lam * c
        self.kappa = self.kappa * c
        self.sk = self.sk * root_c
        self.T *= root_c
        self.H = self.H / np.sqrt(root_c)
        self.Xd = self.Xd / root_c
        self.g = 2.0 * self.T - float(self.lam.sum())

    @property
    def rel_gap(self) -> float:
        """``upper / lower - 1`` (invariant under scaling ``lam``)."""
        return float(self.Xd.max()) * float(self.lam.sum()) / self.T - 1.0

    @property
    def upper(self) -> float:
        return self.T * float(self.Xd.max())

    @property
    def lower(self) -> float:
        return self.T * self.T / float(self.lam.sum())

    def kernel(self) -> np.ndarray:
        """Divided differences of ``k -> k^{-1/2}`` at the eigenvalues, negated."""
        sk = self.sk
        return np.asarray(1.0 / (sk[:, None] * sk[None, :] * (sk[:, None] + sk[None, :])))

    def neg_hess_vec(self, N: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``-H v`` with ``H`` the Hessian of ``g`` (the Jacobian of ``diag X``)."""
        # dK = F^T diag(v) F; in K's eigenbasis d(K^{-1/2}) = -U ((U^T dK U) * N) U^T
        E = self.FU.T @ (v[:, None] * self.FU)
        return np.asarray(np.einsum("ij,ij->i", self.FU @ (E * N), self.FU))

    def neg_hess_diag(self, N: np.ndarray) -> np.ndarray:
        FU2 = self.FU * self.FU
        return np.asarray(np.einsum("ij,ij->i", FU2 @ N, FU2))


def _newton_direction(
    pt: _DualPoint, grad: np.ndarray, free: np.ndarray, max_cg: int, damping: float
) -> np.ndarray:
    """Projected-Newton direction: CG on ``(-H_FF + mu P) d_F = grad_F``, scaled gradient elsewhere.

    ``-H`` is singular when ``W`` is rank-deficient (the dual then has flat
    directions), so the system is damped by ``mu`` times its diagonal ``P``.
    """
    N = pt.kernel()
    P = np.maximum(pt.neg_hess_diag(N), np.finfo(float).tiny)
    d: np.ndarray = grad / P  # the scaled gradient, kept on the bound-active coordinates
    g = np.where(free, grad, 0.0)
    gnorm = float(np.linalg.norm(g))
    if gnorm == 0:
        return d
    stop = min(0.1, np.sqrt(gnorm)) * gnorm
    x = np.zeros_like(g)
    res = g.copy()
    z = res / P
    p = z.copy()
    rz = float(res @ z)
    for _ in range(max_cg):
        Ap = np.where(free, pt.neg_hess_vec(N, p) + damping * P * p, 0.0)
        curv = float(p @ Ap)
        if curv <= 0:
            break
        a = rz / curv
        x += a * p
        res -= a * Ap
        if np.linalg.norm(res) <= stop:
            break
        z = res / P
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    if x.any():
        d[free] = x[free]
    return d


def _solve_gram(G: np.ndarray, tol: float, max_iter: int, max_cg: int) -> ConvexSolution:
    n = G.shape[0]
    if not np.isfinite(G).all():
        raise ArgumentError("the workload's Gram matrix has non-finite entries")
    ev, V = np.linalg.eigh(G)
    keep = ev > max(ev[-1], 0.0) * n * np.finfo(float).eps
    if not keep.any():
        raise ArgumentError("the workload has no nonzero query: there is nothing to measure")
    F = V[:, keep] * np.sqrt(ev[keep])[None, :]  # G = F F^T, F of full column rank

    pt = _DualPoint(F, np.maximum(np.einsum("ij,ij->i", F, F), 0.0))  # exact for diagonal G
    if not pt.ok:
        pt = _DualPoint(F, np.ones(n))
    converged, it = False, 0
    for it in range(max_iter + 1):
        pt.rescale()
        if pt.rel_gap <= tol:
            converged = True
            break
        if it == max_iter:
            break
        lam, grad = pt.lam, pt.Xd - 1.0
        # coordinates at their bound lam = 0 that the gradient pushes further out
        eps = min(1e-3 * float(lam.mean()), float(np.linalg.norm(lam - np.maximum(lam + grad, 0))))
        free = ~((lam <= eps) & (grad < 0))
        d = _newton_direction(pt, grad, free, max_cg, min(0.1, pt.rel_gap))
        step = 1.0
        ascended = False
        while True:
            new_lam = np.maximum(lam + step * d, 0.0)
            trial = _DualPoint(F, new_lam)
            if trial.ok:
                # Armijo along the projection arc; near the optimum g is flat to
                # rounding, so a halved certified gap also counts as progress
                ascent = float(grad[free] @ (new_lam - lam)[free])
                ascent += float(grad[~free] @ (new_lam - lam)[~free])
                if trial.g >= pt.g + 1e-4 * ascent or trial.rel_gap < 0.5 * pt.rel_gap:
                    ascended = True
                    break
            step *= 0.5
            if step < 1e-10:
                break
        if not ascended:  # no ascent left in floating point
            break
        pt = trial

    scale = float(pt.Xd.max())
    return ConvexSolution(
        strategy=Dense(pt.H.T / np.sqrt(scale)),
        error=pt.upper,
        lower_bound=pt.lower,
        multipliers=pt.lam,
        iterations=it,
        converged=converged,
    )


def ca_solve(
    W: Any,
    weights: Any = None,
    *,
    tol: float = 1e-7,
    max_iter: int = 100,
    max_cg: int = 100,
) -> ConvexSolution:
    """Solve CA, the optimal Gaussian matrix mechanism, with an optimality certificate.

    Minimises ``sum_i w_i Var_i``, the weighted total squared error of the
    workload answers at L2 sensitivity 1, over all strategies; see the module
    docstring for the dual Newton method and its certificate. Costs
    ``O(n^3)`` per iteration (dense ``n x n`` eigendecompositions); meant for
    domains up to a few thousand cells. Unweighted prefix and all-range workloads
    beyond 2048 cells are solved in ``O(n^2)`` by :mod:`._tridiag` (same certificate).

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload, ``m x n``.
    weights : array_like of float, optional
        A positive weight per query (default all 1).
    tol : float
        Relative duality gap at which to stop.
    max_iter : int
        Most Newton iterations; stopping there before ``tol`` emits a
        :class:`~dpdask.errors.ConvergenceWarning` (``converged`` is then False).
    max_cg : int
        Most conjugate-gradient steps per Newton iteration.

    Returns
    -------
    ConvexSolution
        The strategy, its error, the dual lower bound and convergence information.

    Raises
    ------
    dpdask.errors.ShapeError, dpdask.errors.ArgumentError
        If the weights are invalid or the workload is zero.
    MemoryError
        If the ``n x n`` Gram matrix exceeds ``dpdask.linalg.max-dense-elements``.

    Examples
    --------
    >>> sol = ca_solve(np.eye(3))
    >>> round(sol.error, 6), sol.converged
    (3.0, True)
    """
    sol = _ca(W, weights, tol=tol, max_iter=max_iter, max_cg=max_cg)
    _warn_at_limit(sol, max_iter)
    return sol


def _ca(
    W: Any, weights: Any = None, *, tol: float = 1e-7, max_iter: int = 100, max_cg: int = 100
) -> ConvexSolution:
    """:func:`ca_solve` without the warning (for :func:`convex_ca`, which raises instead)."""
    if not (tol > 0):
        raise ArgumentError(f"tol must be positive, got {tol!r}")
    big = CONVEX_MAX_N + 1  # prefix and all-range beyond the dense solver's sizes
    fast = None if weights is not None else tridiagonal_ca(W, tol=tol, max_iter=max_iter, min_n=big)
    if fast is not None:
        return fast
    return _solve_gram(workload_gram(W, weights), float(tol), int(max_iter), int(max_cg))


def _warn_at_limit(sol: ConvexSolution, max_iter: int) -> None:
    """A :class:`~dpdask.errors.ConvergenceWarning`, to the solver's caller, when CA
    stopped at ``max_iter`` Newton iterations before its tolerance."""
    if not sol.converged and sol.iterations >= max_iter:
        warnings.warn(
            f"CA stopped at its iteration limit ({max_iter}) with relative duality gap "
            f"{sol.gap:.3g}",
            ConvergenceWarning,
            stacklevel=3,
        )


def ca_solve_gram(
    G: np.ndarray, *, tol: float = 1e-7, max_iter: int = 100, max_cg: int = 100
) -> ConvexSolution:
    """:func:`ca_solve` on a workload's dense Gram matrix ``G = W^T D W`` (``n x n``).

    Parameters
    ----------
    G : ndarray
        The symmetric positive semi-definite Gram matrix.
    tol, max_iter, max_cg
        As in :func:`ca_solve`.

    Returns
    -------
    ConvexSolution
    """
    if not (tol > 0):
        raise ArgumentError(f"tol must be positive, got {tol!r}")
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ShapeError(f"G must be a square matrix, got shape {G.shape}")
    sol = _solve_gram((G + G.T) / 2, float(tol), int(max_iter), int(max_cg))
    _warn_at_limit(sol, max_iter)
    return sol


def convex_ca(W: Any, weights: Any = None, **options: Any) -> Dense:
    """The CA strategy of Yuan et al. (2016): the optimal Gaussian strategy for ``W``.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    weights : array_like of float, optional
        A positive weight per query: minimise ``sum_i w_i Var_i``.
    **options
        ``tol``, ``max_iter``, ``max_cg`` of :func:`ca_solve`.

    Returns
    -------
    Dense
        ``A`` with ``A^T A`` optimal and largest column L2 norm 1.

    Raises
    ------
    ConvergenceError
        If the solver did not reach its tolerance (a :class:`RuntimeError`).
    """
    sol = _ca(W, weights, **options)
    if not sol.converged:
        raise ConvergenceError(
            f"CA did not converge: relative duality gap {sol.gap:.3g} after "
            f"{sol.iterations} iterations"
        )
    return sol.strategy


def _targets(W: Any, targets: Any) -> np.ndarray:
    m = aslinearquery(W).shape[0]
    c = np.asarray(targets, dtype=float).ravel()
    if c.size == 1:
        c = np.full(m, float(c[0]))
    if c.shape != (m,):
        raise ShapeError(f"the workload has {m} queries but {c.size} variance targets")
    if not np.isfinite(c).all() or (c <= 0).any():
        raise ArgumentError("variance targets must be finite and positive")
    return c


def wca_i(W: Any, targets: Any, **options: Any) -> Dense:
    """wCA-I of paper 000: CA weighting each query by the inverse of its target variance.

    "Weighting a query" in a sum-of-squared-errors objective multiplies its
    variance: wCA-I minimises ``sum_i Var_i / c_i`` (``w_i = 1 / c_i``), i.e. CA
    on the workload with row ``i`` scaled by ``1 / sqrt(c_i)``. The strategy is
    then used for the unscaled workload.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    targets : array_like of float
        The variance target ``c_i > 0`` of each query (or one for all).
    **options
        Passed to :func:`ca_solve`.

    Returns
    -------
    Dense
    """
    return convex_ca(W, 1.0 / _targets(W, targets), **options)


def wca_ii(W: Any, targets: Any, **options: Any) -> Dense:
    """wCA-II of paper 000: CA weighting each query by ``1 / sqrt(target)``.

    Minimises ``sum_i Var_i / sqrt(c_i)``; see :func:`wca_i`.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    targets : array_like of float
        The variance target ``c_i > 0`` of each query (or one for all).
    **options
        Passed to :func:`ca_solve`.

    Returns
    -------
    Dense
    """
    return convex_ca(W, 1.0 / np.sqrt(_targets(W, targets)), **options)
