"""Kronecker products, applied to the data as a tensor one factor at a time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg._base import LinearQuery, check_dense_size
from dpdask.linalg._norms import NormTerms
from dpdask.linalg._primitives import Ones

__all__ = ["Kron"]


class Kron(LinearQuery):
    """``A_1 (x) A_2 (x) ... (x) A_d``, the product query over a multi-attribute domain.

    Row ``(r_1, ..., r_d)`` is the conjunction of row ``r_i`` of each factor; the
    flat index follows C order, as in :class:`dpdask.Domain`. Applied to data the
    operator reshapes the vector to the ``(n_1, ..., n_d)`` tensor and applies each
    factor along its own axis, so the Kronecker product never exists.

    Parameters
    ----------
    factors : sequence of LinearQuery
        One operator per attribute, in domain order.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Kron, Ones
    >>> K = Kron([Identity(2), Ones(3)])  # the marginal on the first attribute
    >>> K.shape
    (2, 6)
    >>> K @ np.arange(6.0)
    array([ 3., 12.])
    """

    def __init__(self, factors: Sequence[LinearQuery]):
        factors = list(factors)
        if not factors:
            raise ArgumentError("Kron needs at least one factor")
        for f in factors:
            if not isinstance(f, LinearQuery):
                raise ArgumentTypeError(f"Kron factors must be LinearQuery, got {type(f).__name__}")
        self.factors = factors
        self.shape = (
            math.prod(f.shape[0] for f in factors),
            math.prod(f.shape[1] for f in factors),
        )

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Sizes of the factors' domains (the tensor shape of the data)."""
        return tuple(f.shape[1] for f in self.factors)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)

    # -- application ---------------------------------------------------
    def _apply_factors(
        self, T: np.ndarray, offset: int, transpose: bool, skip: frozenset[int] = frozenset()
    ) -> np.ndarray:
        # Factors act on separate axes, so any order gives the same result; the
        # factors that shrink their axis most (totals, coarse groupings) go first,
        # so that the later ones act on a smaller tensor.
        ops = [f.T if transpose else f for f in self.factors]
        order = sorted(range(len(ops)), key=lambda i: ops[i].shape[0] / ops[i].shape[1])
        for i in order:
            if i not in skip:
                T = ops[i]._apply_axis(T, offset + i)
        return T

    def total_axes(self) -> frozenset[int]:
        """Positions of the factors that are a single total query (``Ones(n)``)."""
        return frozenset(
            i for i, f in enumerate(self.factors) if isinstance(f, Ones) and f.shape[0] == 1
        )

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        k = X.shape[1]
        T = self._apply_factors(X.reshape((*self.in_shape, k)), 0, transpose=False)
        return T.reshape(self.shape[0], k)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        k = Y.shape[1]
        T = self._apply_factors(Y.reshape((*self.out_shape, k)), 0, transpose=True)
        return T.reshape(self.shape[1], k)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        shp = T.shape
        T = T.reshape(shp[:axis] + self.in_shape + shp[axis + 1 :])
        T = self._apply_factors(T, axis, transpose=False)
        return T.reshape((*shp[:axis], self.shape[0], *shp[axis + 1 :]))

    def _apply_batch(self, X: np.ndarray) -> np.ndarray:
        return self._apply_axis(X, 1)

    # -- structure -----------------------------------------------------
    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.kron([f._norm_terms(p) for f in self.factors])

    def _params(self) -> tuple[Any, ...]:
        return tuple(self.factors)

    def _compose(self, other: LinearQuery) -> LinearQuery:
        if (
            isinstance(other, Kron)
            and len(other.factors) == len(self.factors)
            and self.in_shape == other.out_shape
        ):
            return Kron([a @ b for a, b in zip(self.factors, other.factors, strict=True)])
        return super()._compose(other)

    @property
    def T(self) -> Kron:
        return Kron([f.T for f in self.factors])

    def gram(self) -> Kron:
        return Kron([f.gram() for f in self.factors])

    def pinv(self) -> Kron:
        return Kron([f.pinv() for f in self.factors])

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, f"a {self.shape} Kron")
        return reduce(np.kron, [f.dense() for f in self.factors])

    def __repr__(self) -> str:
        return "Kron([" + ", ".join(repr(f) for f in self.factors) + "])"
