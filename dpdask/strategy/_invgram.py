"""The pseudo-inverse ``X = (A^T A)^+`` of a factor strategy, kept low-rank.

Every factor strategy the optimisers produce has a pseudo-inverse Gram of the form
``X = diag(e) + s R^T R`` with ``s = +1`` or ``-1`` and ``R`` of few rows:

* p-Identity ``A = [I; Theta] D`` (``D = diag(1/d)``): by the Woodbury identity
  ``X = D^-1 (I + Theta^T Theta)^-1 D^-1 = diag(d^2) - R^T R`` with
  ``R = L^-1 Theta diag(d)`` and ``L L^T = I_p + Theta Theta^T``;
* identity: ``X = I``; a total row ``1^T`` (``m`` copies): ``X = J / (m n^2)``;
* anything else small: ``X = F^T F`` from the eigendecomposition of ``A^T A``.

In that form the two quantities the error analytics need cost ``O(n r)`` beyond
one application of the workload: ``tr(G X) = ||W A^+||_F^2`` and the per-query
``diag(W X W^T)``. When ``A`` lacks full column rank, ``basis`` spans its row space
and :meth:`InverseGram.check_supports` verifies that a workload lies in it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import (
    Dense,
    Diagonal,
    Identity,
    LinearQuery,
    Ones,
    Prefix,
    RangeQueries,
    Scaled,
    Sparse,
    VStack,
)
from dpdask.strategy._gram import Gram

__all__ = ["InverseGram", "inverse_gram"]

_CHUNK_ELEMENTS = 4_000_000
_SUPPORT_RTOL = 1e-8


class InverseGram:
    """``X = diag(e) + sign * R^T R``, the pseudo-inverse Gram of a factor strategy.

    Parameters
    ----------
    e : ndarray, shape (n,)
        Diagonal part.
    R : ndarray, shape (r, n)
        Low-rank part.
    sign : {1, -1}
        Sign of the low-rank part.
    basis : ndarray, shape (n, k), optional
        Orthonormal basis of the strategy's row space when it is not all of
        ``R^n`` (``None`` for a full-column-rank strategy).
    """

    def __init__(
        self, e: np.ndarray, R: np.ndarray, sign: int = -1, basis: np.ndarray | None = None
    ):
        self.e = np.asarray(e, dtype=float)
        self.n = self.e.size
        self.R = np.asarray(R, dtype=float).reshape(-1, self.n)
        if sign not in (1, -1):
            raise ArgumentError("sign must be +1 or -1")
        self.sign = sign
        self.basis = basis

    def scaled(self, c: float) -> InverseGram:
        """The pseudo-inverse Gram of ``A / sqrt(c)``, i.e. ``c * X``."""
        return InverseGram(c * self.e, np.sqrt(c) * self.R, self.sign, self.basis)

    def dense(self) -> np.ndarray:
        out: np.ndarray = np.diag(self.e) + self.sign * (self.R.T @ self.R)
        return out

    def trace(self, G: Gram) -> float:
        """``tr(G X)``: the squared reconstruction error of a workload with Gram ``G``."""
        out = float(self.e @ G.diag())
        if self.R.shape[0]:
            out += self.sign * float(np.sum(self.R.T * G.matmat(self.R.T)))
        return out

    def quad_diag(self, W: LinearQuery) -> np.ndarray:
        """``diag(W X W^T)``: the variance of each query of ``W`` (per unit noise)."""
        parts = []
        for Wc in _row_chunks(W, max(1, self.R.shape[0])):
            v = _squares_apply(Wc, self.e) if self.e.any() else np.zeros(Wc.shape[0])
            if self.R.shape[0]:
                WR = Wc._matmat(self.R.T)
                v = v + self.sign * np.einsum("ij,ij->i", WR, WR)
            parts.append(v)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def check_supports(self, W: LinearQuery, what: str = "the workload") -> None:
        """Raise ``PlanError`` unless every row of ``W`` lies in the strategy's row space."""
        if self.basis is None:
            return
        total = Gram.of(W).trace()
        kept = 0.0
        for Wc in _row_chunks(W, self.basis.shape[1]):
            WU = Wc._matmat(self.basis)
            kept += float(np.sum(WU * WU))
        if total - kept > _SUPPORT_RTOL * max(total, 1.0):
            raise PlanError(
                f"the strategy does not support {what}: some workload queries are not "
                "linear combinations of the measured queries, so their error is unbounded"
            )


def inverse_gram(A: LinearQuery) -> InverseGram:
    """``(A^T A)^+`` of a factor strategy, in low-rank form (closed forms where known)."""
    hook = getattr(A, "_inverse_gram", None)
    if hook is not None:
        own: InverseGram = hook()
        return own
    n = A.shape[1]
    if isinstance(A, Identity):
        return InverseGram(np.ones(n), np.zeros((0, n)))
    if isinstance(A, Ones):
        basis = np.full((n, 1), 1.0 / np.sqrt(n))
        return InverseGram(np.zeros(n), np.full((1, n), 1.0 / (n * np.sqrt(A.m))), 1, basis)
    if isinstance(A, Scaled):
        if A.c == 0:
            raise PlanError("a strategy scaled by zero measures nothing")
        return inverse_gram(A.A).scaled(1.0 / A.c**2)
    if isinstance(A, Diagonal) and np.all(A.d != 0):
        return InverseGram(1.0 / A.d**2, np.zeros((0, n)))
    return _eig_inverse_gram(Gram.of(A).dense())


def _eig_inverse_gram(AtA: np.ndarray) -> InverseGram:
    lam, U = np.linalg.eigh(AtA)
    n = lam.size
    tol = max(lam.max(initial=0.0), 0.0) * n * np.finfo(float).eps * 10
    keep = lam > tol
    F = (U[:, keep] / np.sqrt(lam[keep])).T  # X = F^T F
    basis = None if keep.all() else U[:, keep]
    return InverseGram(np.zeros(n), F, 1, basis)


def _squares_apply(W: LinearQuery, e: np.ndarray) -> np.ndarray:
    """``(W * W) @ e``, the entrywise square of ``W`` applied to ``e``."""
    if isinstance(W, Identity | Ones | Prefix | RangeQueries):  # 0/1 entries
        return W._matmat(e[:, None])[:, 0]
    if isinstance(W, Scaled):
        return W.c**2 * _squares_apply(W.A, e)
    if isinstance(W, VStack):
        return np.concatenate(
            [w**2 * _squares_apply(p, e) for p, w in zip(W.parts, W.weights, strict=True)]
        )
    if isinstance(W, Diagonal):
        out: np.ndarray = W.d**2 * e
        return out
    if isinstance(W, Sparse):
        return np.asarray(W.matrix.power(2) @ e).ravel()
    M = W.matrix if isinstance(W, Dense) else W.dense()
    squares: np.ndarray = (M * M) @ e
    return squares


def _row_chunks(W: LinearQuery, width: int) -> Iterator[LinearQuery]:
    """``W`` split into blocks of rows so that ``block @ (n, width)`` stays small."""
    m = W.shape[0]
    rows = max(1, _CHUNK_ELEMENTS // max(width, 1))
    if m <= rows:
        yield W
    elif isinstance(W, RangeQueries):
        for a in range(0, m, rows):
            yield RangeQueries(W.n, W.lo[a : a + rows], W.hi[a : a + rows])
    elif isinstance(W, VStack):
        for part, w in zip(W.parts, W.weights, strict=True):
            for block in _row_chunks(part, width):
                yield block if w == 1 else Scaled(block, w)
    elif isinstance(W, Scaled):
        for block in _row_chunks(W.A, width):
            yield Scaled(block, W.c)
    else:
        yield W
