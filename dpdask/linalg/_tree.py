"""Interval trees: the nodes of a ``b``-ary tree of contiguous ranges over ordered cells.

The one construction behind the hierarchical strategies
(:func:`dpdask.strategy.baselines.hierarchical`, ``hb``) and the tree projection of
:class:`dpdask.reconstruct.HierarchicalTree`: rows root first, then each level left to
right (breadth-first order).
"""

from __future__ import annotations

import numpy as np

from dpdask.errors import ArgumentError
from dpdask.linalg._primitives import RangeQueries, check_size

__all__ = ["interval_tree", "tree_intervals"]


def tree_intervals(n: int, branching: int = 2, root: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The nodes of the ``branching``-ary interval tree over ``0..n-1``, level by level.

    The root covers every cell; each node of length ``L > 1`` has
    ``min(branching, L)`` children that split it into contiguous parts whose
    lengths differ by at most one (the longer ones first); cells are the leaves.
    This balanced split handles any ``n``: the height is the least ``h`` with
    ``branching**h >= n`` and every cell lies in at most ``h + 1`` nodes, as in
    the tree over ``n`` padded to ``branching**h``.

    Parameters
    ----------
    n : int
        Domain size.
    branching : int
        Children per node, at least 2.
    root : bool
        Include the root node (the total query).

    Returns
    -------
    lo, hi : ndarray of int
        Inclusive bounds of the nodes, root first, then each level left to right.

    Examples
    --------
    >>> lo, hi = tree_intervals(4)
    >>> [(int(a), int(b)) for a, b in zip(lo, hi)]
    [(0, 3), (0, 1), (2, 3), (0, 0), (1, 1), (2, 2), (3, 3)]
    """
    n = check_size(n, "tree_intervals", "domain size")
    if isinstance(branching, bool) or not isinstance(branching, int | np.integer) or branching < 2:
        raise ArgumentError(f"branching must be an integer >= 2, got {branching!r}")
    b = int(branching)
    levels_lo, levels_hi = [np.array([0])], [np.array([n - 1])]
    lo, hi = levels_lo[0], levels_hi[0]
    while True:
        length = hi - lo + 1
        split = length > 1
        if not split.any():
            break
        lo, length = lo[split], length[split]
        k = np.minimum(b, length)
        # child j of a node of length L into k parts: size L // k, plus one for j < L % k
        parent = np.repeat(np.arange(lo.size), k)
        j = np.arange(parent.size) - np.repeat(np.cumsum(k) - k, k)
        q, r = length[parent] // k[parent], length[parent] % k[parent]
        start = lo[parent] + j * q + np.minimum(j, r)
        size = q + (j < r)
        lo, hi = start, start + size - 1
        levels_lo.append(lo)
        levels_hi.append(hi)
    first = 0 if root else 1
    if first >= len(levels_lo):  # n == 1 without the root: the single cell is the root
        first = 0
    return np.concatenate(levels_lo[first:]), np.concatenate(levels_hi[first:])


def interval_tree(n: int, branching: int = 2, root: bool = True) -> RangeQueries:
    """The nodes of :func:`tree_intervals` as interval queries (one row per node).

    Examples
    --------
    >>> interval_tree(3).dense()
    array([[1., 1., 1.],
           [1., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.],
           [0., 1., 0.]])
    """
    lo, hi = tree_intervals(n, branching, root)
    return RangeQueries(n, lo, hi)
