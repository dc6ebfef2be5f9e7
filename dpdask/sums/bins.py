"""Numeric attributes bucketized into bins with representative values (paper 004, section 2).

A numeric attribute (a weekly wage, say) is cut into ``k`` bins ``(l_j, u_j]``; a
record falls in the bin that contains its value and stands, in every sum, for the
bin's *representative value*, its upper end ``u_j`` (the paper's ``D_jj = u_j``).
With ``x`` the histogram of the records over the bins, the sum of the attribute
over the records that satisfy the predicates of a counting workload ``W`` is
``W D x``; truncating at ``theta`` replaces ``D`` by ``T = diag(min(u_j, theta))``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError, DataError, ShapeError
from dpdask.linalg import Diagonal, LinearQuery, RangeQueries

__all__ = ["NumericBins"]


class NumericBins:
    """Bins ``(edges[j], edges[j + 1]]`` of a numeric attribute, each represented by its upper end.

    Parameters
    ----------
    edges : array_like
        ``k + 1`` strictly increasing, finite bin edges. The first bin also takes
        the value ``edges[0]`` itself (it is ``[edges[0], edges[1]]``).

    Raises
    ------
    ArgumentError
        If the edges are not finite and strictly increasing, or fewer than two.

    Examples
    --------
    >>> bins = NumericBins.uniform(0, 100, 4)
    >>> bins.values.tolist()
    [25.0, 50.0, 75.0, 100.0]
    >>> bins.histogram([3.0, 25.0, 26.0, 99.5]).tolist()
    [2, 1, 0, 1]
    >>> bins.truncated(60.0).tolist()
    [25.0, 50.0, 60.0, 60.0]
    """

    def __init__(self, edges: Sequence[float] | np.ndarray):
        e = np.asarray(edges, dtype=float).ravel()
        if e.size < 2:
            raise ArgumentError("NumericBins needs at least two edges (one bin)")
        if not np.isfinite(e).all() or not (np.diff(e) > 0).all():
            raise ArgumentError("bin edges must be finite and strictly increasing")
        self.edges = e

    @classmethod
    def uniform(cls, low: float, high: float, k: int) -> NumericBins:
        """``k`` bins of equal width over ``[low, high]`` (e.g. 1,000 of $20 over [0, 20,000])."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ArgumentError(f"the number of bins must be a positive integer, got {k!r}")
        return cls(np.linspace(float(low), float(high), int(k) + 1))

    @property
    def size(self) -> int:
        """The number of bins ``k``."""
        return int(self.edges.size - 1)

    @property
    def values(self) -> np.ndarray:
        """The representative value of every bin: its upper end ``u_j``."""
        return self.edges[1:].copy()

    @property
    def top(self) -> float:
        """The largest representative value (the sensitivity of an untruncated total)."""
        return float(self.edges[-1])

    def index(self, data: Sequence[float] | np.ndarray) -> np.ndarray:
        """The bin of every value (``j`` with ``edges[j] < v <= edges[j + 1]``).

        Raises
        ------
        DataError
            If a value is not finite or lies outside ``[edges[0], edges[-1]]`` (a
            :class:`ValueError`).
        """
        v = np.asarray(data, dtype=float).ravel()
        if not np.isfinite(v).all():
            raise DataError("the values contain NaN or infinite entries")
        if v.size and (v.min() < self.edges[0] or v.max() > self.edges[-1]):
            raise DataError(
                f"values must lie in [{self.edges[0]}, {self.edges[-1]}]; got "
                f"[{v.min()}, {v.max()}] (widen the bins or clip the values first)"
            )
        j = np.searchsorted(self.edges, v, side="left") - 1
        return np.clip(j, 0, self.size - 1)

    def histogram(self, data: Sequence[float] | np.ndarray) -> np.ndarray:
        """The counts ``x`` of the values over the bins (int64, length :attr:`size`)."""
        return np.bincount(self.index(data), minlength=self.size).astype(np.int64)

    def truncated(self, theta: float) -> np.ndarray:
        """The truncated representative values ``min(u_j, theta)`` (the diagonal of ``T``).

        Raises
        ------
        ArgumentError
            If ``theta`` is not positive (``inf`` means no truncation).
        """
        return truncate_values(self.values, theta)

    def weights(self, theta: float | None = None) -> Diagonal:
        """``D`` (``theta=None``) or ``T = diag(min(u_j, theta))`` as an implicit diagonal."""
        return Diagonal(self.values if theta is None else self.truncated(theta))

    # -- workloads on the bins ----------------------------------------------------
    def prefixes(self, every: int = 1) -> RangeQueries:
        """The prefix queries ``[0, j]``, ``j = every - 1, 2 every - 1, ...`` (paper 004's Q1-Q3).

        ``every=1`` gives all ``k`` prefixes; ``every=10`` every 10th (Q2 on 1,000 bins).
        """
        if isinstance(every, bool) or int(every) != every or every < 1 or every > self.size:
            raise ArgumentError(f"every must be an integer in [1, {self.size}], got {every!r}")
        hi = np.arange(int(every) - 1, self.size, int(every))
        return RangeQueries(self.size, np.zeros_like(hi).tolist(), hi.tolist())

    def ranges(self, low: Sequence[float], high: Sequence[float]) -> RangeQueries:
        """Range queries over values: row ``i`` covers the bins inside ``(low[i], high[i]]``.

        The bounds are snapped to bin edges (a bin counts when its representative value
        is in ``(low, high]``).

        Raises
        ------
        ArgumentError
            If a range holds no bin.
        """
        lo_v = np.asarray(low, dtype=float).ravel()
        hi_v = np.asarray(high, dtype=float).ravel()
        if lo_v.shape != hi_v.shape:
            raise ShapeError("low and high have different lengths")
        u = self.values
        lo = np.searchsorted(u, lo_v, side="right")
        hi = np.searchsorted(u, hi_v, side="right") - 1
        if (hi < lo).any():
            bad = int(np.flatnonzero(hi < lo)[0])
            raise ArgumentError(f"range ({lo_v[bad]}, {hi_v[bad]}] holds no bin")
        return RangeQueries(self.size, lo.tolist(), hi.tolist())

    def __repr__(self) -> str:
        return f"NumericBins(k={self.size}, [{self.edges[0]:g}, {self.edges[-1]:g}])"


def truncate_values(values: np.ndarray, theta: float) -> NDArray[np.float64]:
    """``min(values, theta)``; ``theta`` must be positive (``inf``: no truncation)."""
    t = float(theta)
    if not t > 0:  # also refuses NaN
        raise ArgumentError(f"the truncation threshold must be positive, got {theta!r}")
    clipped: NDArray[np.float64] = np.minimum(np.asarray(values, dtype=float), t)
    return clipped


def weighted(workload: LinearQuery, weights: np.ndarray) -> LinearQuery:
    """``W diag(weights)`` as an implicit product."""
    w = np.asarray(weights, dtype=float).ravel()
    if workload.shape[1] != w.size:
        raise ShapeError(f"the workload has {workload.shape[1]} columns but {w.size} weights")
    product: LinearQuery = workload @ Diagonal(w)
    return product
