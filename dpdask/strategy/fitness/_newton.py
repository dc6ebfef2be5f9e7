"""The Newton system of SM-II: Hessian-vector products, preconditioner, conjugate gradient.

Paper 000 section 6.2 (Algorithm 2) solves ``H d = -grad`` for Problem 4 by conjugate
gradient on Hessian-vector products; :class:`NewtonSystem` is that system at one
point, in transformed coordinates that make conjugate gradient converge in a handful
of iterations. See its docstring for the algebra; :mod:`dpdask.strategy.fitness._smii`
runs the outer loop.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg as sla

if TYPE_CHECKING:
    from dpdask.strategy.fitness._smii import _Objective, _Point

__all__ = ["NewtonSystem", "gram_rows"]

# Soft-max weights below this are left out of Hessian-vector products.
_NEGLIGIBLE = 1e-12
# The Woodbury preconditioner is built when at most this many constraints are active,
# and at most this many per row of Sigma (beyond that U G U^T is no longer low rank).
_MAX_WOODBURY = 6000
_WOODBURY_PER_RANK = 3
# Whitened query rows are held explicitly up to this many entries.
_MAX_ROW_ENTRIES = 1 << 24
# Eigenvalues of K below this fraction of the largest are raised to it in C = K^{-1/4}.
_K_FLOOR = 1e-8


def gram_rows(a: np.ndarray) -> np.ndarray:
    """``a a^T`` through the symmetric rank-k update (half a general product)."""
    syrk = sla.blas.ssyrk if a.dtype == np.float32 else sla.blas.dsyrk
    C = syrk(1.0, a)
    out: np.ndarray = np.triu(C) + np.triu(C, 1).T
    return out


class NewtonSystem:
    """Hessian-vector products and a preconditioner in transformed coordinates.

    **Whitening.** With ``F = R^T`` the Cholesky factor of ``Sigma`` and ``D = F E F^T``,
    the current point is ``X = I``, the basis columns are ``bh_j = F^-1 b_j``, the scaled
    query rows ``lh_i = F^T l_i / sqrt(c_i)``, and the Hessian is

        H[E] = E K + K E + U G U^T [E],

    with ``K = sum_j pi_j bh_j bh_j^T``, ``U (a, b) = sum_j a_j bh_j bh_j^T + sum_i b_i
    lh_i lh_i^T`` (so ``U^T E = (q, s)``, ``q_j = bh_j^T E bh_j``, ``s_i = lh_i^T E lh_i``)
    and ``G = diag(g_P (diag(pi) - pi pi^T), g_V (diag(nu) - nu nu^T))``: a Sylvester
    operator plus a term of rank at most ``d + m``. The soft maxima make the Hessian
    ill-conditioned (eigenvalues of order ``tau`` beside eigenvalues of order 1).

    **Preconditioning** (``"geometric"``, the default). The Sylvester operator, with
    eigenvalues ``k_a + k_b`` for the eigenvalues ``k`` of ``K``, is approximated by
    ``E -> 2 K^{1/2} E K^{1/2}`` (eigenvalues ``2 sqrt(k_a k_b)``); in the coordinates
    ``E = C Et C`` with ``C = K^{-1/4}`` that approximation is ``2 I``, and ``2 I + U G U^T``
    is inverted exactly by the Woodbury identity (``U`` with the columns ``C bh_j`` and
    rows ``C lh_i``). What is left has a condition number of a few units, so conjugate
    gradient needs a handful of iterations. ``"scalar"`` approximates the Sylvester
    part by a multiple of the identity instead (no ``C``), ``"none"`` only whitens.
    """

    def __init__(
        self, obj: _Objective, pt: _Point, precondition: str, dtype: type, damping: float = 0.0
    ):
        c = obj.c
        F = pt.R.T
        r = F.shape[0]
        Bh = obj.cols.whiten(pt.Rinv.T)
        K = gram_rows(Bh * np.sqrt(pt.pi))
        keep_p = pt.pi > _NEGLIGIBLE
        keep = pt.nu > _NEGLIGIBLE
        self.pi, self.nu = pt.pi[keep_p], pt.nu[keep]
        # the whitened query rows, explicit unless there are too many of them (then the
        # variance part is applied through the row term in the original coordinates)
        self.rows = None
        if self.nu.size * r <= _MAX_ROW_ENTRIES:
            Lt = obj.rows.times(F)[keep] / np.sqrt(c[keep])[:, None]
            A = gram_rows(Lt.T * np.sqrt(self.nu))
        else:
            self.rows, self.keep, self.c = obj.rows, keep, c
            Lt = np.zeros((0, r))
            A = F.T @ obj.rows.gram(pt.nu / c) @ F
        # the whitened gradient F^T grad F: the soft-max gradients are A and -K
        grad = A - K
        if obj.G is not None:
            grad += obj.lam * (F.T @ obj.G @ F)
        B = Bh[:, keep_p]
        # Levenberg-Marquardt damping: delta E (the Hessian of -log det, whitened) is
        # added to the Sylvester part E K + K E, i.e. K becomes K + delta / 2
        half_delta = 0.5 * damping * float(np.trace(K)) / r
        if precondition == "geometric":
            lam, V = sla.eigh(K)
            lam = np.clip(lam, 0.0, None)
            kd = np.maximum(lam + half_delta, _K_FLOOR * max(float(lam.max()), 1e-300))
            C = (V * kd**-0.25) @ V.T
            self.Jinv = (V * kd**-0.5) @ V.T
            self.Ks = (V * np.sqrt(kd)) @ V.T  # C (K + delta / 2) C
            self.Kg = (V * (lam / np.sqrt(kd))) @ V.T  # C K C
            self.map = F @ C
            B, Lt, A, grad = C @ B, Lt @ C, C @ A @ C, C @ grad @ C
            self.kappa = 2.0
        else:
            self.Jinv = None
            self.Kg = K
            self.Ks = K + half_delta * np.eye(r)
            self.map = F
            self.kappa = 2.0 * float(np.trace(self.Ks)) / r
        self.gradient = 0.5 * (grad + grad.T)
        self.triangular = self.Jinv is None
        self.k = self.pi.size
        self.gP, self.gV = obj.gP, obj.gV
        self.dtype = dtype
        arrays: list[np.ndarray] = [
            np.asarray(a, dtype=dtype) for a in (B, Lt, self.Kg, self.Ks, A)
        ]
        self.B, self.Lt, self.Kg, self.Ks, self.A = arrays
        if self.Jinv is not None:
            self.Jinv = np.asarray(self.Jinv, dtype=dtype)
        self.chol = None
        k = self.pi.size + self.nu.size
        woodbury = k <= min(_MAX_WOODBURY, _WOODBURY_PER_RANK * r)
        if precondition != "none" and self.rows is None and woodbury:
            self._woodbury(B, Lt)

    def _sandwich(self, M: np.ndarray) -> np.ndarray:
        """``map^T M map``."""
        G = self.map
        if self.triangular:
            trmm = sla.blas.dtrmm
            M = trmm(1.0, G, M, side=0, lower=1, trans_a=1)
            M = trmm(1.0, G, M, side=1, lower=1)
        else:
            M = G.T @ M @ G
        out: np.ndarray = 0.5 * (M + M.T)
        return out

    def direction(self, E: np.ndarray) -> np.ndarray:
        """``D = map E map^T`` in the original coordinates."""
        G = self.map
        if self.triangular:
            trmm = sla.blas.dtrmm
            D = trmm(1.0, G, E, side=0, lower=1)  # F E
            D = trmm(1.0, G, D, side=1, lower=1, trans_a=1)  # (F E) F^T
        else:
            D = G @ E @ G.T
        out: np.ndarray = 0.5 * (D + D.T)
        return out

    def _sylvester(self, E: np.ndarray) -> np.ndarray:
        """The Sylvester part ``E K + K E`` in the current coordinates."""
        if self.Jinv is None:
            T = E @ self.Ks
        else:
            T = (self.Jinv @ E) @ self.Ks
        out: np.ndarray = T + T.T
        return out

    def _UT(self, E: np.ndarray) -> np.ndarray:
        """``U^T E = (q, s)``: two matrix products."""
        q = np.einsum("ij,ij->j", self.B, E @ self.B)
        if self.rows is None:
            s = np.einsum("ij,ij->i", self.Lt @ E, self.Lt)
        else:
            D = self.direction(np.asarray(E, dtype=np.float64))
            s = (self.rows.quad(D) / self.c)[self.keep]
        return np.concatenate([q, s]).astype(np.float64)

    def _U(self, y: np.ndarray) -> np.ndarray:
        """``U y``: two matrix products."""
        a: np.ndarray = y[: self.k].astype(self.dtype)
        b: np.ndarray = y[self.k :].astype(self.dtype)
        out: np.ndarray = (self.B * a) @ self.B.T
        if self.rows is None:
            out = out + self.Lt.T @ (self.Lt * b[:, None])
            return out
        w = np.zeros(self.keep.size)
        w[self.keep] = b
        out = out + self._sandwich(self.rows.gram(w / self.c)).astype(self.dtype)
        return out

    def _hv(self, E: np.ndarray, uE: np.ndarray) -> np.ndarray:
        """``H[E]`` given ``U^T E``: three matrix products."""
        k, pi, nu = self.k, self.pi, self.nu
        q, s = uE[:k], uE[k:]
        out: np.ndarray = self._sylvester(E)
        out += self._U(np.concatenate([self.gP * pi * q, self.gV * nu * s]))
        out -= (self.gP * float(pi @ q)) * self.Kg + (self.gV * float(nu @ s)) * self.A
        out = 0.5 * (out + out.T)
        return out

    def hv(self, E: np.ndarray) -> np.ndarray:
        """``H[E]``."""
        E = np.asarray(E, dtype=self.dtype)
        return np.asarray(self._hv(E, self._UT(E)), dtype=np.float64)

    def _woodbury(self, B: np.ndarray, Lt: np.ndarray) -> None:
        """Factor ``kappa I + V^T (U^T U) V`` where ``G = V V^T``.

        For one soft max with weights ``w`` (summing to 1) and sharpness ``g``,
        ``g (diag(w) - w w^T) = V V^T`` with ``V = sqrt(g) (I - w 1^T) diag(sqrt(w))``;
        ``V`` is applied in ``O(n)`` and ``V^T X V`` in ``O(n^2)``. ``U^T U`` is the
        Gram matrix of the rank-one matrices ``bh bh^T`` and ``lh lh^T``:
        ``<x x^T, y y^T> = (x^T y)^2``.
        """
        BB, BL, LL = gram_rows(B.T), B.T @ Lt.T, gram_rows(Lt)
        self.gram = np.block([[BB * BB, BL * BL], [(BL * BL).T, LL * LL]])
        w = np.concatenate([self.pi, self.nu])
        self._blocks = (slice(0, self.k), slice(self.k, w.size))
        self._w = w
        self._scale = np.sqrt(w) * np.concatenate(
            [np.full(self.k, math.sqrt(self.gP)), np.full(w.size - self.k, math.sqrt(self.gV))]
        )
        M = self.gram.copy()
        for blk in self._blocks:  # M (I - w 1^T), blockwise
            M[:, blk] -= (M[:, blk] @ w[blk])[:, None]
        for blk in self._blocks:  # (I - 1 w^T) M
            M[blk, :] -= (w[blk] @ M[blk, :])[None, :]
        M *= np.outer(self._scale, self._scale)
        M[np.diag_indices_from(M)] += self.kappa
        self.chol = sla.cho_factor(M, check_finite=False)

    def _V(self, z: np.ndarray) -> np.ndarray:
        y = self._scale * z
        for blk in self._blocks:
            y[blk] -= self._w[blk] * y[blk].sum()
        out: np.ndarray = y
        return out

    def _VT(self, y: np.ndarray) -> np.ndarray:
        z = y.copy()
        for blk in self._blocks:
            z[blk] -= float(self._w[blk] @ y[blk])
        out: np.ndarray = self._scale * z
        return out

    def _precond(self, R: np.ndarray, uR: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kappa I + U G U^T)^-1 R`` and its ``U^T`` image (from the Gram matrix)."""
        if self.chol is None:
            return R, uR
        y = self._V(sla.cho_solve(self.chol, self._VT(uR)))
        return (R - self._U(y)) / self.kappa, (uR - self.gram @ y) / self.kappa

    def solve(self, rhs: np.ndarray, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
        """Algorithm 2: preconditioned conjugate gradient for ``H E = rhs`` from ``E = 0``.

        ``U^T`` of the search direction follows from the recurrence ``p = z + beta p``
        and of ``z`` from the Gram matrix, so an iteration costs seven matrix products.
        """
        dt = self.dtype
        x: np.ndarray = np.zeros(rhs.shape, dtype=dt)
        r: np.ndarray = np.asarray(rhs, dtype=dt)
        stop = tol * float(np.linalg.norm(r))
        z, uz = self._precond(r, self._UT(r))
        p, up = z, uz
        rz = float(np.sum(r * z))
        k = 0
        for k in range(1, max_iter + 1):
            Hp = self._hv(p, up)
            pHp = float(np.sum(p * Hp))
            if pHp <= 0.0:  # numerical loss of curvature: keep what we have
                if k == 1:
                    x = z
                break
            a = rz / pHp
            x = x + a * p
            r = r - a * Hp
            if float(np.linalg.norm(r)) <= stop:
                break
            z, uz = self._precond(r, self._UT(r))
            rz_new = float(np.sum(r * z))
            beta = rz_new / rz
            p, up = z + beta * p, uz + beta * up
            rz = rz_new
        return np.asarray(x, dtype=np.float64), k
