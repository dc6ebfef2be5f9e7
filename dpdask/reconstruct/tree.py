"""Hierarchical histograms: the tree of interval counts and its least-squares projection.

A hierarchical strategy over ``n`` ordered cells (Hay et al., 2010) measures the
count of every node of a ``b``-ary tree: the leaves are the cells, and each node
above groups ``b`` consecutive nodes of the level below (the last group of a level
may be smaller when ``n`` is not a power of ``b``). Rows are stored in
breadth-first order -- the root first, then each level left to right -- as in
section 3.3 of Lee, Wang and Kifer (paper 001).

A node vector ``v`` is *consistent* when every node equals the sum of its
children. The least-squares projection onto consistent vectors, weighted by the
inverse variance of each node, is Hay et al.'s two-pass algorithm (the ``H_tree``
of Algorithm 3 in paper 001), which :class:`HierarchicalTree` evaluates in
``O(m)`` per call: the projection is linear and its coefficients depend only on
the tree and the variances, so they are computed once.

* bottom-up, ``z_u = a_u v_u + (1 - a_u) s_u`` where ``s_u`` is the sum of the
  children's ``z``, ``w_u`` the sum of their variances ``var z_c`` and
  ``a_u = w_u / (var_u + w_u)``; ``var z_u = var_u w_u / (var_u + w_u)``;
* top-down, ``f_root = z_root`` and ``f_c = z_c + (var z_c / w_u) (f_u - s_u)``.

These are the same passes as :func:`dpdask.reconstruct.tree_consistent` (which
works on geography levels with arbitrary parents); here they are specialised to
consecutive grouping, so that each pass over a level is ``b`` strided additions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpdask.linalg import LinearQuery, RangeQueries, VStack

__all__ = ["HierarchicalTree"]


class HierarchicalTree:
    """The ``b``-ary tree of interval counts over ``n`` ordered cells.

    Parameters
    ----------
    n : int
        Number of leaves (cells of the histogram), at least 1.
    branching : int
        Fan-out ``b >= 2`` of every internal node.

    Attributes
    ----------
    n, branching : int
    shape : tuple of int
        ``(m, n)``: the strategy has one row per node.
    level_sizes : tuple of int
        Nodes per level, root first (the last entry is ``n``).
    offsets : ndarray
        Row offset of each level (length ``levels + 1``).
    lo, hi : ndarray
        The interval ``[lo, hi]`` (inclusive) of cells counted by each node, in row order.

    Examples
    --------
    >>> T = HierarchicalTree(4, branching=2)
    >>> T.level_sizes, T.shape
    ((1, 2, 4), (7, 4))
    >>> T.answers(np.array([1.0, 2.0, 3.0, 4.0])).tolist()
    [10.0, 3.0, 7.0, 1.0, 2.0, 3.0, 4.0]
    >>> v = np.array([11.0, 3.0, 7.0, 1.0, 2.0, 3.0, 4.0])  # the root is off by one
    >>> bool(np.allclose(T.answers(T.leaves(T.project(v))), T.project(v)))
    True
    """

    def __init__(self, n: int, branching: int = 2):
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"HierarchicalTree needs a positive number of leaves, got {n!r}")
        if isinstance(branching, bool) or not isinstance(branching, int | np.integer):
            raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
        if branching < 2:
            raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
        self.n, self.branching = int(n), int(branching)
        # build bottom-up: each level groups b consecutive nodes of the level below
        lo, hi = [np.arange(self.n)], [np.arange(self.n)]
        while lo[-1].size > 1:
            count = lo[-1].size
            first = np.arange(0, count, self.branching)
            last = np.minimum(first + self.branching, count) - 1
            lo.append(lo[-1][first])
            hi.append(hi[-1][last])
        # store root first
        self.level_sizes = tuple(int(a.size) for a in lo[::-1])
        self.offsets = np.concatenate([[0], np.cumsum(self.level_sizes)])
        self.lo = np.concatenate(lo[::-1])
        self.hi = np.concatenate(hi[::-1])
        self.shape = (int(self.offsets[-1]), self.n)
        self._unit: Callable[[np.ndarray], np.ndarray] | None = None

    # -- structure -----------------------------------------------------
    @property
    def m(self) -> int:
        """Number of nodes (rows of the strategy)."""
        return self.shape[0]

    @property
    def levels(self) -> int:
        """Number of levels, root and leaves included (the L1 sensitivity of the strategy)."""
        return len(self.level_sizes)

    def level_slices(self) -> list[slice]:
        """The rows of each level, root first."""
        bounds = zip(self.offsets[:-1], self.offsets[1:], strict=True)
        return [slice(int(a), int(b)) for a, b in bounds]

    def strategy(self) -> LinearQuery:
        """The strategy matrix: one :class:`~dpdask.linalg.RangeQueries` per level, root first."""
        parts = [RangeQueries(self.n, self.lo[s], self.hi[s]) for s in self.level_slices()]
        return VStack(parts, names=[f"level{i}" for i in range(len(parts))])

    def _check_rows(self, V: np.ndarray, rows: int, what: str) -> np.ndarray:
        V = np.asarray(V, dtype=float)
        if V.ndim not in (1, 2) or V.shape[0] != rows:
            raise ValueError(f"{what} must have shape ({rows},) or ({rows}, k); got {V.shape}")
        return V

    def answers(self, x: np.ndarray) -> np.ndarray:
        """Counts of every node for leaf values ``x`` of shape ``(n,)`` or ``(n, k)``."""
        x = self._check_rows(x, self.n, "leaf values")
        out = np.empty((self.m, *x.shape[1:]))
        out[self.offsets[-2] :] = x
        for lvl in range(self.levels - 2, -1, -1):
            child = out[self.offsets[lvl + 1] : self.offsets[lvl + 2]]
            out[self.offsets[lvl] : self.offsets[lvl + 1]] = self._group_sum(child)
        return out

    def leaves(self, V: np.ndarray) -> np.ndarray:
        """The leaf rows of a node vector ``(m,)`` or ``(m, k)``."""
        V = self._check_rows(V, self.m, "node values")
        return V[self.offsets[-2] :]

    def _group_sum(self, Z: np.ndarray) -> np.ndarray:
        """Sum every ``b`` consecutive rows (the last group may be shorter)."""
        b = self.branching
        full, rest = divmod(Z.shape[0], b)
        out = np.empty((full + (rest > 0), *Z.shape[1:]))
        head = out[:full]
        np.copyto(head, Z[0 : full * b : b])
        for j in range(1, b):  # strided adds: far faster than reduceat for small groups
            head += Z[j : full * b : b]
        if rest:
            out[full] = Z[full * b :].sum(axis=0)
        return out

    def _expand(self, R: np.ndarray, rows: int) -> np.ndarray:
        """Repeat each row of ``R`` for its ``b`` children: ``rows`` rows in all."""
        b = self.branching
        out = np.empty((rows, *R.shape[1:]))
        for j in range(b):
            out[j::b] = R[: len(range(j, rows, b))]
        return out

    # -- projection ----------------------------------------------------
    def _coefficients(self, var: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per level: the bottom-up weights ``a`` and the top-down shares."""
        var_l = [var[s] for s in self.level_slices()]
        L = self.levels
        vz: list[np.ndarray] = [None] * L  # type: ignore[list-item]
        w: list[np.ndarray] = [None] * L  # type: ignore[list-item]
        a: list[np.ndarray] = [None] * L  # type: ignore[list-item]
        vz[-1] = var_l[-1]
        for lvl in range(L - 2, -1, -1):
            w[lvl] = self._group_sum(vz[lvl + 1])
            a[lvl] = w[lvl] / (var_l[lvl] + w[lvl])
            vz[lvl] = var_l[lvl] * a[lvl]
        share = [None] + [vz[lvl] / self._expand(w[lvl - 1], vz[lvl].size) for lvl in range(1, L)]
        return a, share  # type: ignore[return-value]

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
            if self._unit is None:
                self._unit = self.projector()  # a common variance cancels out
            if variances is not None:
                self._node_variances(variances)  # validate
            return self._unit(V)
        return self.projector(variances)(V)

    def _two_pass(self, V: np.ndarray, a: list[np.ndarray], share: list[np.ndarray]) -> np.ndarray:
        sl = self.level_slices()
        tail = (slice(None),) + (None,) * (V.ndim - 1)  # broadcast per-node coefficients
        L = self.levels
        z: list[np.ndarray] = [None] * L  # type: ignore[list-item]
        s: list[np.ndarray] = [None] * L  # type: ignore[list-item]
        z[-1] = V[sl[-1]]
        for lvl in range(L - 2, -1, -1):
            s[lvl] = self._group_sum(z[lvl + 1])
            z[lvl] = s[lvl] + a[lvl][tail] * (V[sl[lvl]] - s[lvl])
        out = np.empty_like(V)
        out[sl[0]] = z[0]
        for lvl in range(1, L):
            resid = out[sl[lvl - 1]] - s[lvl - 1]
            out[sl[lvl]] = z[lvl] + share[lvl][tail] * self._expand(resid, z[lvl].shape[0])
        return out

    def _node_variances(self, variances: np.ndarray | float | None) -> np.ndarray:
        if variances is None:
            return np.ones(self.m)
        v = np.asarray(variances, dtype=float)
        if v.ndim == 0:
            v = np.full(self.m, float(v))
        elif v.shape == (self.levels,):
            v = np.repeat(v, self.level_sizes)
        elif v.shape != (self.m,):
            raise ValueError(
                f"variances must be a scalar, one per level ({self.levels}) or one per node "
                f"({self.m}); got shape {v.shape}"
            )
        if not np.isfinite(v).all() or (v <= 0).any():
            raise ValueError("node variances must be positive and finite")
        return v

    def __repr__(self) -> str:
        return f"HierarchicalTree(n={self.n}, branching={self.branching})"
