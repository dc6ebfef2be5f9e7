"""The Gram matrix ``G = W^T W`` of one workload factor, applied without forming it.

Strategy optimisation and error analytics only ever need a factor workload
through its Gram matrix: the reconstruction error of a strategy ``A`` is
``||W A^+||_F^2 = tr(G (A^T A)^+)``. :class:`Gram` keeps ``G`` as a weighted sum
of structured terms so that ``G @ X`` costs ``O(n k)`` for the closed-form
workloads (identity, total, prefix, all-range) and a dense product otherwise:

* prefix, ``P^T P``: ``G[a, b] = n - max(a, b)``, applied by two cumulative sums;
* all-range: ``G[a, b] = (min(a, b) + 1) (n - max(a, b))`` (the number of
  intervals covering both ``a`` and ``b``), applied as
  ``(G x)_i = (n - i) sum_{j <= i} (j + 1) x_j + (i + 1) sum_{j > i} (n - j) x_j``;
* total, ``1 1^T``, and identity.

Weighted sums of Gram matrices (the combined factor problems of OPT_x) stay in
this form, with all dense terms folded into one matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from dask.base import tokenize

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import (
    AllRange,
    Dense,
    Identity,
    LinearQuery,
    Ones,
    Prefix,
    Scaled,
    Sparse,
    VStack,
    check_dense_size,
)

__all__ = ["Gram"]

# Dense Gram matrices are formed up to this side length; beyond it a factor
# without a closed form is applied as ``W^T (W X)``.
_DENSE_GRAM_MAX_N = 4096
_STRUCTURED = ("identity", "ones", "prefix", "allrange")


def _rev_cumsum(X: np.ndarray) -> np.ndarray:
    return np.cumsum(X[::-1], axis=0)[::-1]


def _prefix_gram_matmat(X: np.ndarray) -> np.ndarray:
    return _rev_cumsum(np.cumsum(X, axis=0))


def _allrange_gram_matmat(X: np.ndarray) -> np.ndarray:
    n = X.shape[0]
    j = np.arange(n, dtype=float)[:, None]
    lower = np.cumsum((j + 1.0) * X, axis=0)  # sum_{j <= i} (j + 1) x_j
    upper = _rev_cumsum((n - j) * X)  # sum_{j >= i} (n - j) x_j
    upper = np.concatenate([upper[1:], np.zeros((1, X.shape[1]))], axis=0)  # j > i
    out: np.ndarray = (n - j) * lower + (j + 1.0) * upper
    return out


class Gram:
    """``G = sum_t c_t G_t``, an ``n x n`` Gram matrix kept as structured terms.

    Build it with :meth:`of` from a workload factor; combine with :meth:`combine`.

    Parameters
    ----------
    n : int
        Side length.
    terms : iterable of (float, str, object)
        ``(coefficient, kind, payload)`` with kind ``"identity"``, ``"ones"``,
        ``"prefix"``, ``"allrange"`` (payload ``None``), ``"dense"`` (an
        ``(n, n)`` array) or ``"operator"`` (a :class:`LinearQuery` ``W``, so
        that the term is ``W^T W``).
    """

    def __init__(self, n: int, terms: Iterable[tuple[float, str, object]]):
        self.n = int(n)
        merged: dict[str, float] = {}
        dense: np.ndarray | None = None
        ops: list[tuple[float, LinearQuery]] = []
        for c, kind, payload in terms:
            c = float(c)
            if c == 0:
                continue
            if kind in _STRUCTURED:
                merged[kind] = merged.get(kind, 0.0) + c
            elif kind == "dense":
                M = np.asarray(payload, dtype=float)
                if M.shape != (self.n, self.n):
                    raise ShapeError(f"dense Gram term has shape {M.shape}, expected n={self.n}")
                dense = c * M if dense is None else dense + c * M
            elif kind == "operator":
                ops.append((c, payload))  # type: ignore[arg-type]
            else:
                raise ArgumentError(f"unknown Gram term kind {kind!r}")
        self._structured = merged
        self._dense = dense
        self._ops = ops

    # -- construction ------------------------------------------------------
    @classmethod
    def of(cls, W: LinearQuery) -> Gram:
        """The Gram matrix ``W^T W`` of one factor of a workload."""
        n = W.shape[1]
        return cls(n, _terms_of(W, 1.0))

    @classmethod
    def combine(cls, coefs: Sequence[float] | np.ndarray, grams: Sequence[Gram]) -> Gram:
        """``sum_k coefs[k] * grams[k]`` (all of one size)."""
        sizes = {g.n for g in grams}
        if len(sizes) != 1:
            raise ShapeError(f"cannot combine Gram matrices of sizes {sorted(sizes)}")
        terms: list[tuple[float, str, object]] = []
        for c, g in zip(coefs, grams, strict=True):
            terms.extend((c * t, k, p) for t, k, p in g.terms())
        return cls(sizes.pop(), terms)

    def terms(self) -> list[tuple[float, str, object]]:
        out: list[tuple[float, str, object]] = [(c, k, None) for k, c in self._structured.items()]
        if self._dense is not None:
            out.append((1.0, "dense", self._dense))
        out.extend((c, "operator", W) for c, W in self._ops)
        return out

    def scaled(self, c: float) -> Gram:
        return Gram(self.n, [(c * t, k, p) for t, k, p in self.terms()])

    @property
    def is_structured(self) -> bool:
        """True when ``G @ X`` costs ``O(n k)`` (no dense or operator term)."""
        return self._dense is None and not self._ops

    # -- evaluation --------------------------------------------------------
    def matmat(self, X: np.ndarray) -> np.ndarray:
        """``G @ X`` for an ``(n, k)`` array."""
        X = np.asarray(X, dtype=float)
        out = np.zeros_like(X) if self._dense is None else self._dense @ X
        for kind, c in self._structured.items():
            if kind == "identity":
                out += c * X
            elif kind == "ones":
                out += c * X.sum(axis=0, keepdims=True)
            elif kind == "prefix":
                out += c * _prefix_gram_matmat(X)
            else:
                out += c * _allrange_gram_matmat(X)
        for c, W in self._ops:
            out += c * W._rmatmat(W._matmat(X))
        return out

    def diag(self) -> np.ndarray:
        """The diagonal of ``G`` (squared column norms of the workload)."""
        n = self.n
        k = np.arange(n, dtype=float)
        out = np.zeros(n) if self._dense is None else np.diag(self._dense).copy()
        for kind, c in self._structured.items():
            if kind in ("identity", "ones"):
                out += c
            elif kind == "prefix":
                out += c * (n - k)
            else:
                out += c * (k + 1.0) * (n - k)
        for c, W in self._ops:
            out += c * W.column_norms(2) ** 2
        return out

    def trace(self) -> float:
        return float(self.diag().sum())

    def total(self) -> float:
        """``1^T G 1 = ||W 1||^2``."""
        return float(self.matmat(np.ones((self.n, 1))).sum())

    def dense(self) -> np.ndarray:
        """``G`` as an ``(n, n)`` array (refuses beyond the configured size)."""
        check_dense_size(self.n * self.n, f"a {self.n} x {self.n} Gram matrix")
        if self.is_structured or self._ops:
            return self.matmat(np.eye(self.n))
        return self._dense.copy()  # type: ignore[union-attr]

    def eigvalsh(self) -> np.ndarray:
        """Eigenvalues of ``G`` (ascending), clipped at zero."""
        return np.clip(np.linalg.eigvalsh(self.dense()), 0.0, None)

    def __dask_tokenize__(self) -> str:
        return tokenize("dpdask.strategy.Gram", self.n, self.terms())

    def __repr__(self) -> str:
        kinds = [k for _, k, _ in self.terms()]
        return f"Gram(n={self.n}, terms={kinds})"


def _terms_of(W: LinearQuery, c: float) -> list[tuple[float, str, object]]:
    """Structured terms of ``c * W^T W``."""
    n = W.shape[1]
    if isinstance(W, Identity):
        return [(c, "identity", None)]
    if isinstance(W, Ones):
        return [(c * W.m, "ones", None)]
    if isinstance(W, Prefix):
        return [(c, "prefix", None)]
    if isinstance(W, AllRange):
        return [(c, "allrange", None)]
    if isinstance(W, Scaled):
        return _terms_of(W.A, c * W.c**2)
    if isinstance(W, VStack):
        out: list[tuple[float, str, object]] = []
        for part, w in zip(W.parts, W.weights, strict=True):
            out.extend(_terms_of(part, c * w**2))
        return out
    if isinstance(W, Dense):
        return [(c, "dense", W.matrix.T @ W.matrix)]
    if n <= _DENSE_GRAM_MAX_N:
        G = (W.matrix.T @ W.matrix).toarray() if isinstance(W, Sparse) else W.gram().dense()
        return [(c, "dense", np.asarray(G, dtype=float))]
    return [(c, "operator", W)]
