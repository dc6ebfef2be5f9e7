"""Least-squares reconstruction on implicit operators.

Given noisy measurements ``y = A x + noise`` the least-squares estimate is
``x_hat = A^+ y``. For a Kronecker strategy the pseudo-inverse is applied factor
by factor; for a union of products (or any operator without a structured
pseudo-inverse) the normal equations ``A^T W A x = A^T W y`` are solved by
conjugate gradients on the implicit operator, all geographies of a batch at once,
preconditioned by the diagonal of ``A^T W A`` (the squared column norms, which
the operators compute from their structure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import Diagonal, Identity, Kron, LinearQuery, Scaled
from dpdask.reconstruct._inputs import row_weighted
from dpdask.reconstruct._report import ConvergenceReport, Estimate, warn_at_limit

__all__ = ["batched_cg", "least_squares"]


def _cheap_pinv(A: LinearQuery) -> bool:
    if isinstance(A, Identity | Diagonal):
        return True
    if isinstance(A, Scaled):
        return _cheap_pinv(A.A)
    if isinstance(A, Kron):
        return all(_cheap_pinv(f) or f.size <= 4_000_000 for f in A.factors)
    return A.size <= 4_000_000


def batched_cg(
    matvec: Callable[[np.ndarray], np.ndarray],
    B: np.ndarray,
    *,
    precond: np.ndarray | None = None,
    tol: float = 1e-10,
    maxiter: int = 1000,
) -> tuple[np.ndarray, ConvergenceReport]:
    """Conjugate gradients for ``G X = B`` with ``G`` symmetric positive semi-definite.

    Solves every column of ``B`` (shape ``(n, k)``) at once; ``matvec`` maps an
    ``(n, k)`` array to ``G`` times it. ``precond`` is the diagonal of a Jacobi
    preconditioner (entries > 0). Started from zero, the iterates stay in the range
    of ``G``, so a consistent singular system converges to the minimum-norm solution.
    The stopping rule is ``||B - G X|| <= tol ||B||`` per column.
    """
    n, k = B.shape
    X = np.zeros((n, k))
    R = B.astype(float, copy=True)
    bnorm = np.linalg.norm(R, axis=0)
    done = bnorm == 0
    Minv = None if precond is None else (1.0 / precond)[:, None]
    Z = R if Minv is None else Minv * R
    P = Z.copy()
    rz = np.einsum("ij,ij->j", R, Z)
    rel = np.zeros(k)
    it = 0
    for it in range(1, maxiter + 1):  # noqa: B007  (it is reported)
        Q = matvec(P)
        pq = np.einsum("ij,ij->j", P, Q)
        alpha = np.divide(rz, pq, out=np.zeros(k), where=(pq > 0) & ~done)
        X += alpha * P
        R -= alpha * Q
        rel = np.divide(np.linalg.norm(R, axis=0), bnorm, out=np.zeros(k), where=bnorm > 0)
        done |= rel <= tol
        if done.all():
            break
        Z = R if Minv is None else Minv * R
        rz_new = np.einsum("ij,ij->j", R, Z)
        beta = np.divide(rz_new, rz, out=np.zeros(k), where=rz > 0)
        P = Z + beta * P
        rz = rz_new
    report = ConvergenceReport(
        method="cg",
        converged=bool(done.all()),
        iterations=it,
        residual=float(rel.max(initial=0.0)),
        tolerance=tol,
    )
    return X, report


def least_squares(
    A: LinearQuery,
    y: np.ndarray,
    weights: np.ndarray | float | None = None,
    *,
    method: str = "auto",
    tol: float = 1e-10,
    maxiter: int = 1000,
) -> Estimate:
    """The (weighted) least-squares estimate ``argmin_x sum_i w_i (A x - y)_i^2``.

    Parameters
    ----------
    A : LinearQuery
        The strategy, ``m x n``.
    y : ndarray
        Measurements, shape ``(m,)``, or ``(g, m)`` for ``g`` geographies.
    weights : ndarray or float, optional
        Per-row weights, usually ``1 / variance`` of each measurement (for parts of
        a union or levels measured with different noise).
    method : {"auto", "pinv", "cg"}
        ``"pinv"`` applies the (factor-wise) pseudo-inverse; ``"cg"`` solves the
        normal equations by conjugate gradients; ``"auto"`` takes the pseudo-inverse
        where it is structured (Kronecker products of small factors) and CG otherwise.
    tol, maxiter : float, int
        CG stopping rule (relative residual of the normal equations) and limit; CG
        stopping at the limit before ``tol`` emits a
        :class:`~dpdask.errors.ConvergenceWarning`.

    Returns
    -------
    Estimate
        ``x`` of shape ``(n,)`` or ``(g, n)``, and the convergence report. The
        minimum-norm solution when ``A`` does not have full column rank.

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask.linalg import Identity, Kron, Total, VStack
    >>> A = VStack([Identity(3), Total(3)])
    >>> x, report = least_squares(A, A @ np.array([1.0, 2.0, 3.0]))
    >>> np.round(x, 8).tolist(), report.converged
    ([1.0, 2.0, 3.0], True)
    """
    y = np.asarray(y, dtype=float)
    single = y.ndim == 1
    Y = y[None, :] if single else y
    if Y.ndim != 2 or Y.shape[1] != A.shape[0]:
        raise ShapeError(f"measurements have shape {y.shape}; the strategy has {A.shape[0]} rows")
    if not np.isfinite(Y).all():
        raise ShapeError("measurements contain NaN or infinite values")
    Aw = row_weighted(A, weights)
    Yw = Y if weights is None else Y * np.sqrt(np.broadcast_to(weights, (A.shape[0],)))
    if method == "auto":
        method = "pinv" if _cheap_pinv(Aw) else "cg"
    if method == "pinv":
        X = Aw.pinv().apply(Yw)
        report = ConvergenceReport(method="pinv", converged=True)
    elif method == "cg":
        G = Aw.gram()
        diag = Aw.column_norms(2) ** 2
        precond = np.where(diag > 0, diag, 1.0)
        Xt, report = batched_cg(
            G._matmat, Aw.T._matmat(Yw.T), precond=precond, tol=tol, maxiter=maxiter
        )
        X = Xt.T
    else:
        raise ArgumentError(f"unknown least-squares method {method!r}; use 'auto', 'pinv' or 'cg'")
    warn_at_limit(report, maxiter)
    return Estimate(X[0] if single else X, report)
