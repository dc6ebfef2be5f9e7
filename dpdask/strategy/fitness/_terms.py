"""The two structured pieces of the fitness-for-use problem: query rows and basis columns.

With ``W = L B`` and noise ``N(0, Sigma)`` on ``B x`` (paper 000, Definition 1), the
optimiser only ever needs two operations from each side:

* the rows ``l_i`` of ``L`` (the queries): ``diag(L S L^T)`` for a symmetric ``S``
  (the variances ``l_i^T Sigma l_i``, and the same map applied to a search
  direction) and the weighted Gram matrix ``L^T diag(w) L`` (gradient and
  Hessian of the variance soft max);
* the columns ``b_j`` of ``B`` (the cells): ``b_j^T X b_j`` for ``X = Sigma^-1``
  (the squared privacy profile) and ``B diag(u) B^T``.

:class:`ExplicitRows` holds ``L`` as a dense or sparse array. :class:`RangeRows`
keeps one-dimensional interval queries as their end-points and uses two-dimensional
prefix sums: ``l^T S l`` for the interval ``[lo, hi]`` is a four-term difference of
the cumulative sums of ``S``, and ``L^T diag(w) L`` is the double cumulative sum of
a four-point difference array, both in ``O(d^2 + m)`` whatever the lengths of the
intervals. :class:`MappedRows` composes a data-space term with a row-space basis.
:class:`IdentityColumns` and :class:`DenseColumns` are the two column terms.

:func:`canonical_problem` reduces any workload to its canonical form: ``B = I`` when
``W`` has full column rank, else the orthonormal basis ``Q`` of ``W``'s row space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dpdask.errors import ArgumentError
from dpdask.linalg import (
    Dense,
    Identity,
    LinearQuery,
    Prefix,
    RangeQueries,
    Scaled,
    Sparse,
    VStack,
    check_dense_size,
)

__all__ = [
    "Canonical",
    "DenseColumns",
    "ExplicitRows",
    "IdentityColumns",
    "MappedRows",
    "RangeRows",
    "canonical_problem",
    "merge_columns",
    "nuclear_bound",
    "row_term",
]

# Sparse storage is kept when fewer than this fraction of entries are non-zero.
_SPARSE_DENSITY = 0.25
# The certificate holds the query rows explicitly up to this many entries.
_MAX_EXPLICIT_ROWS = 1 << 25


class ExplicitRows:
    """Query rows held as a dense array or a SciPy CSR matrix (``m x r``)."""

    def __init__(self, L: np.ndarray | sp.csr_array):
        self.L: Any = L  # SciPy's sparse arrays are untyped
        self.m, self.r = L.shape

    def quad(self, S: np.ndarray) -> np.ndarray:
        """``diag(L S L^T)``."""
        LS = np.asarray(self.L @ S)
        if sp.issparse(self.L):
            return np.asarray(self.L.multiply(LS).sum(axis=1)).ravel()
        out: np.ndarray = np.einsum("ij,ij->i", LS, self.L)
        return out

    def times(self, F: np.ndarray) -> np.ndarray:
        """``L F`` as a dense array."""
        return np.asarray(self.L @ F)

    def gram(self, w: np.ndarray) -> np.ndarray:
        """``L^T diag(w) L``."""
        if sp.issparse(self.L):
            return np.asarray((self.L.T @ self.L.multiply(w[:, None])).todense())
        out: np.ndarray = self.L.T @ (w[:, None] * self.L)
        return out


class RangeRows:
    """Interval queries ``scale_k * 1[lo_k <= j <= hi_k]`` on an ordered domain of size ``d``."""

    def __init__(self, d: int, lo: np.ndarray, hi: np.ndarray, scale: np.ndarray):
        self.r = int(d)
        self.lo = np.asarray(lo, dtype=np.int64)
        self.hi1 = np.asarray(hi, dtype=np.int64) + 1
        self.scale2 = np.asarray(scale, dtype=float) ** 2
        self.m = self.lo.size

    def quad(self, S: np.ndarray) -> np.ndarray:
        """``diag(L S L^T)`` from the two-dimensional prefix sums of ``S``."""
        d = self.r
        P = np.zeros((d + 1, d + 1))
        np.cumsum(np.cumsum(S, axis=0), axis=1, out=P[1:, 1:])
        lo, hi = self.lo, self.hi1
        return self.scale2 * (P[hi, hi] - P[lo, hi] - P[hi, lo] + P[lo, lo])

    def times(self, F: np.ndarray) -> np.ndarray:
        """``L F`` as a dense array: differences of the cumulative sums of ``F``'s rows."""
        P = np.zeros((self.r + 1, F.shape[1]))
        np.cumsum(F, axis=0, out=P[1:])
        out: np.ndarray = np.sqrt(self.scale2)[:, None] * (P[self.hi1] - P[self.lo])
        return out

    def gram(self, w: np.ndarray) -> np.ndarray:
        """``L^T diag(w) L``: cumulative sums of a four-point difference array."""
        d1 = self.r + 1
        w = self.scale2 * w
        lo, hi = self.lo, self.hi1
        idx = np.concatenate([lo * d1 + lo, lo * d1 + hi, hi * d1 + lo, hi * d1 + hi])
        val = np.concatenate([w, -w, -w, w])
        E = np.bincount(idx, weights=val, minlength=d1 * d1).reshape(d1, d1)
        return np.cumsum(np.cumsum(E, axis=0), axis=1)[: self.r, : self.r]


class MappedRows:
    """A data-space row term seen through a row-space basis ``Q`` (``r x d``): ``L = W Q^T``."""

    def __init__(self, inner: ExplicitRows | RangeRows, Q: np.ndarray):
        self.inner, self.Q = inner, Q
        self.m, self.r = inner.m, Q.shape[0]

    def quad(self, S: np.ndarray) -> np.ndarray:
        return self.inner.quad(self.Q.T @ S @ self.Q)

    def times(self, F: np.ndarray) -> np.ndarray:
        return self.inner.times(self.Q.T @ F)

    def gram(self, w: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.Q @ self.inner.gram(w) @ self.Q.T
        return out


RowTerm = ExplicitRows | RangeRows | MappedRows


class IdentityColumns:
    """The columns of ``B = I``: ``b_j^T X b_j = X_jj``."""

    def __init__(self, r: int):
        self.r = self.d = int(r)

    def quad(self, X: np.ndarray) -> np.ndarray:
        return np.diagonal(X).copy()

    def quad_inverse(self, Rinv: np.ndarray) -> np.ndarray:
        """``b_j^T X b_j`` for ``X = Rinv Rinv^T``: the squared row norms of ``Rinv``."""
        out: np.ndarray = np.einsum("ij,ij->i", Rinv, Rinv)
        return out

    def gram(self, u: np.ndarray) -> np.ndarray:
        return np.diag(u)

    def sandwich(self, X: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``X B diag(u) B^T X``."""
        out: np.ndarray = (X * u) @ X
        return out

    def whiten(self, T: np.ndarray) -> np.ndarray:
        """``T B``."""
        return T


class DenseColumns:
    """The columns of a dense basis ``B`` (``r x d``)."""

    def __init__(self, B: np.ndarray):
        self.B = np.asarray(B, dtype=float)
        self.r, self.d = self.B.shape

    def quad(self, X: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.einsum("ij,ij->j", self.B, X @ self.B)
        return out

    def quad_inverse(self, Rinv: np.ndarray) -> np.ndarray:
        Z = Rinv.T @ self.B
        out: np.ndarray = np.einsum("ij,ij->j", Z, Z)
        return out

    def gram(self, u: np.ndarray) -> np.ndarray:
        out: np.ndarray = (self.B * u) @ self.B.T
        return out

    def sandwich(self, X: np.ndarray, u: np.ndarray) -> np.ndarray:
        XB = X @ self.B
        out: np.ndarray = (XB * u) @ XB.T
        return out

    def whiten(self, T: np.ndarray) -> np.ndarray:
        out: np.ndarray = T @ self.B
        return out


ColumnTerm = IdentityColumns | DenseColumns


# -- building the terms from an implicit workload -------------------------------------
def _ranges(W: LinearQuery) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(d, lo, hi, scale)`` when ``W`` is a (weighted stack of) 1-D interval operators."""
    if isinstance(W, Prefix):
        return W.n, np.zeros(W.n, dtype=np.int64), np.arange(W.n), np.ones(W.n)
    if isinstance(W, RangeQueries):  # AllRange included
        return W.n, W.lo, W.hi, np.ones(W.shape[0])
    if isinstance(W, Scaled):
        inner = _ranges(W.A)
        return None if inner is None else (*inner[:3], W.c * inner[3])
    if isinstance(W, VStack):
        found = [_ranges(p) for p in W.parts]
        parts = [p for p in found if p is not None]
        if len(parts) != len(found):
            return None
        d = parts[0][0]
        return (
            d,
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
            np.concatenate([w * p[3] for p, w in zip(parts, W.weights, strict=True)]),
        )
    return None


def _explicit(W: LinearQuery) -> np.ndarray | sp.csr_array:
    """``W`` as a CSR matrix when sparse enough, else as a dense array."""
    if isinstance(W, Sparse):
        M = W.matrix
        if M.nnz <= _SPARSE_DENSITY * W.size:
            return sp.csr_array(M)
        return M.toarray()
    check_dense_size(W.size, f"the {W.shape[0]} x {W.shape[1]} workload of a dense fitness solve")
    M = W.dense()
    if np.count_nonzero(M) <= _SPARSE_DENSITY * M.size:
        return sp.csr_array(M)
    return M


def row_term(W: LinearQuery) -> ExplicitRows | RangeRows:
    """The data-space row term of a workload (interval structure kept where present)."""
    ranges = _ranges(W)
    if ranges is not None:
        return RangeRows(*ranges)
    return ExplicitRows(_explicit(W))


def merge_columns(rows: ExplicitRows | RangeRows) -> tuple[ExplicitRows | RangeRows, np.ndarray]:
    """Merge cells whose columns of ``W`` are equal and drop cells no query touches.

    Returns the rows on the merged domain and ``classes``: ``classes[j]`` is the
    merged cell of cell ``j``, ``-1`` if its column is zero. Cells with equal columns
    have equal columns in every basis of ``W``'s row space, hence the same privacy
    profile entry, and cells with zero columns have zero columns in every basis (their
    profile entry is 0), so the merged problem is the same problem, exactly. Interval
    queries merge the cells between consecutive end-points and stay intervals.
    """
    d = rows.r
    if isinstance(rows, RangeRows):
        cuts = np.unique(np.concatenate([[0, d], rows.lo, rows.hi1]))
        classes = np.searchsorted(cuts, np.arange(d), side="right") - 1
        lo, hi = classes[rows.lo], classes[rows.hi1 - 1]
        n = cuts.size - 1
        cover = np.cumsum(np.bincount(lo, minlength=n + 1) - np.bincount(hi + 1, minlength=n + 1))
        kept = np.flatnonzero(cover[:n] > 0)
        renumber = np.full(n, -1)
        renumber[kept] = np.arange(kept.size)
        merged = RangeRows(kept.size, renumber[lo], renumber[hi], np.sqrt(rows.scale2))
        return merged, renumber[classes]
    L = rows.L
    C = sp.csc_array(L) if sp.issparse(L) else None
    if C is not None:
        C.sort_indices()
    seen: dict[bytes, int] = {}
    classes = np.empty(d, dtype=np.int64)
    for j in range(d):
        if C is not None:
            a, b = C.indptr[j], C.indptr[j + 1]
            nz = C.data[a:b] != 0
            key = C.indices[a:b][nz].tobytes() + b"|" + C.data[a:b][nz].tobytes()
            empty = not nz.any()
        else:
            col = L[:, j]
            key = col.tobytes()
            empty = not col.any()
        classes[j] = -1 if empty else seen.setdefault(key, len(seen))
    first = np.unique(classes[classes >= 0], return_index=True)[1]
    cells = np.flatnonzero(classes >= 0)[first]
    if C is not None:
        return ExplicitRows(sp.csr_array(C[:, cells])), classes
    return ExplicitRows(np.ascontiguousarray(L[:, cells])), classes


@dataclass
class Canonical:
    """A workload in canonical form: ``W = L B`` with ``B`` chosen for the optimiser.

    Cells with equal columns are merged (:func:`merge_columns`); on the merged domain
    the basis is the identity when the merged workload has full column rank, else an
    orthonormal basis ``Q`` of its row space. ``rows`` is ``L`` (``m x r``) and ``cols``
    the columns of the basis on the merged domain (one per class of cells). On the
    original domain the basis is ``basis`` (``r x d``: ``Q M`` or ``M`` with ``M`` the
    class indicator, or the identity) with the right inverse ``right_inverse``
    (``d x r``, ``None`` for the identity): ``W = L B`` and ``L = W B^#``.
    """

    rows: RowTerm
    cols: ColumnTerm
    basis: LinearQuery
    right_inverse: np.ndarray | None
    d: int
    representatives: np.ndarray | None = None  # a cell of each merged class

    def on_cells(self, u: np.ndarray) -> np.ndarray:
        """A vector over the merged classes as one over the cells (on one cell per class)."""
        if self.representatives is None:
            return u
        out = np.zeros(self.d)
        out[self.representatives] = u
        return out

    @property
    def rank(self) -> int:
        return self.rows.r


def _row_space(rows: ExplicitRows | RangeRows) -> np.ndarray:
    """Orthonormal basis of the row space of the data-space rows, as an ``r x d`` array."""
    m, d = rows.m, rows.r
    if isinstance(rows, ExplicitRows) and m < d:
        M = rows.L.toarray() if sp.issparse(rows.L) else rows.L
        _, s, Vt = sla.svd(M, full_matrices=False, lapack_driver="gesdd")
        tol = max(m, d) * np.finfo(float).eps * (s[0] if s.size else 0.0)
        out: np.ndarray = Vt[s > tol]
        return out
    lam, V = sla.eigh(rows.gram(np.ones(m)))
    s = np.sqrt(np.clip(lam, 0.0, None))
    tol = max(m, d) * np.finfo(float).eps * (s.max() if s.size else 0.0)
    keep = s > tol
    out = V[:, keep][:, ::-1].T.copy()
    return out


def canonical_problem(W: LinearQuery) -> Canonical:
    """Reduce ``W`` to its canonical form (merged cells; identity or row-space basis).

    Raises
    ------
    dpdask.errors.ArgumentError
        If ``W`` is the zero matrix (nothing to answer).
    """
    data = row_term(W)
    d = data.r
    merged, classes = merge_columns(data)
    dm = merged.r
    Q = _row_space(merged) if dm else np.zeros((0, 0))
    r = Q.shape[0]
    if r == 0:
        raise ArgumentError("the workload is the zero matrix: there is nothing to answer")
    reps = None
    if dm < d:
        cells = np.flatnonzero(classes >= 0)
        cls = classes[cells]
        reps = cells[np.unique(cls, return_index=True)[1]]
        sizes = np.bincount(cls, minlength=dm).astype(float)
        M = sp.csr_array((np.ones(cells.size), (cls, cells)), shape=(dm, d))
        Mright = np.zeros((d, dm))
        Mright[cells, cls] = 1.0 / sizes[cls]  # M Mright = I
    if r == dm:
        if dm == d:
            return Canonical(merged, IdentityColumns(d), Identity(d), None, d)
        return Canonical(merged, IdentityColumns(dm), Sparse(M), Mright, d, reps)
    if isinstance(merged, ExplicitRows):
        rows: RowTerm = ExplicitRows(np.asarray(merged.L @ Q.T))
    else:
        rows = MappedRows(merged, Q)
    if dm == d:
        return Canonical(rows, DenseColumns(Q), Dense(Q), Q.T.copy(), d)
    basis = Dense(np.asarray(M.T @ Q.T).T)
    return Canonical(rows, DenseColumns(Q), basis, Mright @ Q.T, d, reps)


def nuclear_bound(rows: RowTerm, cols: ColumnTerm, w: np.ndarray, u: np.ndarray) -> float:
    """``||diag(w)^{1/2} L B diag(u)^{1/2}||_*^2`` (nuclear norm) for ``w, u >= 0``.

    With ``w = v / c`` and probability vectors ``u`` (over cells) and ``v`` (over
    queries) this is ``||diag(v / c)^{1/2} W diag(u)^{1/2}||_*^2``, a lower bound on the
    optimal squared privacy cost of Problem 1 (weak duality: ``max_i v_i / c_i >=
    tr(A Sigma)`` with ``A = L^T diag(w) L``, ``max_j p_j >= tr(C Sigma^-1)`` with
    ``C = B diag(u) B^T``, and ``min_Sigma tr(A Sigma) tr(C Sigma^-1)`` is this value).
    It is tight at the optimal multipliers.

    Computed from triangular factors ``A = Ra^T Ra`` and ``C = Rc^T Rc`` (QR of the
    scaled rows and columns) as the sum of the singular values of ``Ra Rc^T``, which
    keeps the bound accurate to rounding; only when ``L`` has too many rows to hold
    does it fall back to eigenvalues (then accurate to about ``1e-8`` relative).
    """
    r = rows.r
    keep = w > 0
    if isinstance(cols, IdentityColumns):
        Rc = np.diag(np.sqrt(u))
    else:
        Rc = sla.qr((cols.B * np.sqrt(u)).T, mode="r")[0][: min(r, cols.d)]
    if keep.sum() * r <= _MAX_EXPLICIT_ROWS:
        La = rows.times(np.eye(r))[keep] * np.sqrt(w[keep])[:, None]
        Ra = sla.qr(La, mode="r")[0][: min(r, La.shape[0])]
        sv = sla.svdvals(Ra @ Rc.T)
        return float(sv.sum() ** 2)
    lam, U = sla.eigh(rows.gram(w))
    half = (U * np.sqrt(np.clip(lam, 0.0, None))) @ U.T
    mu = sla.eigvalsh(half @ (Rc.T @ Rc) @ half)
    return float(np.sqrt(np.clip(mu, 0.0, None)).sum() ** 2)
