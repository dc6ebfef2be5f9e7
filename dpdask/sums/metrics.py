"""Error metrics and post-processing of noisy sums (paper 004, section 4)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError
from dpdask.reconstruct.isotonic import isotonic

__all__ = ["monotone", "relative_error"]


def relative_error(
    noisy: np.ndarray, true: np.ndarray, delta: float = 100.0
) -> NDArray[np.float64]:
    """``|y~ - y| / max(y, delta)`` elementwise (paper 004 uses ``delta = 100``).

    ``true`` broadcasts against ``noisy`` (e.g. ``(m,)`` against ``(trials, m)``).

    Examples
    --------
    >>> relative_error(np.array([110.0, 5.0]), np.array([100.0, 0.0])).tolist()
    [0.1, 0.05]
    """
    if not float(delta) > 0:
        raise ArgumentError(f"delta must be positive, got {delta!r}")
    y = np.asarray(true, dtype=float)
    err: NDArray[np.float64] = np.abs(np.asarray(noisy, dtype=float) - y) / np.maximum(
        y, float(delta)
    )
    return err


def monotone(answers: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Isotonic (non-decreasing) regression of noisy prefix sums, row by row.

    Parameters
    ----------
    answers : ndarray
        Shape ``(m,)`` or ``(g, m)``, prefixes in increasing order.
    weights : ndarray, optional
        Per-answer weights (``1 / variance``); default equal.
    """
    return isotonic(np.asarray(answers, dtype=float), increasing=True, weights=weights).x
