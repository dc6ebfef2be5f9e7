"""The x-update of ADMM's matrix-mechanism form: ``(A^T A + I + E^T E)^-1``, factored once.

The system is the same at every iteration, so it is factored before the first:

* ``n`` up to :data:`_DENSE_N`: a dense Cholesky factor of ``A^T A + I (+ E^T E)``;
* a Kronecker strategy (or a scaled identity or diagonal): the eigendecomposition of
  every factor's Gram matrix, ``(A^T A + I)^-1 = Q diag(1 / (lambda + 1)) Q^T`` with
  ``Q`` the Kronecker product of the factors' eigenvectors, with up to
  :data:`_WOODBURY_P` equality constraints ``E`` added by the Woodbury identity (a
  ``p x p`` Cholesky factor, ``p`` the number of constraints);
* otherwise: conjugate gradients on the implicit system, warm-started from the
  previous iterate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

from dpdask.linalg import Dense, Diagonal, Identity, Kron, LinearQuery, Scaled, kron_vector
from dpdask.reconstruct.least_squares import batched_cg

__all__ = ["XSolver", "x_solver"]

_DENSE_N = 2048  # largest n factored as one dense matrix
_FACTOR_N = 3000  # largest Kronecker factor eigendecomposed
_WOODBURY_P = 4000  # most equality constraints handled by the Woodbury identity


def _kron_eigen(A: LinearQuery) -> tuple[LinearQuery, np.ndarray] | None:
    """``(Q, lam)`` with ``A^T A = Q diag(lam) Q^T``, from the Kronecker structure, or None."""
    c = 1.0
    while isinstance(A, Scaled):
        c *= A.c
        A = A.A
    if isinstance(A, Identity):
        return A, np.full(A.n, c * c)
    if isinstance(A, Diagonal):
        return Identity(A.shape[0]), (c * A.d) ** 2
    factors = A.factors if isinstance(A, Kron) else [A]
    Qs: list[LinearQuery] = []
    lams: list[np.ndarray] = []
    for f in factors:
        if isinstance(f, Identity):
            Qs.append(f)
            lams.append(np.ones(f.n))
            continue
        if f.shape[1] > _FACTOR_N:
            return None
        try:
            G = f.gram().dense()
        except (MemoryError, NotImplementedError):
            return None
        w, vectors = np.linalg.eigh(G)
        Qs.append(Dense(vectors))
        lams.append(np.maximum(w, 0.0))
    lam = kron_vector(lams)
    Q = Kron(Qs) if isinstance(A, Kron) else Qs[0]
    return Q, c * c * lam


@dataclass
class XSolver:
    """Applies ``(A^T A + I + E^T E)^-1`` to the columns of an ``(n, k)`` array."""

    kind: str
    solve: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    inner_iterations: list[int]


def x_solver(A: LinearQuery, E: LinearQuery | None) -> XSolver:
    n = A.shape[1]
    inner: list[int] = []
    if n <= _DENSE_N:
        G = A.gram().dense() + np.eye(n)
        if E is not None:
            G += E.gram().dense()
        cf = sla.cho_factor(G)
        return XSolver("cholesky", lambda R, X: sla.cho_solve(cf, R), inner)
    eig = _kron_eigen(A)
    if eig is not None:
        Q, lam = eig
        inv = (1.0 / (lam + 1.0))[:, None]

        def base(R: np.ndarray) -> np.ndarray:
            return Q._matmat(inv * Q._rmatmat(R))

        if E is None:
            return XSolver("kron-eigen", lambda R, X: base(R), inner)
        if E.shape[0] <= _WOODBURY_P:
            return _woodbury(base, E, inner)
    # conjugate gradients on the implicit system, warm-started at the previous x
    gram = A.gram()
    Egram = E.gram() if E is not None else None
    diag = A.column_norms(2) ** 2 + 1.0
    if E is not None:
        diag = diag + E.column_norms(2) ** 2

    def matvec(X: np.ndarray) -> np.ndarray:
        out: np.ndarray = gram._matmat(X) + X
        return out if Egram is None else out + Egram._matmat(X)

    def cg(R: np.ndarray, X: np.ndarray | None) -> np.ndarray:
        X0 = np.zeros_like(R) if X is None else X
        D, rep = batched_cg(matvec, R - matvec(X0), precond=diag, tol=1e-9, maxiter=500)
        inner.append(rep.iterations)
        X1: np.ndarray = X0 + D
        return X1

    return XSolver("cg", cg, inner)


def _woodbury(
    base: Callable[[np.ndarray], np.ndarray], E: LinearQuery, inner: list[int]
) -> XSolver:
    """``(K + E^T E)^-1 r = K^-1 (r - E^T S^-1 E K^-1 r)``, ``S = I + E K^-1 E^T`` (Cholesky)."""
    p, n = E.shape
    S = np.eye(p)
    KEt = np.empty((n, p)) if n * p <= 20_000_000 else None
    for a in range(0, p, 64):  # K^-1 E^T, a block of columns at a time
        b = min(p, a + 64)
        Et = E._rmatmat(np.eye(p)[:, a:b])
        block = base(Et)
        S[:, a:b] += E._matmat(block)
        if KEt is not None:
            KEt[:, a:b] = block
    cf = sla.cho_factor(S)

    def solve(R: np.ndarray, X: np.ndarray | None) -> np.ndarray:
        T = base(R)
        U = sla.cho_solve(cf, E._matmat(T))
        return T - KEt @ U if KEt is not None else base(R - E._rmatmat(U))

    return XSolver("kron-eigen+woodbury", solve, inner)
