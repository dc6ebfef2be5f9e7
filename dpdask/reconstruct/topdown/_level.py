"""What the children's fits of one top-down level share, and the Gram of one parent's support.

:class:`Level` holds the row-weighted strategy, the Jacobi scale ``s = diag(G)^-1/2``
and the scaled Gram ``G~ = S G S`` in one of four forms (``kind``):

* ``"dense"``: a dense matrix (at most :data:`DENSE_GRAM` cells);
* ``"kron"``: the Kronecker factors of a Kronecker strategy of small factors
  (:mod:`dpdask.reconstruct._kron_gram`), whose products restricted to a set of cells
  cost a fraction of a full one, and whose eigenvectors give the ADMM start
  (:mod:`dpdask.reconstruct.topdown._admm`);
* ``"union"``: a union of Kronecker products (HDMM's OPT_+), its principal submatrix
  on the support applied through the parts' marginals, at a cost that grows with the
  support, not the domain (:meth:`~dpdask.reconstruct._union_gram.ScaledUnionGram.restricted`);
* ``"full"``: the strategy's structured ``gram()`` on the whole domain, scattered and
  gathered.

:meth:`Level.support` gives the products a fit needs on the parent's support ``S``:
:class:`SupportGram`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import row_weighted
from dpdask.reconstruct._kron_gram import ScaledKronGram, scaled_kron_gram
from dpdask.reconstruct._union_gram import (
    RestrictedUnionGram,
    ScaledUnionGram,
    scaled_union_gram,
)
from dpdask.reconstruct.topdown._admm import SimplexAdmm

__all__ = ["DENSE_GRAM", "GRAMS", "Level", "SupportGram"]

DENSE_GRAM = 2048
"""Levels with at most this many cells keep their scaled Gram dense (at most 32 MB)."""
GRAMS = ("auto", "dense", "kron", "full")

RowsOp = Callable[[np.ndarray], np.ndarray]


class SupportGram:
    """``H = G~[S, S]`` for one parent's support ``S`` (sorted cell indices).

    ``rows(U)`` is ``U H`` for rows ``U`` ``(k, |S|)`` in float64; ``fast_rows`` the
    same in the level's fast precision (float32 for a Kronecker or union Gram, else
    ``rows`` itself); ``sub(local, dtype)`` the product ``v -> H[local, local] v`` for a
    subset ``local`` (sorted positions in ``S``), e.g. one child's free set.
    """

    def __init__(self, level: Level, idx: np.ndarray):
        self.level, self.idx, self.size = level, idx, idx.size
        self._unions: dict[np.dtype, RestrictedUnionGram | None] = {}
        self.rows = self._rows(np.float64)
        fast = level.kind in ("kron", "union")
        self.fast_rows = self._rows(np.float32) if fast else self.rows

    def _rows(self, dtype: npt.DTypeLike) -> RowsOp:
        level, idx, n = self.level, self.idx, self.level.n
        if level.dense is not None:
            sub = np.ascontiguousarray(level.dense[np.ix_(idx, idx)])
            return lambda U: U @ sub
        if level.kron is not None:
            op = level.kron.restricted(idx, dtype)
            return lambda U: np.stack([np.asarray(op(u.astype(dtype)), dtype=float) for u in U])
        restricted = self._restricted(dtype)
        if restricted is not None:
            return lambda U: np.asarray(restricted.rows(U), dtype=float)
        s, G = level.scale[idx], level.G

        def full(U: np.ndarray) -> np.ndarray:
            Z = np.zeros((U.shape[0], n))
            Z[:, idx] = U * s
            out: np.ndarray = G.apply(Z)[:, idx] * s
            return out

        return full

    def _restricted(self, dtype: npt.DTypeLike) -> RestrictedUnionGram | None:
        """A union Gram restricted to ``S`` in ``dtype`` (built once), else None."""
        dt = np.dtype(dtype)
        if dt not in self._unions:
            union = self.level.unions.get(dt)
            self._unions[dt] = None if union is None else union.restricted(self.idx, dt)
        return self._unions[dt]

    def batched(self, locals_: list[np.ndarray], dtype: npt.DTypeLike) -> RowsOp | None:
        """For a union Gram: ``v -> (H[l_1, l_1] v_1, ..., H[l_k, l_k] v_k)`` on the
        concatenation of ``k`` vectors (``locals_`` sorted positions in ``S``), one
        product of ``k`` rows restricted to ``S`` instead of ``k`` of one row; None for
        the other Grams (their products restricted to each set are cheaper)."""
        restricted = self._restricted(dtype)
        if restricted is None:
            return None
        bounds = np.cumsum([0, *(local.size for local in locals_)])
        Z = np.zeros((len(locals_), self.size), dtype=dtype)

        def op(v: np.ndarray) -> np.ndarray:
            for c, local in enumerate(locals_):
                Z[c, local] = v[bounds[c] : bounds[c + 1]]
            R = restricted.rows(Z)
            return np.concatenate([R[c, local] for c, local in enumerate(locals_)]).astype(dtype)

        return op

    def sub(self, local: np.ndarray, dtype: npt.DTypeLike) -> RowsOp:
        """``v -> H[local, local] v`` (``local`` sorted positions in ``S``), in ``dtype``."""
        level, cells = self.level, self.idx[local]
        if level.dense is not None:
            sub = np.ascontiguousarray(level.dense[np.ix_(cells, cells)], dtype=dtype)
            return lambda v: sub @ v
        if level.kron is not None:
            return level.kron.restricted(cells, dtype)
        union = level.unions.get(np.dtype(dtype))
        if union is not None:
            restricted = union.restricted(cells, dtype)
            return lambda v: restricted(np.asarray(v, dtype=dtype))
        rows, size = self.rows, self.size

        def gather(v: np.ndarray) -> np.ndarray:
            z = np.zeros((1, size))
            z[0, local] = v
            out: np.ndarray = rows(z)[0, local].astype(dtype)
            return out

        return gather


class Level:
    """What every fit of one level shares: the row-weighted operator, the Jacobi scale,
    and the scaled Gram (module notes).

    Parameters
    ----------
    A : LinearQuery
        The level's strategy.
    weights : ndarray or float or None
        Its row weights.
    gram : {"auto", "dense", "kron", "full"}
        The form of the scaled Gram: ``"kron"`` is a Kronecker product of small factors
        or else a union of them (``kind`` ``"union"``), falling back to ``"full"``;
        ``"auto"`` is ``"dense"`` up to :data:`DENSE_GRAM` cells, else ``"kron"``.
    """

    def __init__(self, A: LinearQuery, weights: np.ndarray | float | None, gram: str):
        if gram not in GRAMS:
            raise ShapeError(f"unknown gram {gram!r}; use one of {', '.join(GRAMS)}")
        self.A, self.weights = A, weights
        self.Aw = row_weighted(A, weights)
        self.n = A.shape[1]
        d = self.Aw.column_norms(2) ** 2
        self.scale = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)
        self.G = self.Aw.gram()
        if gram == "auto":
            gram = "dense" if self.n <= DENSE_GRAM else "kron"
        self.kron = scaled_kron_gram(self.Aw, np.float32) if gram == "kron" else None
        self.unions: dict[np.dtype, ScaledUnionGram] = {}
        if gram == "kron" and self.kron is None:
            union = scaled_union_gram(self.Aw, np.float32)
            gram = "full" if union is None else "union"
            if union is not None:
                self.unions = {np.dtype(np.float32): union}
                self.unions[np.dtype(np.float64)] = union.with_dtype(np.float64)
        self.kind = gram
        self.dense: np.ndarray | None = None
        if gram == "dense":
            Gd = self.G.dense()
            Gd = 0.5 * (Gd + Gd.T)
            self.dense = self.scale[:, None] * Gd * self.scale[None, :]

    def gram_rows(self, V: np.ndarray) -> np.ndarray:
        """``V G~`` for rows ``V`` ``(k, n)`` on the whole domain, in float64."""
        if self.dense is not None:
            out: np.ndarray = V @ self.dense
            return out
        if self.kron is not None:
            return self._kron64.rows(V)
        if self.unions:
            return self.unions[np.dtype(np.float64)].rows(V)
        return self.G.apply(V * self.scale) * self.scale

    @functools.cached_property
    def _kron64(self) -> ScaledKronGram:
        if self.kron is None:
            raise ArgumentError("not a Kronecker Gram")
        return self.kron.with_dtype(np.float64)

    @functools.cached_property
    def admm(self) -> SimplexAdmm | None:
        """The ADMM start of a Kronecker Gram (:mod:`._topdown_admm`), else None."""
        return None if self.kron is None else SimplexAdmm(self.kron)

    def support(self, idx: np.ndarray) -> SupportGram:
        """The products of a fit on the support ``idx`` (sorted cell indices)."""
        return SupportGram(self, idx)

    def marginals(self, Z: np.ndarray, idx: np.ndarray) -> np.ndarray | None:
        """For a union Gram, each row of ``Z`` ``(k, n)`` (estimates on the whole domain)
        summed into the finest marginal among the parts' (their rank-one factors
        contracted), read at the marginal cell of each cell of ``idx``: ``(k, |idx|)``;
        else None. (A start splits the parent in proportion to them.)"""
        union = self.unions.get(np.dtype(np.float64))
        if union is None:
            return None
        plan = max(union._plans, key=lambda pl: math.prod(pl.sizes) if pl.keep else 1)
        if not plan.keep:
            return None
        k = Z.shape[0]
        T = np.asarray(Z, dtype=float).reshape(k, *union.sizes)
        for axis, r in sorted(plan.rank_one, key=lambda ar: -ar[0]):
            # (an eigenvector's sign is arbitrary: a total's weights are made positive)
            T = np.tensordot(T, r if r.sum() >= 0 else -r, axes=([axis + 1], [0]))
        multi = np.unravel_index(idx, union.sizes)
        key = np.ravel_multi_index([multi[a] for a in plan.keep], plan.sizes)
        return T.reshape(k, -1)[:, key]
