"""Hierarchical histograms: the tree of interval counts and its least-squares projection.

A hierarchical strategy over ``n`` ordered cells (Hay et al., 2010) measures the
count of every node of a ``b``-ary interval tree. The tree is the one of
:func:`dpdask.strategy.baselines.hierarchical` (built by
:func:`~dpdask.linalg.tree_intervals`): the root covers every cell,
each node of length ``L > 1`` splits into ``min(b, L)`` contiguous children, and
the cells are the leaves (at different depths when ``n`` is not a power of
``b``). Rows are in breadth-first order -- the root first, then each level left to
right -- as in section 3.3 of Lee, Wang and Kifer (paper 001).

A node vector ``v`` is *consistent* when every node equals the sum of its
children. The least-squares projection onto consistent vectors, weighted by the
inverse variance of each node, is Hay et al.'s two-pass algorithm (the ``H_tree``
of Algorithm 3 in paper 001), evaluated here in ``O(m)``; it is linear, and its
coefficients depend only on the tree and the variances, so they are computed once:

* bottom-up, a leaf keeps ``z_u = v_u``; an internal node takes
  ``z_u = s_u + a_u (v_u - s_u)`` where ``s_u`` is the sum of its children's ``z``,
  ``w_u`` the sum of their variances ``var z_c`` and ``a_u = w_u / (var_u + w_u)``;
  then ``var z_u = var_u a_u``;
* top-down, ``f = z`` on the top level and ``f_c = z_c + (var z_c / w_u) (f_u - s_u)``.

These are the passes of :func:`dpdask.reconstruct.tree_consistent` (which works on
geography levels, every unit with a parent in the level above); here children are
contiguous runs of the next level and leaves may sit on any level, so a level's
child sums are strided additions (equal fan-outs) or one ``np.add.reduceat``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery, interval_tree, tree_intervals

__all__ = ["HierarchicalTree"]


@dataclass(frozen=True)
class _Level:
    """How one level's nodes own the next level's nodes (children are contiguous runs)."""

    rows: slice  # this level's rows
    split: np.ndarray  # positions (within the level) of the nodes that have children
    starts: np.ndarray  # first child of each split node, within the next level
    counts: np.ndarray  # children of each split node
    fanout: int  # the common number of children when every node splits equally, else 0


class HierarchicalTree:
    """The ``b``-ary interval tree over ``n`` ordered cells, with its tree projection.

    Parameters
    ----------
    n : int
        Number of cells (leaves), at least 1.
    branching : int
        Children per node, ``b >= 2``.
    root : bool
        Include the root (the total), as Hay et al. do.

    Attributes
    ----------
    n, branching : int
    shape : tuple of int
        ``(m, n)``: the strategy has one row per node.
    level_sizes : tuple of int
        Nodes per level, top first.
    lo, hi : ndarray
        The cells ``lo..hi`` (inclusive) counted by each node, in row order.

    Examples
    --------
    >>> T = HierarchicalTree(4, branching=2)
    >>> T.level_sizes, T.shape
    ((1, 2, 4), (7, 4))
    >>> T.answers(np.array([1.0, 2.0, 3.0, 4.0])).tolist()
    [10.0, 3.0, 7.0, 1.0, 2.0, 3.0, 4.0]
    >>> v = np.array([11.0, 3.0, 7.0, 1.0, 2.0, 3.0, 4.0])  # the root is off by one
    >>> p = T.project(v)
    >>> bool(np.allclose(T.answers(T.leaves(p)), p))
    True
    """

    def __init__(self, n: int, branching: int = 2, root: bool = True):
        lo, hi = tree_intervals(n, branching, root)  # validates n and branching
        self.n, self.branching, self.root = int(n), int(branching), bool(root)
        self.lo, self.hi = lo, hi
        self.shape = (int(lo.size), self.n)
        bounds = np.flatnonzero(np.diff(lo) <= 0) + 1  # lo increases within a level
        offsets = np.concatenate([[0], bounds, [lo.size]])
        self.level_sizes = tuple(int(s) for s in np.diff(offsets))
        self._levels: list[_Level] = []
        for i in range(len(self.level_sizes)):
            rows = slice(int(offsets[i]), int(offsets[i + 1]))
            if i + 1 < len(self.level_sizes):
                below = slice(int(offsets[i + 1]), int(offsets[i + 2]))
                parent = np.searchsorted(lo[rows], lo[below], side="right") - 1
                counts_all = np.bincount(parent, minlength=self.level_sizes[i])
            else:
                counts_all = np.zeros(self.level_sizes[i], dtype=np.int64)
            split = np.flatnonzero(counts_all)
            counts = counts_all[split]
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            even = split.size == self.level_sizes[i] and split.size and np.all(counts == counts[0])
            self._levels.append(_Level(rows, split, starts, counts, int(counts[0]) if even else 0))
        self._leaf_rows = np.flatnonzero(lo == hi)[np.argsort(lo[lo == hi], kind="stable")]
        self._unit: Callable[[np.ndarray], np.ndarray] | None = None

    # -- structure -----------------------------------------------------
    @property
    def m(self) -> int:
        """Number of nodes (rows of the strategy)."""
        return self.shape[0]

    @property
    def levels(self) -> int:
        """Number of levels (the L1 sensitivity of the strategy: a cell lies in one node each)."""
        return len(self.level_sizes)

    def level_slices(self) -> list[slice]:
        """The rows of each level, top first."""
        return [lvl.rows for lvl in self._levels]

    def strategy(self) -> LinearQuery:
        """The strategy matrix (:func:`~dpdask.linalg.interval_tree`, the one-attribute
        :func:`dpdask.strategy.baselines.hierarchical`)."""
        return interval_tree(self.n, self.branching, self.root)

    def _check_rows(self, V: np.ndarray, rows: int, what: str) -> np.ndarray:
        V = np.asarray(V, dtype=float)
        if V.ndim not in (1, 2) or V.shape[0] != rows:
            raise ShapeError(f"{what} must have shape ({rows},) or ({rows}, k); got {V.shape}")
        return V

    def answers(self, x: np.ndarray) -> np.ndarray:
        """Counts of every node for cell values ``x`` of shape ``(n,)`` or ``(n, k)``."""
        x = self._check_rows(x, self.n, "cell values")
        S = np.zeros((self.n + 1, *x.shape[1:]))
        np.cumsum(x, axis=0, out=S[1:])
        out: np.ndarray = S[self.hi + 1] - S[self.lo]
        return out

    def leaves(self, V: np.ndarray) -> np.ndarray:
        """The cells' rows of a node vector ``(m,)`` or ``(m, k)``, in cell order."""
        V = self._check_rows(V, self.m, "node values")
        return V[self._leaf_rows]

    # -- the two passes over levels -------------------------------------
    def _child_sum(self, lvl: _Level, Zc: np.ndarray) -> np.ndarray:
        """Sum of each split node's children (``Zc`` holds the next level)."""
        c = lvl.fanout
        if c:  # strided additions: much faster than reduceat for small groups
            out = Zc[0::c].copy()
            for j in range(1, c):
                out += Zc[j::c]
            return out
        return np.add.reduceat(Zc, lvl.starts, axis=0)

    def _expand(self, lvl: _Level, R: np.ndarray, rows: int) -> np.ndarray:
        """Give each child the value of its (split) parent."""
        c = lvl.fanout
        if c:
            out = np.empty((rows, *R.shape[1:]))
            for j in range(c):
                out[j::c] = R
            return out
        return np.repeat(R, lvl.counts, axis=0)

    def _coefficients(self, var: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per level: ``a`` of the split nodes and the top-down share of every node."""
        L = self.levels
        vz = [var[lvl.rows].copy() for lvl in self._levels]
        a: list[np.ndarray] = [np.empty(0)] * L
        w: list[np.ndarray] = [np.empty(0)] * L
        for i in range(L - 2, -1, -1):
            lvl = self._levels[i]
            w[i] = self._child_sum(lvl, vz[i + 1])
            v_split = var[lvl.rows][lvl.split]
            a[i] = w[i] / (v_split + w[i])
            vz[i][lvl.split] = v_split * a[i]
        share = [np.empty(0)] + [
            vz[i] / self._expand(self._levels[i - 1], w[i - 1], self.level_sizes[i])
            for i in range(1, L)
        ]
        return a, share

    def _two_pass(self, V: np.ndarray, a: list[np.ndarray], share: list[np.ndarray]) -> np.ndarray:
        L = self.levels
        tail = (slice(None),) + (None,) * (V.ndim - 1)  # broadcast per-node coefficients
        z = [V[lvl.rows].copy() for lvl in self._levels]
        s: list[np.ndarray] = [np.empty(0)] * L
        for i in range(L - 2, -1, -1):
            lvl = self._levels[i]
            s[i] = self._child_sum(lvl, z[i + 1])
            zi = z[i][lvl.split]
            z[i][lvl.split] = s[i] + a[i][tail] * (zi - s[i])
        out = np.empty_like(V)
        out[self._levels[0].rows] = z[0]
        for i in range(1, L):
            up = self._levels[i - 1]
            resid = out[up.rows][up.split] - s[i - 1]
            spread = self._expand(up, resid, self.level_sizes[i])
            out[self._levels[i].rows] = z[i] + share[i][tail] * spread
        return out

    # -- projection ----------------------------------------------------
    def projector(
        self, variances: np.ndarray | float | None = None
    ) -> Callable[[np.ndarray], np.ndarray]:
        """:meth:`project` with the variances fixed: the coefficients are computed once.

        Use it when projecting many vectors with the same variances (as ADMM does).
        """
        var = self._node_variances(variances)
        coefs = self._coefficients(var) if self.levels > 1 else None

        def project(V: np.ndarray) -> np.ndarray:
            V = self._check_rows(V, self.m, "node values")
            return V.copy() if coefs is None else self._two_pass(V, *coefs)

        return project

    def project(self, V: np.ndarray, variances: np.ndarray | float | None = None) -> np.ndarray:
        """The (weighted) least-squares projection of node values onto consistent trees.

        Parameters
        ----------
        V : ndarray
            Node values in row order, shape ``(m,)`` or ``(m, k)`` (``k`` trees at once).
        variances : float or ndarray, optional
            The variance of each node's measurement (a scalar, one per level, or one per
            node). The default, equal variances, is the Euclidean projection.

        Returns
        -------
        ndarray
            The consistent node values closest to ``V`` in the norm weighted by the
            inverse variances, of the shape of ``V``.
        """
        if variances is None or np.ndim(variances) == 0:
            if variances is not None:
                self._node_variances(variances)  # validate; a common variance cancels out
            if self._unit is None:
                self._unit = self.projector()
            return self._unit(V)
        return self.projector(variances)(V)

    def _node_variances(self, variances: np.ndarray | float | None) -> np.ndarray:
        if variances is None:
            return np.ones(self.m)
        v = np.asarray(variances, dtype=float)
        if v.ndim == 0:
            v = np.full(self.m, float(v))
        elif v.shape == (self.levels,):
            v = np.repeat(v, self.level_sizes)
        elif v.shape != (self.m,):
            raise ShapeError(
                f"variances must be a scalar, one per level ({self.levels}) or one per node "
                f"({self.m}); got shape {v.shape}"
            )
        if not np.isfinite(v).all() or (v <= 0).any():
            raise ArgumentError("node variances must be positive and finite")
        return v

    def __repr__(self) -> str:
        root = "" if self.root else ", root=False"
        return f"HierarchicalTree(n={self.n}, branching={self.branching}{root})"
