"""Structured pseudo-inverses for least squares without matrices over the cells.

:func:`structured_pinv` returns the factor-wise pseudo-inverse of a Kronecker
strategy, or a :class:`KronPairInverse` for a union of two Kronecker products
(HDMM's OPT_+); :func:`full_column_rank` says whether ``A^+ A = I``, which the
release's fused least-squares path needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpdask.linalg import Kron, LinearQuery, VStack, kron_vector

__all__ = ["KronPairInverse", "full_column_rank", "structured_pinv"]

_FACTOR_MAX = 4_000_000  # entries of a factor still handled densely


class KronPairInverse(LinearQuery):
    """``(A^T A)^{-1} A^T`` for a union of two Kronecker products ``A = [c_1 K_1; c_2 K_2]``.

    Factor by factor the two Grams are diagonalised together: for attribute ``i``,
    with ``M_i = G_1i + G_2i`` (``G_ki = K_ki^T K_ki``) positive definite, ``V_i``
    solves ``V_i^T M_i V_i = I`` and ``V_i^T G_1i V_i = L_i`` (diagonal), hence
    ``V_i^T G_2i V_i = I - L_i``. With ``V = (x)_i V_i``,
    ``V^T A^T A V = c_1^2 (x)_i L_i + c_2^2 (x)_i (I - L_i) = D``, a diagonal, so
    ``(A^T A)^{-1} = V D^{-1} V^T``: least squares over the whole union in a few
    Kronecker products, with no matrix over the cells. Build with
    :func:`structured_pinv`, which checks that it applies.

    When ``A`` is rank deficient (OPT_+ on SF1 is: neither part asks for some
    interactions the workload does not need), zeros of ``D`` are skipped:
    ``G = V D^+ V^T`` is a generalised inverse of ``A^T A``, so ``G A^T y`` still
    solves the normal equations (a least-squares estimate, though not the one of
    minimum norm), and for any workload ``W`` the strategy supports (``W A^+ A =
    W``) the answers ``W G A^T y`` and their covariance ``v W G W^T = v W (A^T A)^+
    W^T`` are those of the minimum-norm solution (``A G A^T`` is the orthogonal
    projector onto the range of ``A`` for every generalised inverse ``G``).
    ``full_rank`` says whether ``D`` has no zero.
    """

    def __init__(self, A: VStack, V: list[np.ndarray], d: np.ndarray):
        from dpdask.linalg import Dense

        self.A = A
        self.V = Kron([Dense(v) for v in V])
        self.Vt = Kron([Dense(np.ascontiguousarray(v.T)) for v in V])
        keep = d > d.max() * 1e-10
        self.full_rank = bool(keep.all())
        self.dinv = np.where(keep, 1.0 / np.where(keep, d, 1.0), 0.0)
        self.shape = (A.shape[1], A.shape[0])

    def _normal_solve(self, U: np.ndarray) -> np.ndarray:  # (g, n) -> (g, n)
        W = self.Vt.apply(U)
        W *= self.dinv
        return self.V.apply(W)

    def _apply_batch(self, Y: np.ndarray) -> np.ndarray:
        U = np.zeros((Y.shape[0], self.shape[0]))
        for part, c, sl in zip(self.A.parts, self.A.weights, self.A.part_slices(), strict=True):
            U += c * part.T.apply(Y[:, sl])
        return self._normal_solve(U)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self._apply_batch(X.T).T

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        W = self._normal_solve(Y.T)  # (A^T A)^{-1} is symmetric
        return self.A._matmat(W.T)

    def _params(self) -> tuple[Any, ...]:
        return (self.A, self.dinv)


def _pair_inverse(A: VStack) -> KronPairInverse | None:
    """The :class:`KronPairInverse` of ``A``, or None when it does not apply."""
    if len(A.parts) != 2 or A._kron_shape() is None:
        return None
    K1, K2 = A.parts
    if not (isinstance(K1, Kron) and isinstance(K2, Kron)):  # held by _kron_shape: narrows
        return None
    if any(f.size > _FACTOR_MAX for f in (*K1.factors, *K2.factors)):
        return None
    V, lam = [], []
    for f1, f2 in zip(K1.factors, K2.factors, strict=True):
        G1, G2 = f1.gram().dense(), f2.gram().dense()
        try:
            L = np.linalg.cholesky(G1 + G2)
        except np.linalg.LinAlgError:
            return None  # a direction no part measures: rank deficient
        Linv = np.linalg.inv(L)
        S = Linv @ G1 @ Linv.T
        w, Q = np.linalg.eigh((S + S.T) / 2)
        V.append(Linv.T @ Q)
        lam.append(np.clip(w, 0.0, 1.0))
    c1, c2 = (float(c) ** 2 for c in A.weights)
    d = c1 * kron_vector(lam) + c2 * kron_vector([1.0 - v for v in lam])
    return KronPairInverse(A, V, d)


def structured_pinv(A: LinearQuery) -> LinearQuery | None:
    """An implicit pseudo-inverse of ``A`` when its structure gives one cheaply, else None.

    Kronecker products of small factors: factor by factor. A union of two Kronecker
    products over one domain (HDMM's OPT_+): :class:`KronPairInverse` (a generalised
    inverse when the union is rank deficient; see there). A small operator (at most
    4e6 entries): densely. Anything else returns None (the estimators then solve
    iteratively).
    """
    if isinstance(A, Kron) and all(f.size <= _FACTOR_MAX for f in A.factors):
        return A.pinv()
    if isinstance(A, VStack):
        pair = _pair_inverse(A)
        if pair is not None:
            return pair
    if A.size <= _FACTOR_MAX:
        return A.pinv()
    return None


def full_column_rank(A: LinearQuery, pinv: LinearQuery | None) -> bool:
    """Whether ``A`` has full column rank (so ``A^+ A = I``), decided from its structure.

    A Kronecker product has it when every factor has; a union with a
    :class:`KronPairInverse` has it by construction; a small operator is checked
    densely. Otherwise False (unknown).
    """
    if isinstance(pinv, KronPairInverse):
        return pinv.full_rank
    if isinstance(A, Kron) and all(f.size <= _FACTOR_MAX for f in A.factors):
        return all(full_column_rank(f, None) for f in A.factors)
    if A.size <= _FACTOR_MAX:
        return A.shape[0] >= A.shape[1] and np.linalg.matrix_rank(A.dense()) == A.shape[1]
    return False
