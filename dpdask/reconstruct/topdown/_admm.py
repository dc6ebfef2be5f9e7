"""A starting point for the children's fit on a Kronecker Gram: a few ADMM iterations.

As :mod:`dpdask.reconstruct._admm_start` does for NNLS, on the whole domain: the
children's scaled variables ``U`` ``(K, n)``, the objective ``1/2 sum_c u_c^T G~ u_c -
<C, U>`` and the splitting ``U = Z``, ``Z`` in the feasible set (zero off the parent's
support ``S``, on ``S`` each cell's children on the simplex ``{z >= 0, sum_c z_cj =
t_j}``). With ``G~ = Q diag(lam) Q^T`` (``Q`` the Kronecker product of the factors'
eigenvectors) and ``w = z + v`` (``v`` the scaled dual), over-relaxed ADMM is

    z  = P(w)
    u  = Q diag(1 / (lam + rho)) Q^T (c + rho (2 z - w))
    w += alpha (u - z)

two Kronecker transforms per child and iteration, and one projection onto the simplices
(on ``S`` only). ADMM handles the Gram's small eigenvalues exactly (the condition number
of a Kronecker HDMM strategy's Gram is about 1e10 on the CPH domain), which the
projected Newton method's inner solves do not: from its ``Z`` Newton starts with about
the support of the solution. The transforms run child by child in float32 (one child's
vector, 2 MB on the CPH domain, stays in cache; ten at once do not); the iteration stops
between :data:`MIN_ITERATIONS` and :data:`ITERATIONS`, once the root-mean-square primal
residual ``u - z`` on ``S`` is at most :data:`RESIDUAL` (noise units).
"""

from __future__ import annotations

import numpy as np

from dpdask.reconstruct._kron_gram import ScaledKronGram, kron_rows
from dpdask.reconstruct.topdown._fista import project

__all__ = ["SimplexAdmm"]

RHO = 0.5  # penalty, in the units of the Jacobi-scaled Gram (unit diagonal)
ITERATIONS = 60
MIN_ITERATIONS = 12
RESIDUAL = 0.03
RELAX = 1.6  # over-relaxation


class SimplexAdmm:
    """The ADMM start on one level's Kronecker Gram (eigenvectors computed once).

    Parameters
    ----------
    gram : ScaledKronGram
        The level's Jacobi-scaled Gram ``G~``; the transforms run in float32.
    """

    def __init__(self, gram: ScaledKronGram):
        lam, vectors = gram.eigh()
        self._Q = [np.ascontiguousarray(q, dtype=np.float32) for q in vectors]
        self._Qt = [np.ascontiguousarray(q.T, dtype=np.float32) for q in vectors]
        inv = 1.0 / (lam + RHO)
        self._inv = inv.astype(np.float32)
        self._rho_inv = (RHO * inv).astype(np.float32)

    def __call__(self, C: np.ndarray, idx: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, int]:
        """ADMM from the even split for the linear terms ``C`` ``(K, n)`` (whole domain),
        the support ``idx`` and its cell sums ``t``; returns the feasible ``Z`` on the
        support ``(K, |S|)`` (float64) and the iterations taken."""
        K = C.shape[0]
        C32 = np.asarray(C, dtype=np.float32)
        shift = np.stack([self._inv * kron_rows(self._Qt, c[None])[0] for c in C32])
        W = np.zeros_like(shift)
        settled = RESIDUAL * RESIDUAL * W.size
        it = 0
        for it in range(1, ITERATIONS + 1):
            Z = project(W[:, idx].astype(float), t).astype(np.float32)
            primal = 0.0
            for c in range(K):
                r = -W[c]
                r[idx] += 2.0 * Z[c]
                T = kron_rows(self._Qt, r[None])[0]
                T *= self._rho_inv
                T += shift[c]
                u = kron_rows(self._Q, T[None])[0]
                u[idx] -= Z[c]
                primal += float(np.dot(u, u))
                u *= np.float32(RELAX)
                W[c] += u
            if it >= MIN_ITERATIONS and primal <= settled:
                break
        return project(W[:, idx].astype(float), t), it
