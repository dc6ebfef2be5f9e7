"""Operators stored as explicit arrays: dense NumPy and sparse SciPy / pydata-sparse."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.errors import ShapeError
from dpdask.linalg._base import LinearQuery, check_dense_size
from dpdask.linalg._norms import NormTerms

__all__ = ["Dense", "Sparse"]


class Dense(LinearQuery):
    """A matrix held as a dense 2-D NumPy array.

    Parameters
    ----------
    matrix : array_like
        The ``m x n`` matrix.
    """

    def __init__(self, matrix: Any):
        M = np.asarray(matrix, dtype=float)
        if M.ndim != 2:
            raise ShapeError(f"Dense needs a 2-D array, got shape {M.shape}")
        self.matrix = M
        self.shape = M.shape

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.matrix @ X
        return out

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.matrix.T @ Y
        return out

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        # first or last axis: one matrix product on a reshaped view (no copy); a
        # middle axis: a batched product for small factors, tensordot's single large
        # product (then a moved axis) for large ones
        shp = T.shape
        n, m = shp[axis], self.shape[0]
        pre, post = math.prod(shp[:axis]), math.prod(shp[axis + 1 :])
        out: np.ndarray
        if post == 1:
            out = T.reshape(pre, n) @ self.matrix.T
        elif n <= 4 and m <= 4:
            # tiny factor (sex, Hispanic origin): weighted sums of slices, no transposes
            T3 = T.reshape(pre, n, post)
            out = np.empty((pre, m, post), dtype=np.result_type(T.dtype, np.float64))
            for j in range(m):
                np.multiply(T3[:, 0, :], self.matrix[j, 0], out=out[:, j, :])
                for i in range(1, n):
                    out[:, j, :] += self.matrix[j, i] * T3[:, i, :]
        elif pre == 1:
            out = self.matrix @ T.reshape(n, post)
        elif n <= 256:
            # small factor on a middle axis (age, race of the CPH domain): a batched
            # product writes the result in place of the axis, with no transposed copy
            out = np.matmul(self.matrix, T.reshape(pre, n, post))
        else:
            moved: np.ndarray = np.moveaxis(
                np.tensordot(self.matrix, T, axes=([1], [axis])), 0, axis
            )
            return moved
        return out.reshape((*shp[:axis], m, *shp[axis + 1 :]))

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single((np.abs(self.matrix) ** p).sum(axis=0))

    def _params(self) -> tuple[Any, ...]:
        return (self.matrix,)

    @property
    def T(self) -> Dense:
        return Dense(self.matrix.T)

    def gram(self) -> Dense:
        return Dense(self.matrix.T @ self.matrix)

    def dense(self) -> np.ndarray:
        return self.matrix.copy()

    def pinv(self) -> Dense:
        return Dense(np.linalg.pinv(self.matrix))


class Sparse(LinearQuery):
    """A matrix held in compressed sparse row form.

    Parameters
    ----------
    matrix : scipy.sparse matrix or array, pydata ``sparse`` array, or array_like
        The ``m x n`` matrix.
    """

    def __init__(self, matrix: Any):
        if type(matrix).__module__.startswith("sparse"):  # pydata sparse
            matrix = matrix.tocsr() if hasattr(matrix, "tocsr") else matrix.to_scipy_sparse()
        M = sp.csr_array(matrix, dtype=float)
        self.matrix = M
        self.shape = M.shape

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ X)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix.T @ Y)

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single(np.asarray(abs(self.matrix).power(p).sum(axis=0)).ravel())

    def _params(self) -> tuple[Any, ...]:
        M = self.matrix
        return (M.shape, M.data, M.indices, M.indptr)

    @property
    def T(self) -> Sparse:
        return Sparse(self.matrix.T)

    def gram(self) -> Sparse:
        return Sparse(self.matrix.T @ self.matrix)

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, f"a {self.shape} Sparse")
        return np.asarray(self.matrix.toarray())
