"""Isotonic regression by pool-adjacent-violators, for monotone answers such as prefix sums.

The weighted isotonic (increasing) fit of ``y`` minimises ``sum_i w_i (x_i - y_i)^2``
subject to ``x_1 <= x_2 <= ... <= x_m``. Pool-adjacent-violators (PAVA) keeps
blocks of consecutive entries sharing one value, the weighted mean of their
``y``; while two adjacent blocks are out of order it pools them. The result does
not depend on the order in which violators are pooled, so here every maximal
*decreasing run* of blocks is pooled at once -- one vectorised pass over all
blocks of all rows of a batch -- which is valid because pooling the first two
blocks of a strictly decreasing run leaves a mean that still exceeds the third.
A run of passes settles typical inputs (noisy prefix sums) in a few passes; an
adversarial input that would need many (one long cascade) is finished by the
classic sequential stack, so the cost stays ``O(m)`` passes at worst.
"""

from __future__ import annotations

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.reconstruct._report import ConvergenceReport, Estimate

__all__ = ["isotonic"]

_MAX_PASSES = 32  # vectorised passes before the sequential stack finishes the job


def isotonic(
    y: np.ndarray,
    increasing: bool = True,
    weights: np.ndarray | None = None,
) -> Estimate:
    """The weighted least-squares monotone fit of ``y`` (pool adjacent violators).

    Parameters
    ----------
    y : ndarray
        Values, shape ``(m,)``, or ``(g, m)`` for ``g`` independent rows (geographies).
    increasing : bool
        Fit a non-decreasing sequence (default) or a non-increasing one.
    weights : ndarray, optional
        Positive weights, usually ``1 / variance`` of each value: shape ``(m,)`` (shared
        by every row) or that of ``y``. Default all 1.

    Returns
    -------
    Estimate
        ``x`` of the shape of ``y``; the report's ``iterations`` counts the vectorised
        pooling passes and ``details["blocks"]`` the number of constant blocks.

    Raises
    ------
    ValueError
        If ``y`` or the weights are not finite, a weight is not positive, or the shapes
        do not match.

    Examples
    --------
    >>> isotonic(np.array([1.0, 3.0, 2.0, 4.0])).x.tolist()
    [1.0, 2.5, 2.5, 4.0]
    >>> isotonic(np.array([1.0, 3.0, 2.0]), weights=np.array([1.0, 1.0, 3.0])).x.tolist()
    [1.0, 2.25, 2.25]
    """
    Y = np.asarray(y, dtype=float)
    single = Y.ndim == 1
    if single:
        Y = Y[None, :]
    if Y.ndim != 2 or Y.shape[1] == 0:
        raise ShapeError(f"isotonic needs values of shape (m,) or (g, m), got {np.shape(y)}")
    if not np.isfinite(Y).all():
        raise ShapeError("isotonic: values contain NaN or infinite entries")
    g, m = Y.shape
    if weights is None:
        Wt = np.ones((g, m))
    else:
        w = np.asarray(weights, dtype=float)
        if w.shape not in ((m,), Y.shape, np.shape(y)):
            raise ShapeError(f"weights have shape {w.shape}; expected ({m},) or {np.shape(y)}")
        if not np.isfinite(w).all() or (w <= 0).any():
            raise ArgumentError("isotonic: weights must be positive and finite")
        Wt = np.broadcast_to(w, (g, m)).astype(float)
    sign = 1.0 if increasing else -1.0

    # blocks over the flattened batch; a block may not cross the start of a row
    wsum = Wt.ravel().copy()
    vsum = (sign * Y * Wt).ravel()
    length = np.ones(g * m, dtype=np.int64)
    row_start = np.zeros(g * m, dtype=bool)
    row_start[::m] = True
    passes = 0
    while True:
        mean = vsum / wsum
        viol = (mean[:-1] > mean[1:]) & ~row_start[1:]
        if not viol.any():
            break
        if passes == _MAX_PASSES:
            wsum, vsum, length = _stack_pool(wsum, vsum, length, row_start)
            passes += 1
            break
        passes += 1
        first = np.concatenate([[True], ~viol])  # blocks that start a pooled block
        idx = np.flatnonzero(first)
        wsum = np.add.reduceat(wsum, idx)
        vsum = np.add.reduceat(vsum, idx)
        length = np.add.reduceat(length, idx)
        row_start = row_start[idx]
    fitted = sign * np.repeat(vsum / wsum, length)
    report = ConvergenceReport(
        method="pava",
        converged=True,
        iterations=passes,
        details={"blocks": int(wsum.size), "sequential_finish": passes > _MAX_PASSES},
    )
    X = fitted.reshape(g, m)
    return Estimate(X[0] if single else X, report)


def _stack_pool(
    wsum: np.ndarray, vsum: np.ndarray, length: np.ndarray, row_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequential PAVA on blocks: push each block, pool while the top two are out of order."""
    W: list[float] = []
    V: list[float] = []
    N: list[int] = []
    bottom = 0  # stack index where the current row's blocks begin
    for w, v, n, new_row in zip(
        wsum.tolist(), vsum.tolist(), length.tolist(), row_start.tolist(), strict=True
    ):
        if new_row:
            bottom = len(W)
        W.append(w)
        V.append(v)
        N.append(n)
        while len(W) - bottom > 1 and V[-2] * W[-1] > V[-1] * W[-2]:  # mean[-2] > mean[-1]
            w_top, v_top, n_top = W.pop(), V.pop(), N.pop()
            W[-1] += w_top
            V[-1] += v_top
            N[-1] += n_top
    return np.array(W), np.array(V), np.array(N, dtype=np.int64)
