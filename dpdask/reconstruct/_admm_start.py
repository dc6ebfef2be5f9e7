"""A starting point for projected Newton on a Kronecker Gram: a few ADMM iterations.

For ``min 1/2 u^T G u - c^T u`` over ``u >= 0`` with ``G = Q diag(lam) Q^T`` and
``Q = Q_1 (x) ... (x) Q_d`` (the factors' eigenvectors; see
:meth:`~dpdask.reconstruct._kron_gram.ScaledKronGram.eigh`), ADMM on the splitting
``u = z, z >= 0`` (Boyd et al. 2011, section 5, with over-relaxation) needs

    u  = (G + rho I)^-1 (c + rho (z - v)) = Q diag(1 / (lam + rho)) Q^T (...)
    z  = max(alpha u + (1 - alpha) z + v, 0)
    v += alpha u + (1 - alpha) z_old - z

that is two Kronecker transforms per iteration and no inner solve. On a Kronecker
HDMM strategy (condition number 1e10 on the CPH domain) ADMM does not reach the
projected-gradient tolerance soon, but within a few dozen iterations its ``z`` has about
the support of the solution and is several times closer to it than the point
projected Newton reaches from zero in the same work; Newton then finishes from ``z``
in fewer products (``dpdask bench reconstruct``). Only ``z`` is returned: it is the
feasible iterate.

The iteration stops between 12 and 20 steps, once the primal residual ``u - z`` is at
most 0.03 noise units root-mean-square: what it then has left is noise, and typical
(small) counties get there in 12, large ones need the 20 (:data:`MIN_ITERATIONS`).
"""

from __future__ import annotations

import numpy as np

from dpdask.reconstruct._kron_gram import ScaledKronGram, kron_rows

__all__ = ["AdmmStart"]

RHO = 0.5  # penalty, in the units of the Jacobi-scaled Gram (unit diagonal)
# 20 at most (dense counties need them; fewer made their fits slower)
ITERATIONS = 20
# ... and at least 12, after which the iteration stops once the root-mean-square primal
# residual u - z is at most RESIDUAL (noise units with inverse-variance weights): on small
# counties what is left after 12 is noise, whatever their size; large ones need the 20
MIN_ITERATIONS = 12
RESIDUAL = 0.03
RELAX = 1.6  # over-relaxation


class AdmmStart:
    """The ADMM start on one Gram: its eigenvectors and the iteration's two scalings are
    computed once and serve every right-hand side.

    Parameters
    ----------
    gram : ScaledKronGram
        The Jacobi-scaled Gram ``G``; the transforms run in its dtype.
    rho : float, optional
        The ADMM penalty (default :data:`RHO`).
    """

    def __init__(self, gram: ScaledKronGram, rho: float | None = None):
        rho = RHO if rho is None else rho
        lam, vectors = gram.eigh()
        self.dtype = dt = gram.dtype
        self._Q = [np.ascontiguousarray(q, dtype=dt) for q in vectors]
        self._Qt = [np.ascontiguousarray(q.T, dtype=dt) for q in vectors]
        inv = 1.0 / (lam + rho)
        # the iterates z >= 0 and v <= 0 are the two parts of w = z + v (the z-step is
        # z = max(w, 0), v = w - z), so z - v = |w| and the update of w is
        # w + RELAX (u - max(w, 0)); RELAX and the diagonal are folded into two scalings
        self._scale = (RELAX * rho * inv).astype(dt)
        self._shift = (RELAX * inv).astype(dt)

    def __call__(self, C: np.ndarray, iterations: int | None = None) -> np.ndarray:
        """ADMM steps from zero for every row of ``C`` (``(k, n)``, the linear terms in
        the scaled variables), two Kronecker transforms each; returns ``(k, n)``
        non-negative float64 starting points.

        ``iterations`` steps when given; by default :data:`MIN_ITERATIONS` to
        :data:`ITERATIONS`, stopping once the root-mean-square primal residual ``u - z``
        of every row is at most :data:`RESIDUAL`.
        """
        low, high = (MIN_ITERATIONS, ITERATIONS) if iterations is None else (iterations,) * 2
        dt = self.dtype
        shift = self._shift * kron_rows(self._Qt, np.asarray(C, dtype=dt))
        W = np.zeros_like(shift)
        part = np.empty_like(W)
        # the squared residual at which to stop, in the units of U = RELAX (u - z)
        settled = RESIDUAL * RESIDUAL * RELAX * RELAX * W.shape[1]
        for it in range(1, high + 1):
            T = kron_rows(self._Qt, np.abs(W, out=part))
            T *= self._scale
            T += shift
            U = kron_rows(self._Q, T)  # RELAX u
            np.maximum(W, 0, out=part)
            part *= dt.type(RELAX)
            U -= part  # RELAX (u - z)
            W += U
            if low <= it < high and np.einsum("ij,ij->i", U, U).max() <= settled:
                break
        start: np.ndarray = np.maximum(W, 0).astype(float)
        return start
