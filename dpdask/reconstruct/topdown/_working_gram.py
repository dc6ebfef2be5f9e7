"""The restricted union Gram on a working set of (child, cell) pairs, and its simplex projection.

An active-set fit (:mod:`dpdask.reconstruct.topdown._active`) keeps, of the ``K x |S|``
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
t_j}``: the cells in buckets of one padded width, each bucket's columns by sorting.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dpdask.errors import ArgumentError
from dpdask.reconstruct._kron_gram import ScaledKronGram
from dpdask.reconstruct._union_gram import ScaledUnionGram
from dpdask.reconstruct.topdown._fista import project_threshold

if TYPE_CHECKING:
    from dpdask.reconstruct._union_gram import _PartPlan

__all__ = ["WorkingGram", "WorkingSet", "segment_project", "segment_thresholds"]


class _Part:
    """One part of the union on the support: weights, marginal keys, factor Grams."""

    def __init__(self, plan: _PartPlan, multi: tuple[np.ndarray, ...], s: np.ndarray):
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
        self.last = 1
        if plan.factors is not None:
            g64 = ScaledKronGram(plan.factors, np.float64)
            self.kron = {np.dtype(np.float64): g64.factors}
            self.kron[np.dtype(np.float32)] = g64.with_dtype(np.float32).factors
            self.last = g64.factors[-1].shape[0]


class _PartSet:
    """A working set's pairs in one part: their marginal cells, laid out by fibres.

    The pairs' marginal cells (``ch * nm + cell``, on the part's whole marginal of every
    child) fall in fibres of its last axis; ``fibres`` are the occupied ones, and
    ``bins`` each pair's place in the compact ``(len(fibres), last)`` array that the
    contraction fills and the last factor multiplies. ``read`` is each pair's place in
    the whole ``(K, nm)`` product."""

    def __init__(self, part: _Part, ch: np.ndarray, cell: np.ndarray, K: int):
        self.w = part.w[cell]
        self.w_out = self.w * part.weight
        self.read = ch * part.nm + part.cells[part.key[cell]]
        self.fibres: np.ndarray | None
        if part.kron:
            rows, pos = np.divmod(self.read, part.last)
            occupied = np.zeros(K * part.nm // part.last, dtype=bool)
            occupied[rows] = True
            self.fibres = np.flatnonzero(occupied)
            local = np.cumsum(occupied) - 1
            self.bins = local[rows] * part.last + pos
            self.nbins = self.fibres.size * part.last
        else:  # no factor: the marginal itself
            self.fibres, self.bins, self.nbins = None, self.read, K * part.nm
        self.full: dict[np.dtype, list[np.ndarray]] = {}  # the whole marginals' arrays

    def product(self, part: _Part, v: np.ndarray, K: int, dtype: np.dtype) -> np.ndarray:
        """The part's product of the pairs' values ``v`` on the whole marginal of every
        child, ``(K * nm,)``, without the part's weight (only the occupied fibres are
        ever written before the leading factors, so the kept arrays stay zero
        elsewhere)."""
        X = np.bincount(self.bins, weights=self.w * v, minlength=self.nbins)
        factors = part.kron.get(dtype)
        if factors is None:
            return X
        X = X.astype(dtype, copy=False).reshape(-1, part.last)
        buffers = self.full.get(dtype)
        if buffers is None:  # [T, then one array per leading factor], kept between calls
            shape = (K * part.nm // part.last, part.last)
            buffers = self.full[dtype] = [np.zeros(shape, dtype=dtype)]
            buffers += [np.empty(K * part.nm, dtype=dtype) for _ in factors[:-1]]
        T = buffers[0]
        T[self.fibres] = X @ factors[-1].T
        out = T.reshape(-1)
        sizes = [F.shape[0] for F in factors]
        for i in reversed(range(len(factors) - 1)):  # as _kron_gram's, into kept arrays
            post = math.prod(sizes[i + 1 :])
            res = buffers[len(factors) - 1 - i].reshape(-1, sizes[i], post)
            np.matmul(factors[i], out.reshape(-1, sizes[i], post), out=res)
            out = res.reshape(-1)
        return out  # (the part's weight is in the readers' weights)


class WorkingSet:
    """Pairs ``(ch[i], cell[i])`` sorted by cell, then child; every cell present.

    Holds what products and projections on it reuse: per part its :class:`_PartSet`,
    and the cells' segments and buckets (:func:`segment_project`).
    """

    def __init__(self, gram: WorkingGram, ch: np.ndarray, cell: np.ndarray):
        self.ch, self.cell = ch.astype(np.intp), cell.astype(np.intp)
        self.size = self.ch.size
        self.parts = [_PartSet(part, self.ch, self.cell, gram.K) for part in gram.parts]
        self.starts = np.flatnonzero(np.r_[True, self.cell[1:] != self.cell[:-1]])
        if self.starts.size != gram.size:
            raise ArgumentError("every cell of the support needs a pair in the working set")
        count = np.diff(np.r_[self.starts, self.size])
        # segment_project's buckets: (width, cells, the (width, cells) places of their
        # pairs in v, padded with len(v))
        width = 1 << np.ceil(np.log2(count)).astype(np.int64)
        self.buckets = []
        for w in np.unique(width):
            cells = np.flatnonzero(width == w)
            first = self.starts[cells]
            if w == 1:
                self.buckets.append((1, cells, first))
                continue
            rows = np.arange(w)[:, None]
            gather = np.where(rows < count[cells], first + rows, self.size)
            self.buckets.append((int(w), cells, gather))


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

    def rows(self, ws: WorkingSet, v: np.ndarray, exact: bool = False) -> np.ndarray:
        """``H`` applied child by child to ``v`` (values on ``ws``), read on ``ws``:
        ``(ws.size,)`` float64 (the products in float32 unless ``exact``)."""
        dtype = np.dtype(np.float64 if exact else np.float32)
        out = np.zeros(ws.size)
        for part, ps in zip(self.parts, ws.parts, strict=True):
            out += ps.w_out * ps.product(part, v, self.K, dtype)[ps.read]
        return out

    def dense(self, ws: WorkingSet, v: np.ndarray, exact: bool = True) -> np.ndarray:
        """The same product read at every pair: ``(K, |S|)`` float64."""
        dtype = np.dtype(np.float64 if exact else np.float32)
        out = np.zeros((self.K, self.size))
        for part, ps in zip(self.parts, ws.parts, strict=True):
            full = ps.product(part, v, self.K, dtype).reshape(self.K, part.nm)
            out += (part.w * part.weight) * full[:, part.cells[part.key]]
        return out


def segment_thresholds(v: np.ndarray, ws: WorkingSet, t: np.ndarray) -> np.ndarray:
    """Each cell's threshold ``tau_j`` of :func:`segment_project` (``(|S|,)``)."""
    vext = np.append(v, -np.inf)
    tau = np.empty(t.size)
    for width, cells, gather in ws.buckets:
        if width == 1:
            tau[cells] = v[gather] - t[cells]
        else:
            tau[cells] = project_threshold(vext[gather], t[cells])[1]
    return tau


def segment_project(v: np.ndarray, ws: WorkingSet, t: np.ndarray) -> np.ndarray:
    """Each cell's pairs of ``v`` projected onto ``{u >= 0, sum u = t_j}`` (``t > 0``).

    The cells are taken in buckets of the same padded width (a power of two at least
    their number of pairs, the padding at minus infinity): in each, the columns of
    ``(width, cells)`` are projected at once by sorting
    (:func:`~dpdask.reconstruct.topdown._fista.project_threshold`), which gives each
    cell's threshold ``tau_j`` (:func:`segment_thresholds`); then ``u = max(v - tau,
    0)``. A cell of one pair is ``t_j``.
    """
    u: np.ndarray = np.maximum(v - segment_thresholds(v, ws, t)[ws.cell], 0.0)
    return u
