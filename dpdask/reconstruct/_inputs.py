"""The inputs of the estimators: measurements as a batch of rows, weights as a row scaling."""

from __future__ import annotations

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import Diagonal, LinearQuery, Scaled, VStack

__all__ = ["as_batch", "row_weighted"]


def as_batch(y: np.ndarray, rows: int, what: str) -> tuple[np.ndarray, bool]:
    """``y`` as a ``(g, rows)`` float array, and whether it was a single vector."""
    Y = np.asarray(y, dtype=float)
    single = Y.ndim == 1
    if single:
        Y = Y[None, :]
    if Y.ndim != 2 or Y.shape[1] != rows:
        raise ShapeError(f"{what} have shape {np.shape(y)}; expected ({rows},) or (g, {rows})")
    if not np.isfinite(Y).all():
        raise ArgumentError(f"{what} contain NaN or infinite values")
    return Y, single


def row_weighted(A: LinearQuery, weights: np.ndarray | float | None) -> LinearQuery:
    """``diag(sqrt(weights)) A`` -- the operator whose plain LS solves the weighted problem."""
    if weights is None:
        return A
    w = np.asarray(weights, dtype=float)
    if w.ndim == 0:
        return Scaled(A, float(np.sqrt(w)))
    if w.shape != (A.shape[0],):
        raise ShapeError(f"weights have shape {w.shape}; expected ({A.shape[0]},) or a scalar")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ArgumentError("weights must be finite and non-negative")
    if isinstance(A, VStack):
        # constant weight within each part: keep the structure
        per_part = [w[s] for s in A.part_slices()]
        if all(np.all(p == p[0]) for p in per_part):
            weights = A.weights * np.sqrt([p[0] for p in per_part])
            return VStack(A.parts, weights=weights.tolist())
    scaled: LinearQuery = Diagonal(np.sqrt(w)) @ A
    return scaled
