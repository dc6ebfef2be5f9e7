"""Structured primitive operators with closed forms: identity, totals, ranges, diagonals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg._base import LinearQuery, Scaled, check_dense_size
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._norms import NormTerms

__all__ = [
    "AllRange",
    "Diagonal",
    "Identity",
    "Ones",
    "Prefix",
    "RangeQueries",
    "Total",
    "check_size",
]


def check_size(n: Any, what: str, noun: str = "size") -> int:
    """``n`` as an int, or an ArgumentError saying ``what`` needs a positive integer ``noun``."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ArgumentError(f"{what} needs a positive integer {noun}, got {n!r}")
    return int(n)


def _cumsum_axis(T: np.ndarray, axis: int) -> np.ndarray:
    return np.cumsum(T, axis=axis, dtype=np.result_type(T.dtype, np.float64))


class Identity(LinearQuery):
    """The ``n x n`` identity: every cell on its own."""

    def __init__(self, n: int):
        self.n = check_size(n, "Identity")
        self.shape = (self.n, self.n)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=float)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.asarray(Y, dtype=float)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        return np.asarray(T, dtype=float)

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(np.ones(self.n))

    def _params(self) -> tuple[Any, ...]:
        return (self.n,)

    @property
    def T(self) -> Identity:
        return self

    def gram(self) -> Identity:
        return self

    def pinv(self) -> Identity:
        return self

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, "an Identity")
        return np.eye(self.n)

    def __repr__(self) -> str:
        return f"Identity({self.n})"


class Ones(LinearQuery):
    """The ``m x n`` matrix of ones; ``Ones(n)`` (one row) is the total query."""

    def __init__(self, n: int, m: int = 1):
        self.n = check_size(n, "Ones")
        self.m = check_size(m, "Ones")
        self.shape = (self.m, self.n)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        s = np.asarray(X, dtype=float).sum(axis=0, keepdims=True)
        return np.repeat(s, self.m, axis=0)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        s = np.asarray(Y, dtype=float).sum(axis=0, keepdims=True)
        return np.repeat(s, self.n, axis=0)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        s = np.asarray(T, dtype=float).sum(axis=axis, keepdims=True)
        return np.repeat(s, self.m, axis=axis)

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(np.full(self.n, float(self.m)))

    def _params(self) -> tuple[Any, ...]:
        return (self.n, self.m)

    @property
    def T(self) -> Ones:
        return Ones(self.m, self.n)

    def gram(self) -> LinearQuery:
        return Scaled(Ones(self.n, self.n), self.m) if self.m != 1 else Ones(self.n, self.n)

    def pinv(self) -> LinearQuery:
        return Scaled(Ones(self.m, self.n), 1.0 / (self.m * self.n))

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, "a Ones")
        return np.ones(self.shape)

    def __repr__(self) -> str:
        return f"Ones({self.n})" if self.m == 1 else f"Ones({self.n}, m={self.m})"


def Total(n: int) -> Ones:
    """The single query that counts every cell: ``Ones(n)``."""
    return Ones(n)


class Prefix(LinearQuery):
    """The ``n x n`` lower-triangular matrix of ones: query ``i`` counts cells ``0..i``."""

    def __init__(self, n: int):
        self.n = check_size(n, "Prefix")
        self.shape = (self.n, self.n)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return _cumsum_axis(X, 0)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return _cumsum_axis(Y[::-1], 0)[::-1]

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        return _cumsum_axis(T, axis)

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(np.arange(self.n, 0, -1, dtype=float))

    def _params(self) -> tuple[Any, ...]:
        return (self.n,)

    def gram(self) -> LinearQuery:
        n = self.n
        if n * n > 4_000_000:
            return super().gram()
        i = np.arange(n)
        return Dense(n - np.maximum.outer(i, i))

    def pinv(self) -> Sparse:
        n = self.n
        return Sparse(sp.diags([np.ones(n), -np.ones(n - 1)], [0, -1], shape=(n, n)))

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, "a Prefix")
        return np.tril(np.ones((self.n, self.n)))

    def __repr__(self) -> str:
        return f"Prefix({self.n})"


class RangeQueries(LinearQuery):
    """Interval queries: row ``k`` counts cells ``lo[k]..hi[k]`` (both inclusive).

    Parameters
    ----------
    n : int
        Domain size.
    lo, hi : sequence of int
        Interval bounds, ``0 <= lo <= hi < n``.
    """

    def __init__(self, n: int, lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray):
        self.n = check_size(n, "RangeQueries")
        lo_a = np.asarray(lo, dtype=np.int64).ravel()
        hi_a = np.asarray(hi, dtype=np.int64).ravel()
        if lo_a.shape != hi_a.shape:
            raise ShapeError("RangeQueries: lo and hi have different lengths")
        if lo_a.size == 0:
            raise ArgumentError("RangeQueries needs at least one interval")
        if (lo_a < 0).any() or (hi_a >= self.n).any() or (lo_a > hi_a).any():
            raise ArgumentError(f"RangeQueries: intervals must satisfy 0 <= lo <= hi < {self.n}")
        self.lo, self.hi = lo_a, hi_a
        self.shape = (lo_a.size, self.n)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        S = np.zeros((self.n + 1, X.shape[1]))
        np.cumsum(X, axis=0, out=S[1:])
        out: np.ndarray = S[self.hi + 1] - S[self.lo]
        return out

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        D = np.zeros((self.n + 1, Y.shape[1]))
        np.add.at(D, self.lo, Y)
        np.add.at(D, self.hi + 1, -Y)
        return np.cumsum(D[:-1], axis=0)

    def _coverage(self) -> np.ndarray:
        return self._rmatmat(np.ones((self.shape[0], 1)))[:, 0]

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(self._coverage())

    def _params(self) -> tuple[Any, ...]:
        return (self.n, self.lo, self.hi)

    def _sparse(self) -> sp.csr_array:
        lengths = self.hi - self.lo + 1
        rows = np.repeat(np.arange(self.shape[0]), lengths)
        starts = np.repeat(self.lo - np.cumsum(np.r_[0, lengths[:-1]]), lengths)
        cols = starts + np.arange(lengths.sum())
        return sp.csr_array((np.ones(rows.size), (rows, cols)), shape=self.shape)

    def gram(self) -> LinearQuery:
        if int((self.hi - self.lo + 1).sum()) <= 20_000_000:
            return Sparse(self._sparse()).gram()
        return super().gram()

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, "a RangeQueries")
        return np.asarray(self._sparse().toarray())


class AllRange(RangeQueries):
    """All ``n (n + 1) / 2`` intervals ``[i, j]``, ordered by ``i`` then ``j``."""

    def __init__(self, n: int):
        n = check_size(n, "AllRange")
        lo, hi = np.triu_indices(n)
        super().__init__(n, lo, hi)

    def _coverage(self) -> np.ndarray:
        j = np.arange(self.n, dtype=float)
        return (j + 1) * (self.n - j)

    def _params(self) -> tuple[Any, ...]:
        return (self.n,)

    def gram(self) -> LinearQuery:
        n = self.n
        if n * n > 4_000_000:
            return LinearQuery.gram(self)
        i = np.arange(n)
        return Dense((np.minimum.outer(i, i) + 1.0) * (n - np.maximum.outer(i, i)))

    def __repr__(self) -> str:
        return f"AllRange({self.n})"


class Diagonal(LinearQuery):
    """``diag(d)``: scales each cell, e.g. by an attribute's value for sum queries."""

    def __init__(self, d: Sequence[float] | np.ndarray):
        d_a = np.asarray(d, dtype=float).ravel()
        if d_a.size == 0:
            raise ArgumentError("Diagonal needs at least one entry")
        if not np.isfinite(d_a).all():
            raise ArgumentError("Diagonal entries must be finite")
        self.d = d_a
        self.shape = (d_a.size, d_a.size)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.d[:, None] * X
        return out

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return self._matmat(Y)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        shape = [1] * T.ndim
        shape[axis] = self.d.size
        out: np.ndarray = T * self.d.reshape(shape)
        return out

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(np.abs(self.d) ** p)

    def _params(self) -> tuple[Any, ...]:
        return (self.d,)

    @property
    def T(self) -> Diagonal:
        return self

    def gram(self) -> Diagonal:
        return Diagonal(self.d**2)

    def pinv(self) -> Diagonal:
        # the same cut-off as numpy.linalg.pinv: singular values below n * eps * max
        inv = np.zeros_like(self.d)
        cutoff = self.d.size * np.finfo(float).eps * np.abs(self.d).max()
        nz = np.abs(self.d) > cutoff
        inv[nz] = 1.0 / self.d[nz]
        return Diagonal(inv)

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, "a Diagonal")
        return np.diag(self.d)
