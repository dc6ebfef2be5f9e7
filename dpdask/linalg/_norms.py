"""Column norms of structured operators, and their maximum, without materialising.

The p-th power of the column p-norms of a Kronecker product is the Kronecker
product of its factors' (``||(A (x) B) e_ij||_p^p = ||A e_i||_p^p ||B e_j||_p^p``), and
for a vertical stack of parts with weights ``w_k`` it is the weighted sum
``sum_k |w_k|^p ||A_k e||_p^p``. So for a union of Kronecker products the vector of
column norms (to the p) is a sum of rank-one tensors over the domain's axes,
which :class:`NormTerms` stores as per-axis vectors.

Its maximum over all cells is found on a reduced grid: along each axis, cells
whose vectors agree in every term are interchangeable, so only one cell per
distinct column class is evaluated. The reduced grid is walked in blocks of at
most ``dpdask.sensitivity.block-elements`` entries.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask import config

__all__ = ["NormTerms", "kron_vector"]


@dataclass(frozen=True)
class NormTerms:
    """``sum_t coef[t] * kron(vecs[t][0], ..., vecs[t][d-1])`` over axes of ``sizes``."""

    sizes: tuple[int, ...]
    coefs: tuple[float, ...]
    vecs: tuple[tuple[np.ndarray, ...], ...]

    @classmethod
    def single(cls, vec: np.ndarray) -> NormTerms:
        vec = np.asarray(vec, dtype=float)
        return cls((vec.size,), (1.0,), ((vec,),))

    @property
    def n(self) -> int:
        return math.prod(self.sizes)

    def scale(self, c: float) -> NormTerms:
        return NormTerms(self.sizes, tuple(c * a for a in self.coefs), self.vecs)

    @staticmethod
    def kron(parts: Sequence[NormTerms]) -> NormTerms:
        """Terms of a Kronecker product from its factors' terms."""
        sizes = tuple(s for part in parts for s in part.sizes)
        coefs, vecs = [], []
        for combo in itertools.product(*(range(len(p.coefs)) for p in parts)):
            coefs.append(math.prod(p.coefs[i] for p, i in zip(parts, combo, strict=True)))
            vecs.append(tuple(v for p, i in zip(parts, combo, strict=True) for v in p.vecs[i]))
        return NormTerms(sizes, tuple(coefs), tuple(vecs))._merged()

    @staticmethod
    def union(parts: Sequence[NormTerms], weights: Sequence[float] | np.ndarray) -> NormTerms:
        """Terms of a stack of parts with the given weights (already raised to the p)."""
        axes = {p.sizes for p in parts}
        if len(axes) > 1:
            parts = [p.flattened() for p in parts]
        sizes = parts[0].sizes
        coefs = tuple(w * c for p, w in zip(parts, weights, strict=True) for c in p.coefs)
        vecs = tuple(v for p in parts for v in p.vecs)
        return NormTerms(sizes, coefs, vecs)._merged()

    def flattened(self) -> NormTerms:
        """The same terms over one flat axis (materialises a length-n vector)."""
        from dpdask.linalg._base import check_dense_size

        check_dense_size(self.n, "the column-norm vector of a union with unaligned parts")
        return NormTerms.single(self.evaluate())

    def _merged(self) -> NormTerms:
        """Combine terms with identical vectors (adding their coefficients)."""
        seen: dict[tuple[Any, ...], int] = {}
        coefs: list[float] = []
        vecs: list[tuple[np.ndarray, ...]] = []
        for c, vs in zip(self.coefs, self.vecs, strict=True):
            if c == 0:
                continue
            key = tuple(v.tobytes() for v in vs)
            if key in seen:
                coefs[seen[key]] += c
            else:
                seen[key] = len(coefs)
                coefs.append(c)
                vecs.append(vs)
        if not coefs:
            coefs, vecs = [0.0], [tuple(np.zeros(s) for s in self.sizes)]
        return NormTerms(self.sizes, tuple(coefs), tuple(vecs))

    def evaluate(self) -> np.ndarray:
        """The full flat vector (length n, C order)."""
        out = np.zeros(self.n)
        for c, vs in zip(self.coefs, self.vecs, strict=True):
            out += c * kron_vector(vs)
        return out

    def max(self) -> float:
        """The largest entry, evaluated on the grid of distinct column classes."""
        # per axis: matrix (terms x classes) of the distinct columns
        reduced = []
        for a in range(len(self.sizes)):
            M = np.stack([vs[a] for vs in self.vecs])  # (T, n_a)
            reduced.append(np.unique(M, axis=1))
        coefs = np.asarray(self.coefs)
        grid = [r.shape[1] for r in reduced]
        block = int(config.get("sensitivity.block-elements"))
        # split axes into a prefix walked by index and a suffix evaluated at once
        k = len(grid)
        while k > 0 and math.prod(grid[k - 1 :]) <= block:
            k -= 1
        best = -np.inf
        for prefix in itertools.product(*(range(g) for g in grid[:k])):
            c = coefs.copy()
            for a, i in enumerate(prefix):
                c = c * reduced[a][:, i]
            if k == len(grid):
                best = max(best, float(c.sum()))
                continue
            # sum_t c_t * outer(reduced[k][t], ..., reduced[d-1][t])
            acc = np.zeros(grid[k:])
            for t in range(len(c)):
                if c[t] != 0:
                    acc += c[t] * _outer([r[t] for r in reduced[k:]])
            best = max(best, float(acc.max()))
        return best


def _outer(vs: Sequence[np.ndarray]) -> np.ndarray:
    out = np.asarray(vs[0], dtype=float)
    for v in vs[1:]:
        out = np.multiply.outer(out, v)
    return out


def kron_vector(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """``kron(v_0, v_1, ...)`` as a flat float vector (C order); ``[1.0]`` for no vectors.

    Examples
    --------
    >>> kron_vector([np.array([1.0, 2.0]), np.array([1.0, 10.0])]).tolist()
    [1.0, 10.0, 2.0, 20.0]
    """
    if len(vectors) == 0:
        return np.ones(1)
    return _outer(vectors).ravel()
