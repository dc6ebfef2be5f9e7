"""One-dimensional range workloads: prefixes, all ranges, random ranges."""

from __future__ import annotations

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg import AllRange, Prefix, RangeQueries

__all__ = ["all_range", "prefix", "random_ranges"]


def prefix(n: int) -> Prefix:
    """The ``n`` prefix queries ``x_0 + ... + x_i`` (the empirical CDF), ``i = 0..n-1``.

    Examples
    --------
    >>> prefix(3).dense()
    array([[1., 0., 0.],
           [1., 1., 0.],
           [1., 1., 1.]])
    """
    return Prefix(n)


def all_range(n: int) -> AllRange:
    """All ``n (n + 1) / 2`` interval queries ``[i, j]``, ``0 <= i <= j < n``.

    Examples
    --------
    >>> all_range(4).shape
    (10, 4)
    """
    return AllRange(n)


def random_ranges(n: int, k: int, rng: np.random.Generator) -> RangeQueries:
    """``k`` interval queries with both end-points drawn uniformly from ``0..n-1``.

    As in paper 000 section 7.4 (after Yuan et al. 2012): two end-points are drawn
    independently and uniformly, and the query counts the closed interval between
    them.

    Parameters
    ----------
    n : int
        Domain size.
    k : int
        Number of queries.
    rng : numpy.random.Generator
        The source of randomness, passed in explicitly (workloads are public, so a
        seeded generator is fine; it is never used for noise).

    Raises
    ------
    ArgumentTypeError
        If ``rng`` is not a :class:`numpy.random.Generator`.
    ArgumentError
        If ``k < 1``.
    """
    if not isinstance(rng, np.random.Generator):
        raise ArgumentTypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ArgumentError(f"random_ranges needs k >= 1 queries, got {k!r}")
    ends = rng.integers(0, n, size=(2, int(k)))
    return RangeQueries(n, ends.min(axis=0), ends.max(axis=0))
