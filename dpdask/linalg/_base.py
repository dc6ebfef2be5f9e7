"""The abstract implicit linear query operator and its generic compositions.

Every operator is an ``m x n`` matrix that never has to exist as an array. An
operator implements ``_matmat`` (apply to the columns of an ``(n, k)`` array) and
``_rmatmat`` (apply its transpose); everything else (``@`` on vectors, matrices,
tensors and Dask arrays, ``.T``, ``gram``, ``dense``, ``sensitivity``, ``pinv``)
has a generic definition here that structured operators override with a cheaper
one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize
from numpy.typing import NDArray

from dpdask import config
from dpdask.errors import ArgumentError, ArgumentTypeError, ShapeError

if TYPE_CHECKING:
    from dpdask.linalg._norms import NormTerms

__all__ = ["LinearQuery", "Product", "Scaled", "Sum", "Transpose", "aslinearquery"]


def _check_p(p: float) -> int:
    if p not in (1, 2):
        raise ArgumentError(f"sensitivity is defined for p = 1 and p = 2, not p = {p!r}")
    return int(p)


def check_dense_size(n_elements: int, what: str) -> None:
    """Raise if materialising ``n_elements`` entries would exceed the configured limit."""
    limit = int(config.get("linalg.max-dense-elements"))
    if n_elements > limit:
        raise MemoryError(
            f"refusing to materialise {what} with {n_elements:,} entries "
            f"(limit {limit:,}; set dask config 'dpdask.linalg.max-dense-elements' to change it)"
        )


class LinearQuery:
    """An implicit ``m x n`` matrix of linear counting queries.

    Subclasses set ``shape`` and implement :meth:`_matmat` and :meth:`_rmatmat`;
    structured subclasses override the other private hooks with closed forms.

    The ``@`` operator accepts

    * another :class:`LinearQuery` (an implicit product),
    * a NumPy vector of length ``n`` (returns length ``m``),
    * a NumPy matrix of shape ``(n, k)`` (applied to each column, returns ``(m, k)``),
    * a Dask array of shape ``(n_geo, *domain.shape)`` or ``(n_geo, n)`` chunked
      along the geography axis (applied to each geography, returns ``(n_geo, m)``).
    """

    shape: tuple[int, int]
    __array_priority__ = 100  # so that ``ndarray @ op`` defers to ``op.__rmatmul__``

    # -- hooks for subclasses ------------------------------------------
    def _matmat(self, X: np.ndarray) -> np.ndarray:  # (n, k) -> (m, k)
        raise NotImplementedError

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:  # (m, k) -> (n, k)
        raise NotImplementedError

    def _params(self) -> tuple[Any, ...]:
        """A deterministic description used for tokenising and repr."""
        return (id(self),)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        """Apply along ``axis`` of tensor ``T`` (of length ``n`` there; ``m`` after)."""
        moved = np.moveaxis(T, axis, 0)
        rest = moved.shape[1:]
        out = self._matmat(moved.reshape(self.shape[1], -1))
        return np.moveaxis(out.reshape((self.shape[0], *rest)), 0, axis)

    def _norm_terms(self, p: int) -> NormTerms:
        """Column p-norms raised to the p as a sum of Kronecker-structured terms."""
        from dpdask.linalg._norms import NormTerms

        return NormTerms.single(self._column_norms_generic(p) ** p)

    # -- public interface ----------------------------------------------
    @property
    def T(self) -> LinearQuery:
        """The transpose, implicit."""
        return Transpose(self)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float64)

    @property
    def size(self) -> int:
        """Number of entries of the matrix this operator stands for."""
        return self.shape[0] * self.shape[1]

    def gram(self) -> LinearQuery:
        """``self.T @ self``, implicit where the structure allows."""
        return Product(self.T, self)

    def dense(self) -> NDArray[np.float64]:
        """Materialise as a dense array.

        Raises
        ------
        MemoryError
            If the matrix has more entries than ``dpdask.linalg.max-dense-elements``.
        """
        check_dense_size(self.size, f"a {self.shape[0]} x {self.shape[1]} {type(self).__name__}")
        return np.asarray(self._matmat(np.eye(self.shape[1])), dtype=float)

    def column_norms(self, p: float = 2) -> NDArray[np.float64]:
        """The L1 or L2 norm of every column, as a flat vector of length ``n``."""
        p = _check_p(p)
        return self._norm_terms(p).evaluate() ** (1.0 / p)

    def sensitivity(self, p: float = 1) -> float:
        """The largest L1 (``p=1``) or L2 (``p=2``) column norm.

        Computed from the structure (factor by factor for Kronecker products,
        part by part for unions); no matrix is materialised.
        """
        p = _check_p(p)
        return float(self._norm_terms(p).max() ** (1.0 / p))

    def pinv(self) -> LinearQuery:
        """The Moore-Penrose pseudo-inverse (factor-wise where structured, else dense)."""
        from dpdask.linalg._explicit import Dense

        check_dense_size(self.size, f"the pseudo-inverse of a {self.shape} {type(self).__name__}")
        return Dense(np.linalg.pinv(self.dense()))

    def apply(self, X: np.ndarray) -> NDArray[np.float64]:
        """Apply to each row of a batch: ``(g, n)`` or ``(g, *shape)`` -> ``(g, m)``.

        This is how the data of ``g`` geographies, stacked along the first axis,
        is mapped to query answers.
        """
        X = np.asarray(X)
        g = X.shape[0]
        if math.prod(X.shape[1:]) != self.shape[1]:
            raise ShapeError(
                f"operator has {self.shape[1]} columns but each geography has "
                f"shape {X.shape[1:]} ({math.prod(X.shape[1:])} cells)"
            )
        return self._apply_batch(X.reshape(g, self.shape[1]))

    def _apply_batch(self, X: np.ndarray) -> np.ndarray:
        return self._apply_axis(X, 1)

    # -- operators -----------------------------------------------------
    def __matmul__(self, other: Any) -> Any:
        if isinstance(other, LinearQuery):
            return self._compose(other)
        if _is_dask_array(other):
            from dpdask.linalg._geo import apply_per_geography

            return apply_per_geography(self, other)
        X = _as_numeric(other)
        if X.ndim == 1:
            if X.shape[0] != self.shape[1]:
                raise ShapeError(f"shape mismatch: operator {self.shape} @ vector {X.shape}")
            return self._matmat(X[:, None])[:, 0]
        if X.ndim == 2:
            if X.shape[0] != self.shape[1]:
                raise ShapeError(f"shape mismatch: operator {self.shape} @ matrix {X.shape}")
            return self._matmat(X)
        raise ShapeError(
            f"cannot apply a {self.shape} operator to an array of shape {X.shape}; "
            "use .apply() for a batch of geographies"
        )

    def __rmatmul__(self, other: Any) -> Any:
        X = _as_numeric(other)
        if X.ndim == 1:
            return self.T @ X
        if X.ndim == 2:
            return (self.T @ X.T).T
        raise ShapeError(f"cannot multiply an array of shape {X.shape} by an operator")

    def _compose(self, other: LinearQuery) -> LinearQuery:
        if self.shape[1] != other.shape[0]:
            raise ShapeError(f"shape mismatch: {self.shape} @ {other.shape}")
        return Product(self, other)

    def __mul__(self, c: Any) -> LinearQuery:
        if not _is_scalar(c):
            return NotImplemented
        return Scaled(self, float(c))

    __rmul__ = __mul__

    def __truediv__(self, c: Any) -> LinearQuery:
        if not _is_scalar(c):
            return NotImplemented
        return Scaled(self, 1.0 / float(c))

    def __add__(self, other: Any) -> LinearQuery:
        if not isinstance(other, LinearQuery):
            return NotImplemented
        return Sum([self, other])

    def __dask_tokenize__(self) -> str:
        return tokenize(type(self).__qualname__, self._params())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape})"

    # -- helpers -------------------------------------------------------
    def _column_norms_generic(self, p: int) -> np.ndarray:
        """Column norms by applying the operator to blocks of identity columns."""
        m, n = self.shape
        budget = int(config.get("linalg.max-dense-elements"))
        if m * n > 50 * budget:
            raise NotImplementedError(
                f"column norms of a {m} x {n} {type(self).__name__} have no structured form "
                "and the operator is too large to evaluate column by column"
            )
        block = max(1, budget // max(m, 1))
        out = np.empty(n)
        for start in range(0, n, block):
            stop = min(n, start + block)
            E = np.zeros((n, stop - start))
            E[np.arange(start, stop), np.arange(stop - start)] = 1.0
            cols = self._matmat(E)
            out[start:stop] = np.linalg.norm(cols, ord=p, axis=0) if p == 2 else np.abs(cols).sum(0)
        return out


def _is_scalar(c: Any) -> bool:
    # NumPy's test, as a plain bool: its type guard would narrow ``c`` to types
    # ``float()`` does not accept (complex, bytes)
    return bool(np.isscalar(c))


def _sum_arrays(arrays: Iterable[np.ndarray]) -> np.ndarray:
    """The sum of a non-empty iterable of arrays, as the built-in ``sum`` gives it."""
    total: Any = sum(arrays)
    return np.asarray(total)


def _is_dask_array(x: Any) -> bool:
    return type(x).__module__.startswith("dask.array") and hasattr(x, "chunks")


def _as_numeric(x: Any) -> np.ndarray:
    if hasattr(x, "todense") and not isinstance(x, np.ndarray):  # scipy / pydata sparse
        x = x.todense()
    X = np.asarray(x)
    if X.dtype == object:
        raise ArgumentTypeError("cannot apply an operator to an object array")
    return X


def aslinearquery(M: Any) -> LinearQuery:
    """Wrap a NumPy array, SciPy sparse matrix or ``LinearQuery`` as an operator."""
    from dpdask.linalg._explicit import Dense, Sparse

    if isinstance(M, LinearQuery):
        return M
    if hasattr(M, "tocsr") or type(M).__module__.startswith("sparse"):
        return Sparse(M)
    return Dense(np.asarray(M, dtype=float))


class Transpose(LinearQuery):
    """The transpose of an operator, applied through its ``_rmatmat``."""

    def __init__(self, base: LinearQuery):
        self.base = base
        self.shape = (base.shape[1], base.shape[0])

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self.base._rmatmat(X)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return self.base._matmat(Y)

    def _params(self) -> tuple[Any, ...]:
        return (self.base,)

    @property
    def T(self) -> LinearQuery:
        return self.base

    def gram(self) -> LinearQuery:
        return Product(self.base, self.base.T)

    def pinv(self) -> LinearQuery:
        return self.base.pinv().T

    def dense(self) -> np.ndarray:
        return self.base.dense().T


class Product(LinearQuery):
    """The implicit product ``A @ B``."""

    def __init__(self, A: LinearQuery, B: LinearQuery):
        if A.shape[1] != B.shape[0]:
            raise ShapeError(f"shape mismatch: {A.shape} @ {B.shape}")
        self.A, self.B = A, B
        self.shape = (A.shape[0], B.shape[1])

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self.A._matmat(self.B._matmat(X))

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return self.B._rmatmat(self.A._rmatmat(Y))

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        return self.A._apply_axis(self.B._apply_axis(T, axis), axis)

    def _params(self) -> tuple[Any, ...]:
        return (self.A, self.B)

    @property
    def T(self) -> LinearQuery:
        return Product(self.B.T, self.A.T)


class Scaled(LinearQuery):
    """``c * A`` for a scalar ``c``."""

    def __init__(self, A: LinearQuery, c: float):
        self.A, self.c = A, float(c)
        self.shape = A.shape

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self.c * self.A._matmat(X)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return self.c * self.A._rmatmat(Y)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        return self.c * self.A._apply_axis(T, axis)

    def _norm_terms(self, p: int) -> NormTerms:
        return self.A._norm_terms(p).scale(abs(self.c) ** p)

    def _params(self) -> tuple[Any, ...]:
        return (self.A, self.c)

    @property
    def T(self) -> LinearQuery:
        return Scaled(self.A.T, self.c)

    def gram(self) -> LinearQuery:
        return Scaled(self.A.gram(), self.c**2)

    def pinv(self) -> LinearQuery:
        if self.c == 0:
            from dpdask.linalg._explicit import Dense

            return Dense(np.zeros((self.shape[1], self.shape[0])))
        return Scaled(self.A.pinv(), 1.0 / self.c)

    def dense(self) -> np.ndarray:
        return self.c * self.A.dense()


class Sum(LinearQuery):
    """``A_1 + A_2 + ...`` of operators of one shape."""

    def __init__(self, terms: Sequence[LinearQuery]):
        terms = list(terms)
        if not terms:
            raise ArgumentError("Sum needs at least one term")
        shapes = {t.shape for t in terms}
        if len(shapes) != 1:
            raise ShapeError(f"Sum terms have different shapes: {sorted(shapes)}")
        self.terms = terms
        self.shape = terms[0].shape

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return _sum_arrays(t._matmat(X) for t in self.terms)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return _sum_arrays(t._rmatmat(Y) for t in self.terms)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        return _sum_arrays(t._apply_axis(T, axis) for t in self.terms)

    def _params(self) -> tuple[Any, ...]:
        return tuple(self.terms)

    @property
    def T(self) -> LinearQuery:
        return Sum([t.T for t in self.terms])

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, f"a {self.shape} Sum")
        return _sum_arrays(t.dense() for t in self.terms)
