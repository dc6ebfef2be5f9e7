"""The Jacobi-scaled Gram matrix of a Kronecker strategy, applied in float32.

For ``A = c (A_1 (x) ... (x) A_d)`` the Gram matrix is ``c^2 (G_1 (x) ... (x) G_d)``
with ``G_i = A_i^T A_i``, and so is its Jacobi scaling ``S G S`` (``S = diag(G)^-1/2``):
``S G S = (S_1 G_1 S_1) (x) ... (x) (S_d G_d S_d)``, the constant ``c`` cancelling.
One product is then ``d`` small dense matrix products on the data tensor, with no
elementwise scaling pass. Factors of a few cells (sex, Hispanic origin) are merged
into one dense factor, so that every pass over the tensor does real work.

Products run in float32 (half the memory traffic, twice the SIMD width): their
relative error is about ``1e-7`` of the product's size, which the solver checks
against in float64 before it stops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Scaled, kron_vector

__all__ = ["ScaledKronGram", "jacobi_scale", "kron_rows", "scaled_kron_gram"]


_MAX_FACTOR = 512  # factors larger than this are not held dense
_MERGE = 16  # adjacent factors are merged while their product has at most this many cells
# restricted products, and products from entries, use the full product once this
# fraction of fibres is occupied (the crossover of the two; see BENCHMARKS.md)
_RESTRICT_MAX = 0.6
_FIRST_DENSE = 1.5  # the first factor is applied densely once the output is this x its fibres


def jacobi_scale(diag: np.ndarray) -> np.ndarray:
    """``1 / sqrt(diag G)`` where positive, 1 elsewhere (all-zero columns keep scale 1)."""
    return np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)


class ScaledKronGram:
    """``S G S`` for a Kronecker ``G`` with dense factors, applied to ``(n, k)`` arrays.

    Parameters
    ----------
    factors : list of ndarray
        The dense, symmetric, Jacobi-scaled factors (unit diagonal where non-zero).
    dtype : numpy dtype
        The precision of the products.
    """

    def __init__(self, factors: list[np.ndarray], dtype: npt.DTypeLike = np.float32):
        merged: list[np.ndarray] = []
        for F in factors:
            if merged and merged[-1].shape[0] * F.shape[0] <= _MERGE:
                merged[-1] = np.kron(merged[-1], F)
            else:
                merged.append(np.asarray(F, dtype=float))
        self._float64 = merged
        self.factors: list[np.ndarray] = [np.ascontiguousarray(F, dtype=dtype) for F in merged]
        self.sizes = tuple(F.shape[0] for F in self.factors)
        self.n = math.prod(self.sizes)
        self.dtype: np.dtype[Any] = np.dtype(dtype)

    def with_dtype(self, dtype: npt.DTypeLike) -> ScaledKronGram:
        """The same operator with products in another precision."""
        return ScaledKronGram(self._float64, dtype)

    def rows(self, X: np.ndarray) -> np.ndarray:
        """``S G S`` applied to each row of ``X`` (``(k, n)``), in this operator's dtype."""
        return kron_rows(self.factors, np.asarray(X, dtype=self.dtype))

    def _order(self) -> list[int]:
        """The axes of :meth:`restricted`'s permuted tensor: the second largest first, the
        largest last."""
        d, sizes = len(self.sizes), self.sizes
        by_size = sorted(range(d), key=lambda i: sizes[i])
        return [by_size[-2], *[i for i in range(d) if i not in by_size[-2:]], by_size[-1]]

    def restricts(self, idx: np.ndarray) -> bool:
        """Whether :meth:`restricted` on ``idx`` is cheaper than a whole product: false
        when most fibres of its last axis are occupied (it then scatters, takes the
        whole product and gathers, which a batch of vectors does better at once)."""
        if len(self.sizes) == 1:
            return True
        order = self._order()
        psz = [self.sizes[i] for i in order]
        multi = np.unravel_index(idx, self.sizes)
        pidx = np.ravel_multi_index([multi[i] for i in order], psz)
        occupied = np.unique(pidx // psz[-1]).size
        return bool(occupied <= _RESTRICT_MAX * math.prod(psz[:-1]))

    def restricted(
        self, idx: np.ndarray, dtype: npt.DTypeLike | None = None
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``v -> (S G S)[idx, idx] v`` for vectors ``v`` of the entries ``idx`` (sorted).

        The product is taken on a permuted tensor whose last axis is the largest factor
        and whose first is the second largest: the last axis is applied only to the
        fibres that hold an entry of ``idx`` (few when ``idx`` is a sparse free set) and
        the first only where the output is read (``len(idx)`` dot products), so a sparse
        free set costs a fraction of a full product (when most fibres are occupied, a
        full product scattered and gathered is cheaper, and is used). ``dtype`` defaults
        to this operator's.
        """
        dt = self.dtype if dtype is None else np.dtype(dtype)
        facs = (
            self.factors
            if dt == self.dtype
            else [np.ascontiguousarray(F, dtype=dt) for F in self._float64]
        )
        d, sizes = len(facs), self.sizes
        if d == 1:
            sub = np.ascontiguousarray(facs[0][np.ix_(idx, idx)])
            return lambda v: sub @ v
        order = self._order()
        psz = [sizes[i] for i in order]
        pf = [facs[i] for i in order]
        multi = np.unravel_index(idx, sizes)
        pidx = np.ravel_multi_index([multi[i] for i in order], psz)
        last, rest = psz[-1], math.prod(psz[1:])
        fib, pos = np.divmod(pidx, last)
        rows, rinv = np.unique(fib, return_inverse=True)
        nfib = math.prod(psz[:-1])
        if rows.size > _RESTRICT_MAX * nfib:
            # most fibres occupied: a full product, scattered and gathered, is cheaper
            full = np.zeros((1, self.n), dtype=dt)

            def dense(v: np.ndarray) -> np.ndarray:
                full[0, idx] = v
                out: np.ndarray = kron_rows(facs, full)[0, idx]
                return out

            return dense
        last_t = np.ascontiguousarray(pf[-1].T)
        first_dense = idx.size > _FIRST_DENSE * rest
        if not first_dense:  # the first factor's rows and the columns read, per entry
            first, col = np.divmod(pidx, rest)
            first_rows = np.ascontiguousarray(pf[0][first])

        def op(v: np.ndarray) -> np.ndarray:
            X = np.zeros((rows.size, last), dtype=dt)
            X[rinv, pos] = v
            T = np.zeros((nfib, last), dtype=dt)
            T[rows] = X @ last_t
            for i in range(d - 2, 0, -1):
                T = np.matmul(pf[i], T.reshape(-1, psz[i], math.prod(psz[i + 1 :])))
            out: np.ndarray
            if first_dense:  # the whole first mode, then the entries read
                out = (pf[0] @ T.reshape(psz[0], rest)).ravel()[pidx]
            else:
                out = np.einsum("ij,ji->i", first_rows, T.reshape(psz[0], rest)[:, col])
            return out

        return op

    def from_entries(self, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """``S G S v`` for the ``v`` that is ``vals`` at the entries ``idx`` (distinct) and
        zero elsewhere: ``(n,)``, in this operator's dtype.

        The last factor, the largest share of a product's work, is applied only to the
        fibres of the last axis that hold an entry of ``idx`` (a Newton step on a sparse
        histogram touches few of them). When most fibres are occupied (more than
        :data:`_RESTRICT_MAX`) the whole product is taken.
        """
        last = self.sizes[-1]
        fib, pos = np.divmod(idx, last)
        rows, rinv = np.unique(fib, return_inverse=True)
        if rows.size > _RESTRICT_MAX * (self.n // last):
            full = np.zeros((1, self.n), dtype=self.dtype)
            full[0, idx] = vals
            whole: np.ndarray = self.rows(full)[0]
            return whole
        X = np.zeros((rows.size, last), dtype=self.dtype)
        X[rinv, pos] = vals
        T = np.zeros((self.n // last, last), dtype=self.dtype)
        T[rows] = X @ self.factors[-1].T
        return _leading_modes(self.factors, T).reshape(-1)

    def eigh(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The eigenvalues ``(n,)`` of ``S G S`` (C order, like the cells) and the
        orthogonal eigenvector factors ``Q_i``: ``S G S = Q diag(lam) Q^T`` with
        ``Q = Q_1 (x) ... (x) Q_d``, in float64."""
        pairs = [np.linalg.eigh(F) for F in self._float64]
        return kron_vector([w for w, _ in pairs]), [Q for _, Q in pairs]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """``S G S X`` for ``X`` of shape ``(n, k)``; float64 out."""
        return np.asarray(self.rows(np.ascontiguousarray(X.T)).T, dtype=float)


def kron_rows(factors: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """``(F_1 (x) ... (x) F_d) x`` for each row ``x`` of ``X`` (``(k, n)``), square factors.

    The batch axis leads, so the last factor is one plain matrix product and every
    other one a batched product on a ``(pre, n_i, post)`` view; the result has
    ``X``'s dtype when the factors have it.
    """
    k = X.shape[0]
    T = X.reshape(-1, factors[-1].shape[0]) @ factors[-1].T
    return _leading_modes(factors, T).reshape(k, -1)


def _leading_modes(factors: list[np.ndarray], T: np.ndarray) -> np.ndarray:
    """Every factor but the last applied to ``T``, whose rows are the fibres of the last
    axis (the last factor already applied), batch axis leading."""
    sizes = [F.shape[0] for F in factors]
    for i in reversed(range(len(factors) - 1)):
        post = math.prod(sizes[i + 1 :])
        T3 = T.reshape(-1, sizes[i], post)
        T = factors[i] @ T3[0] if T3.shape[0] == 1 else np.matmul(factors[i], T3)
    return T


def _factor_gram(f: LinearQuery) -> np.ndarray | None:
    if f.shape[1] > _MAX_FACTOR:
        return None
    if isinstance(f, Identity):
        return np.eye(f.shape[1])
    G = f.gram()
    return G.matrix if isinstance(G, Dense) else G.dense()


def scaled_kron_gram(A: LinearQuery, dtype: npt.DTypeLike = np.float32) -> ScaledKronGram | None:
    """The Jacobi-scaled Gram of ``A`` when ``A`` is a (scaled) Kronecker product of
    small factors, else ``None``. All-zero columns keep scale 1 (their row of ``G`` is 0).
    """
    while isinstance(A, Scaled):
        if A.c == 0:
            return None
        A = A.A
    if not isinstance(A, Kron):
        return None
    factors = []
    for f in A.factors:
        G = _factor_gram(f)
        if G is None:
            return None
        d = np.diag(G)
        s = jacobi_scale(d)
        factors.append(s[:, None] * G * s[None, :])
    return ScaledKronGram(factors, dtype)
