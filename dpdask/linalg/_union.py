"""Unions of queries: operators stacked row-wise, with optional per-part weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg._base import LinearQuery, Scaled, Sum, check_dense_size
from dpdask.linalg._norms import NormTerms

__all__ = ["VStack"]


class VStack(LinearQuery):
    """The union ``[w_1 A_1; w_2 A_2; ...]`` of operators over one domain.

    Parameters
    ----------
    parts : sequence of LinearQuery
        Operators with the same number of columns.
    weights : sequence of float, optional
        A weight per part (default all 1); part ``k``'s rows are scaled by ``weights[k]``.
    names : sequence of str, optional
        A label per part (for example the Census table it encodes).

    Examples
    --------
    >>> from dpdask.linalg import Identity, Ones, VStack
    >>> W = VStack([Identity(3), Ones(3)], weights=[1.0, 2.0])
    >>> W @ np.array([1.0, 2.0, 3.0])
    array([ 1.,  2.,  3., 12.])
    """

    def __init__(
        self,
        parts: Sequence[LinearQuery],
        weights: Sequence[float] | np.ndarray | None = None,
        names: Sequence[str] | None = None,
    ):
        parts = list(parts)
        if not parts:
            raise ArgumentError("VStack needs at least one part")
        ncols = {p.shape[1] for p in parts}
        if len(ncols) != 1:
            raise ShapeError(f"VStack parts have different numbers of columns: {sorted(ncols)}")
        w = np.ones(len(parts)) if weights is None else np.asarray(weights, dtype=float).ravel()
        if w.shape != (len(parts),):
            raise ShapeError(f"VStack has {len(parts)} parts but {w.size} weights")
        if not np.isfinite(w).all():
            raise ArgumentError("VStack weights must be finite")
        if names is not None and len(names) != len(parts):
            raise ShapeError(f"VStack has {len(parts)} parts but {len(names)} names")
        self.parts = parts
        self.weights = w
        self.names = tuple(names) if names is not None else None
        self.offsets = np.cumsum([0] + [p.shape[0] for p in parts])
        self.shape = (int(self.offsets[-1]), parts[0].shape[1])

    def _weighted(self) -> list[LinearQuery]:
        pairs = zip(self.parts, self.weights, strict=True)
        return [p if w == 1 else Scaled(p, w) for p, w in pairs]

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        if self._kron_shape() is not None:
            return self._apply_axis(X, 0)
        return np.concatenate([p._matmat(X) for p in self._weighted()], axis=0)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        out = np.zeros((self.shape[1], Y.shape[1]))
        for p, a, b in zip(self._weighted(), self.offsets[:-1], self.offsets[1:], strict=True):
            out += p._rmatmat(Y[a:b])
        return out

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        from dpdask.linalg._kron import Kron

        in_shape = self._kron_shape()
        if in_shape is None:
            return np.concatenate([p._apply_axis(T, axis) for p in self._weighted()], axis=axis)
        # A union of Kronecker products over one domain (a Census workload): many
        # parts total out the same attributes, so each needed marginal of the data is
        # summed once, from the largest marginal already computed, and each part
        # applies only its remaining factors to that small tensor.
        shp = T.shape
        X = T.reshape((*shp[:axis], *in_shape, *shp[axis + 1 :]))
        memo: dict[frozenset[int], np.ndarray] = {frozenset(): X}
        outs = []
        krons = [p for p in self.parts if isinstance(p, Kron)]  # every part (_kron_shape)
        for part, w in zip(krons, self.weights, strict=True):
            totals = part.total_axes()
            R = part._apply_factors(_marginal(memo, totals, axis), axis, False, skip=totals)
            R = R.reshape((*shp[:axis], part.shape[0], *shp[axis + 1 :]))
            outs.append(R if w == 1 else w * R)
        return np.concatenate(outs, axis=axis)

    def _kron_shape(self) -> tuple[int, ...] | None:
        """The common factor sizes when every part is a Kron over them, else None."""
        from dpdask.linalg._kron import Kron

        shapes = {p.in_shape if isinstance(p, Kron) else None for p in self.parts}
        if len(shapes) != 1 or None in shapes:
            return None
        return shapes.pop()

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.union(
            [part._norm_terms(p) for part in self.parts], np.abs(self.weights) ** p
        )

    def _params(self) -> tuple[Any, ...]:
        return (tuple(self.parts), self.weights)

    def gram(self) -> LinearQuery:
        grams = [p.gram() for p in self._weighted()]
        return grams[0] if len(grams) == 1 else Sum(grams)

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, f"a {self.shape} VStack")
        return np.concatenate([p.dense() for p in self._weighted()], axis=0)

    def part_slices(self) -> list[slice]:
        """The rows of each part."""
        bounds = zip(self.offsets[:-1], self.offsets[1:], strict=True)
        return [slice(int(a), int(b)) for a, b in bounds]

    def __repr__(self) -> str:
        return f"VStack({len(self.parts)} parts, shape={self.shape})"


def _marginal(
    memo: dict[frozenset[int], np.ndarray], totals: frozenset[int], axis: int
) -> np.ndarray:
    """The data summed over the factor axes ``totals`` (kept as length 1), memoised."""
    if totals in memo:
        return memo[totals]
    base = max((k for k in memo if k <= totals), key=len)
    out: np.ndarray = memo[base].sum(
        axis=tuple(axis + i for i in sorted(totals - base)), keepdims=True
    )
    memo[totals] = out
    return out
