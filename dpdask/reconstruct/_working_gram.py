"""The restricted union Gram on a working set of (child, cell) pairs, and its simplex projection.

An active-set fit (:mod:`dpdask.reconstruct._topdown_active`) keeps, of the ``K x |S|``
variables of a family (``K`` children on the parent's support ``S``), only a *working
set*: pairs ``(c, j)`` stored flat, sorted by cell and then child, every cell of ``S``
holding at least one. The others are zero.

:class:`WorkingGram` applies ``H = G~[S, S]`` of a union of Kronecker products (HDMM's
OPT_+) child by child to a vector on a working set, through the parts' marginals as
:class:`~dpdask.reconstruct._union_gram.RestrictedUnionGram` does, but with the
contraction and the expansion taken over the working set's pairs only (``np.bincount``
over ``K x m`` bins, ``m`` the part's marginal cells that ``S`` reaches, then one
gather), so that their cost grows with the pairs, not with ``K |S|``; the Kronecker
product of a part's other factor Grams runs on all ``K`` children's marginals at once
(one batched product, in float32 unless ``exact``), its last (largest) factor only on
the fibres the working set occupies. :meth:`WorkingGram.dense` reads the same product at
every pair (the whole family's gradient, for the optimality test and the pricing of the
pairs outside the working set).

:func:`segment_project` projects each cell's pairs onto its simplex ``{u >= 0, sum u =
t_j}`` (Michelot's algorithm, all cells at once: each pass sets a cell's threshold from
the pairs above the last one, which only rises, so that a few passes over the pairs
settle every cell).
"""

from __future__ import annotations

import math

import numpy as np

from dpdask.reconstruct._kron_gram import ScaledKronGram, _leading_modes
from dpdask.reconstruct._union_gram import ScaledUnionGram

__all__ = ["WorkingGram", "WorkingSet", "segment_project"]


class _Part:
    """One part of the union on the support: weights, marginal keys, factor Grams."""

    def __init__(self, plan, multi: tuple[np.ndarray, ...], s: np.ndarray):
        w = s.copy()
        for axis, r in plan.rank_one:
            w *= r[multi[axis]]
        if plan.keep:
            full = np.ravel_multi_index([multi[a] for a in plan.keep], plan.sizes)
        else:
            full = np.zeros(s.size, dtype=np.intp)
        self.cells, key = np.unique(full, return_inverse=True)
        self.key = key.reshape(-1).astype(np.intp)
        self.w, self.weight, self.m = w, float(plan.weight), self.cells.size
        self.nm = math.prod(plan.sizes) if plan.keep else 1
        self.kron: dict[np.dtype, list[np.ndarray]] = {}
        if plan.factors is not None:
            g64 = ScaledKronGram(plan.factors, np.float64)
            self.kron = {np.dtype(np.float64): g64.factors}
            self.kron[np.dtype(np.float32)] = g64.with_dtype(np.float32).factors

    def product(
        self, M: np.ndarray, fibres: np.ndarray | None, dtype: np.dtype, buffers: dict | None
    ) -> np.ndarray:
        """``M`` ``(K, m)`` (marginals on the reached cells) times the part's kept factor
        Grams and weight, on the reached cells. ``buffers`` (a working set's) keeps the
        whole marginal arrays between calls: only the reached cells and the occupied
        fibres are ever written, so the rest stays zero."""
        factors = self.kron.get(dtype)
        if factors is None:
            return M * self.weight
        K = M.shape[0]
        last = factors[-1].shape[0]
        if buffers is None:
            buffers = {}
        if "Z" not in buffers:
            buffers["Z"] = np.zeros((K, self.nm), dtype=dtype)
            if fibres is not None:
                buffers["T"] = np.zeros((K * self.nm // last, last), dtype=dtype)
        Z = buffers["Z"]
        Z[:, self.cells] = M
        Zf = Z.reshape(-1, last)
        if fibres is None:
            T = Zf @ factors[-1].T
        else:  # the last factor on the occupied fibres only
            T = buffers["T"]
            T[fibres] = Zf[fibres] @ factors[-1].T
        out = _leading_modes(factors, T).reshape(K, self.nm)[:, self.cells]
        out *= dtype.type(self.weight)
        return out


class WorkingSet:
    """Pairs ``(ch[i], cell[i])`` sorted by cell, then child; every cell present.

    Holds what products and projections on it reuse: per part the flat bins
    ``ch * m + key[cell]`` and weights, the occupied fibres, the cells' segments.
    """

    def __init__(self, gram: WorkingGram, ch: np.ndarray, cell: np.ndarray):
        self.ch, self.cell = ch.astype(np.intp), cell.astype(np.intp)
        self.size = self.ch.size
        self.bins, self.w, self.fibres = [], [], []
        for part in gram.parts:
            self.bins.append(self.ch * part.m + part.key[self.cell])
            self.w.append(part.w[self.cell])
            factors = part.kron.get(np.dtype(np.float32))
            fib = None
            if factors is not None:
                last = factors[-1].shape[0]
                full = self.ch * part.nm + part.cells[part.key[self.cell]]
                fib = np.unique(full // last)
                if fib.size > 0.6 * gram.K * part.nm // last:
                    fib = None  # most fibres occupied: the whole product
            self.fibres.append(fib)
        self.starts = np.flatnonzero(np.r_[True, self.cell[1:] != self.cell[:-1]])
        if self.starts.size != gram.size:
            raise ValueError("every cell of the support needs a pair in the working set")
        self.count = np.diff(np.r_[self.starts, self.size]).astype(float)
        self.buffers: list[dict] = [{} for _ in gram.parts]  # float32 products' arrays


class WorkingGram:
    """``H = G~[S, S]`` of a union Gram, child by child, on working sets (module notes).

    Parameters
    ----------
    union : ScaledUnionGram
        The level's Jacobi-scaled union Gram.
    idx : ndarray
        The support ``S`` (sorted cell indices).
    K : int
        The children.
    """

    def __init__(self, union: ScaledUnionGram, idx: np.ndarray, K: int):
        self.K, self.size = K, idx.size
        multi = np.unravel_index(idx, union.sizes)
        s = union.scale[idx]
        self.parts = [_Part(plan, multi, s) for plan in union._plans]

    def working_set(self, ch: np.ndarray, cell: np.ndarray) -> WorkingSet:
        return WorkingSet(self, ch, cell)

    def _marginals(self, ws: WorkingSet, v: np.ndarray, exact: bool) -> list[np.ndarray]:
        dtype = np.dtype(np.float64 if exact else np.float32)
        out = []
        parts = zip(self.parts, ws.bins, ws.w, ws.fibres, ws.buffers, strict=True)
        for part, bins, w, fib, buffers in parts:
            M = np.bincount(bins, weights=w * v, minlength=self.K * part.m)
            M = M.reshape(self.K, part.m).astype(dtype, copy=False)
            if exact:
                out.append(part.product(M, None, dtype, None))
            else:
                out.append(part.product(M, fib, dtype, buffers))
        return out

    def rows(self, ws: WorkingSet, v: np.ndarray, exact: bool = False) -> np.ndarray:
        """``H`` applied child by child to ``v`` (values on ``ws``), read on ``ws``:
        ``(ws.size,)`` float64 (the products in float32 unless ``exact``)."""
        out = np.zeros(ws.size)
        for M, bins, w in zip(self._marginals(ws, v, exact), ws.bins, ws.w, strict=True):
            out += w * M.reshape(-1)[bins]
        return out

    def dense(self, ws: WorkingSet, v: np.ndarray, exact: bool = True) -> np.ndarray:
        """The same product read at every pair: ``(K, |S|)`` float64."""
        out = np.zeros((self.K, self.size))
        for part, M in zip(self.parts, self._marginals(ws, v, exact), strict=True):
            out += part.w * M[:, part.key]
        return out


def segment_project(
    v: np.ndarray, ws: WorkingSet, t: np.ndarray, passes: list[int] | None = None
) -> np.ndarray:
    """Each cell's pairs of ``v`` projected onto ``{u >= 0, sum u = t_j}`` (``t > 0``).

    Michelot's algorithm on every cell at once: the threshold ``tau_j = (sum of the
    pairs above it - t_j) / their number`` starts from a lower bound (the larger of
    that over all pairs and the largest pair minus ``t_j``) and rises pass by pass
    until no pair drops below it; then ``u = max(v - tau, 0)``.
    ``passes``, if given, gets the number of passes appended.
    """
    starts, cell = ws.starts, ws.cell
    # two lower bounds of the threshold: from all the pairs, and from the largest
    # (which cannot exceed t_j once projected)
    tau = (np.add.reduceat(v, starts) - t) / ws.count
    np.maximum(tau, np.maximum.reduceat(v, starts) - t, out=tau)
    n = 0
    while True:
        n += 1
        above = v > tau[cell]
        count = np.add.reduceat(above.astype(np.float64), starts)
        total = np.add.reduceat(np.where(above, v, 0.0), starts)
        new = (total - t) / np.maximum(count, 1.0)
        if not (new > tau).any() or n >= 64:
            break
        np.maximum(new, tau, out=tau)
    if passes is not None:
        passes.append(n)
    return np.maximum(v - tau[cell], 0.0)
