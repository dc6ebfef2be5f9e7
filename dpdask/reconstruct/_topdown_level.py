"""What the children's fits of one top-down level share, and the Gram of one parent's support.

:class:`Level` holds the row-weighted strategy, the Jacobi scale ``s = diag(G)^-1/2``
and the scaled Gram ``G~ = S G S`` in one of three forms: a dense matrix (at most
:data:`DENSE_GRAM` cells), the Kronecker factors of a Kronecker strategy of small factors
(:mod:`dpdask.reconstruct._kron_gram`), or the strategy's structured ``gram()``, applied
to the whole domain and gathered. :meth:`Level.support` gives the products a fit needs
on the parent's support ``S``: :class:`SupportGram`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import row_weighted
from dpdask.reconstruct._kron_gram import scaled_kron_gram
from dpdask.reconstruct._topdown_admm import SimplexAdmm

__all__ = ["DENSE_GRAM", "GRAMS", "Level", "SupportGram"]

DENSE_GRAM = 2048
"""Levels with at most this many cells keep their scaled Gram dense (at most 32 MB)."""
GRAMS = ("auto", "dense", "kron", "full")

RowsOp = Callable[[np.ndarray], np.ndarray]


class SupportGram:
    """``H = G~[S, S]`` for one parent's support ``S`` (sorted cell indices).

    ``rows(U)`` is ``U H`` for rows ``U`` ``(k, |S|)`` in float64; ``fast_rows`` the
    same in the level's fast precision (float32 Kronecker products, else float64);
    ``sub(local, dtype)`` the product ``v -> H[local, local] v`` for a subset ``local``
    (sorted positions in ``S``), e.g. one child's free set.
    """

    def __init__(self, level: Level, idx: np.ndarray):
        self.level, self.idx, self.size = level, idx, idx.size
        self.rows = self._rows(np.float64)
        self.fast_rows = self._rows(np.float32) if level.kron is not None else self.rows

    def _rows(self, dtype: type) -> RowsOp:
        level, idx = self.level, self.idx
        if level.dense is not None:
            sub = np.ascontiguousarray(level.dense[np.ix_(idx, idx)])
            return lambda U: U @ sub
        if level.kron is not None:
            op = level.kron.restricted(idx, dtype)
            return lambda U: np.stack([np.asarray(op(u.astype(dtype)), dtype=float) for u in U])
        s = level.scale[idx]
        n, G = level.n, level.G

        def full(U: np.ndarray) -> np.ndarray:
            Z = np.zeros((U.shape[0], n))
            Z[:, idx] = U * s
            return G.apply(Z)[:, idx] * s

        return full

    def sub(self, local: np.ndarray, dtype: type) -> RowsOp:
        """``v -> H[local, local] v`` (``local`` sorted positions in ``S``), in ``dtype``."""
        level, cells = self.level, self.idx[local]
        if level.dense is not None:
            sub = np.ascontiguousarray(level.dense[np.ix_(cells, cells)], dtype=dtype)
            return lambda v: sub @ v
        if level.kron is not None:
            return level.kron.restricted(cells, dtype)
        full = self._rows(np.float64)
        size = self.size

        def gather(v: np.ndarray) -> np.ndarray:
            z = np.zeros((1, size))
            z[0, local] = v
            return full(z)[0, local].astype(dtype)

        return gather


class Level:
    """What every fit of one level shares: the row-weighted operator, the Jacobi scale,
    and the scaled Gram (dense when small, Kronecker factors when structured).

    Parameters
    ----------
    A : LinearQuery
        The level's strategy.
    weights : ndarray or float or None
        Its row weights.
    gram : {"auto", "dense", "kron", "full"}
        The form of the scaled Gram (``"kron"`` falls back to ``"full"`` for a strategy
        that is not a Kronecker product of small factors).
    """

    def __init__(self, A: LinearQuery, weights: np.ndarray | float | None, gram: str):
        if gram not in GRAMS:
            raise ValueError(f"unknown gram {gram!r}; use one of {', '.join(GRAMS)}")
        self.A, self.weights = A, weights
        self.Aw = row_weighted(A, weights)
        self.n = A.shape[1]
        d = self.Aw.column_norms(2) ** 2
        self.scale = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)
        self.G = self.Aw.gram()
        if gram == "auto":
            gram = "dense" if self.n <= DENSE_GRAM else "kron"
        self.kron = scaled_kron_gram(self.Aw, np.float32) if gram == "kron" else None
        if gram == "kron" and self.kron is None:
            gram = "full"
        self.kind = gram
        self.dense: np.ndarray | None = None
        if gram == "dense":
            Gd = self.G.dense()
            Gd = 0.5 * (Gd + Gd.T)
            self.dense = self.scale[:, None] * Gd * self.scale[None, :]

    @functools.cached_property
    def admm(self) -> SimplexAdmm | None:
        """The ADMM start of a Kronecker Gram (:mod:`._topdown_admm`), else None."""
        return None if self.kron is None else SimplexAdmm(self.kron)

    def support(self, idx: np.ndarray) -> SupportGram:
        """The products of a fit on the support ``idx`` (sorted cell indices)."""
        return SupportGram(self, idx)
