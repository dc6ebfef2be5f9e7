"""Marginal workloads and the residual algebra behind them (ResidualPlanner).

On a domain of attribute sizes ``(n_1, ..., n_d)`` a subset ``S`` of the attributes
names the marginal ``M_S = (x)_i (I if i in S else 1^T)``. Per attribute write
``I = J / n + P`` with ``J`` the matrix of ones and ``P = I - J / n`` the centring
projection. Expanding ``M_S`` gives one term per subset ``A`` of ``S``::

    M_S x = sum_{A subset of S} expand_{S \\ A}(P_A m_A) / N_{S \\ A}

where ``m_A = M_A x`` is the ``A``-marginal, ``P_A`` centres it along every axis of
``A``, ``expand`` repeats it along the attributes of ``S \\ A`` and ``N_B`` is the
product of the sizes in ``B``. ``P_A m_A`` is the *residual* of ``A``: the row
space of ``R_A = (x)_i (D_i if i in A else 1^T)`` (``D_i`` any basis of the
complement of the ones vector), and residuals of different subsets are orthogonal.

The residual strategy measures, for every ``A`` in the downward closure of the
workload's subsets, ``P_A (m_A + e_A)`` with ``e_A`` independent Gaussian noise of
variance ``s_A^2`` per cell of the ``A``-marginal (the same as measuring ``R_A x``
with noise covariance ``sigma_A^2 R_A R_A^T``, ``s_A^2 = sigma_A^2 N_{not A}``).
With precisions ``u_A = 1 / s_A^2``:

* the squared L2 sensitivity (zCDP ``rho = sens^2 / 2`` at unit noise) is
  ``sum_A c_A u_A``, ``c_A = prod_{i in A} (n_i - 1) / n_i``;
* every cell of marginal ``S`` has variance ``V_S = sum_{A subset of S} v_SA / u_A``,
  ``v_SA = c_A / N_{S \\ A}^2``; two cells of ``S`` have covariance
  ``sum_A s_A^2 prod_{i in A} P_i[a_i, b_i] prod_{i in S \\ A} 1 / n_i^2``.

:class:`MarginalWorkload` holds the subsets (sorted tuples of attribute indices)
and weights; :meth:`MarginalWorkload.pairs` lists every (marginal, residual)
incidence with ``v_SA`` vectorised, never enumerating cells.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dpdask.errors import ArgumentError, DomainError, ShapeError

__all__ = ["MarginalWorkload", "Pairs", "all_subsets", "marginal_covariance"]


def all_subsets(d: int, k: int, *, up_to: bool = True) -> np.ndarray:
    """All ``k``-subsets (or all of size at most ``k``) of ``range(d)``, padded with ``d``.

    Rows are sorted ascending, the padding last; shape ``(m, k)``.
    """
    if k < 0 or k > d:
        raise ArgumentError(f"need 0 <= k <= {d}, got {k}")
    blocks = []
    for r in range(0 if up_to else k, k + 1):
        if r == 0:
            combos = np.zeros((1, 0), dtype=np.int64)
        else:
            combos = np.array(list(itertools.combinations(range(d), r)), dtype=np.int64)
        pad = np.full((combos.shape[0], k - r), d, dtype=np.int64)
        blocks.append(np.hstack([combos, pad]))
    return np.vstack(blocks)


def _codes(rows: np.ndarray, d: int) -> np.ndarray:
    """One integer per padded sorted row (base ``d + 1``)."""
    k = rows.shape[1]
    if k == 0:
        return np.zeros(rows.shape[0], dtype=np.int64)
    if k * math.log2(d + 1) >= 62:
        raise ArgumentError(f"subsets of up to {k} of {d} attributes are too many to encode")
    base = np.int64(d + 1) ** np.arange(k - 1, -1, -1, dtype=np.int64)
    return rows @ base


@dataclass
class Pairs:
    """Every (marginal ``S``, residual ``A`` subset of ``S``) incidence.

    Attributes
    ----------
    marginal, residual : ndarray of int
        Index of ``S`` in the workload and of ``A`` in :attr:`MarginalWorkload.residuals`.
    v : ndarray
        ``v_SA = c_A / N_{S \\ A}^2``: the per-cell variance of ``S`` from ``A`` at ``u_A = 1``.
    """

    marginal: np.ndarray
    residual: np.ndarray
    v: np.ndarray


@dataclass
class MarginalWorkload:
    """Marginals over a domain: attribute sets with query weights.

    Parameters
    ----------
    sizes : sequence of int
        Attribute sizes ``n_i`` (each at least 2 for the attribute to carry a residual).
    subsets : iterable of iterable of int, or ndarray
        The marginals, as sets of attribute indices; or a padded array from
        :func:`all_subsets`. Repeated sets are merged (their squared weights add).
    weights : sequence of float, optional
        Query weight of each marginal (default 1): its answers enter the loss
        multiplied by ``w``, their variances by ``w^2``.
    names : sequence of str, optional
        A label per marginal (default: the attribute indices joined by ``*``).

    Attributes
    ----------
    source : ndarray of int
        For every marginal as given, its index among the merged ones.
    source_weights : ndarray
        The weights as given.

    Examples
    --------
    >>> W = MarginalWorkload((2, 3, 4), [(0, 1), (1, 2)])
    >>> [tuple(int(i) for i in r) for r in W.residual_sets()]
    [(), (0,), (1,), (2,), (0, 1), (1, 2)]
    >>> W.cells().tolist()
    [6, 12]
    """

    sizes: tuple[int, ...]
    subsets: np.ndarray
    weights: np.ndarray
    names: list[str] = field(default_factory=list)

    def __init__(
        self,
        sizes: Sequence[int],
        subsets: Iterable[Iterable[int]] | np.ndarray,
        weights: Sequence[float] | np.ndarray | None = None,
        names: Sequence[str] | None = None,
    ):
        self.sizes = tuple(int(n) for n in sizes)
        d = len(self.sizes)
        if any(n < 1 for n in self.sizes):
            raise ArgumentError(f"attribute sizes must be positive, got {self.sizes}")
        rows = _padded(subsets, d)
        w = np.ones(rows.shape[0]) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (rows.shape[0],):
            raise ShapeError(f"{rows.shape[0]} marginals but {w.size} weights")
        if not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ArgumentError("marginal weights must be positive and finite")
        codes = _codes(rows, d)
        uniq, first, inv = np.unique(codes, return_index=True, return_inverse=True)
        self.source = np.arange(rows.shape[0])
        self.source_weights = w
        if uniq.size < codes.size:  # merge repeats: squared weights add
            w2 = np.bincount(inv, weights=w * w, minlength=uniq.size)
            order = np.sort(first)
            rank = np.empty(uniq.size, dtype=np.int64)
            rank[inv[order]] = np.arange(order.size)
            self.source = rank[inv]
            rows, w = rows[order], np.sqrt(w2[inv[order]])
            names = None if names is None else [names[i] for i in order]
        self.subsets = rows
        self.weights = w
        self.names = list(names) if names is not None else [self._label(r) for r in rows]
        self._pairs: Pairs | None = None
        self._residuals: np.ndarray | None = None

    # -- basic facts ---------------------------------------------------------
    @property
    def d(self) -> int:
        return len(self.sizes)

    @property
    def m(self) -> int:
        """Number of marginals."""
        return int(self.subsets.shape[0])

    def _label(self, row: np.ndarray) -> str:
        kept = [str(int(i)) for i in row if i < self.d]
        return "*".join(kept) if kept else "total"

    def sets(self) -> list[tuple[int, ...]]:
        """The marginals as sorted tuples of attribute indices."""
        return [tuple(int(i) for i in r if i < self.d) for r in self.subsets]

    def _log_tables(self) -> tuple[np.ndarray, np.ndarray]:
        n = np.asarray(self.sizes, dtype=float)
        with np.errstate(divide="ignore"):
            logc = np.append(np.log((n - 1) / n), 0.0)
        return np.append(np.log(n), 0.0), logc

    def cells(self) -> np.ndarray:
        """Cells of every marginal (``N_S``) as floats (exact below 2**53)."""
        logn, _ = self._log_tables()
        ns = np.append(np.asarray(self.sizes, dtype=float), 1.0)
        out: np.ndarray = (
            np.prod(ns[self.subsets], axis=1) if self.subsets.shape[1] else np.ones(self.m)
        )
        if np.all(out < 2**53):
            return out.astype(np.int64)
        out = np.exp(logn[self.subsets].sum(axis=1))
        return out

    # -- residuals -------------------------------------------------------------
    @property
    def residuals(self) -> np.ndarray:
        """The downward closure of the marginals (padded rows), residuals of size 0 removed."""
        return self._build()[0]

    def residual_sets(self) -> list[tuple[int, ...]]:
        """The residuals as sorted tuples of attribute indices."""
        return [tuple(int(i) for i in r if i < self.d) for r in self.residuals]

    def residual_cost(self) -> np.ndarray:
        """``c_A = prod_{i in A} (n_i - 1) / n_i``: squared sensitivity of residual A at u = 1."""
        _, logc = self._log_tables()
        out: np.ndarray = np.exp(logc[self.residuals].sum(axis=1))
        return out

    def pairs(self) -> Pairs:
        """Every (marginal, residual) incidence with its variance coefficient (cached)."""
        return self._build()[1]

    def _build(self) -> tuple[np.ndarray, Pairs]:
        if self._residuals is not None and self._pairs is not None:
            return self._residuals, self._pairs
        d, rows = self.d, self.subsets
        k = rows.shape[1]
        real = rows < d
        subs, owner = [], []
        for mask in range(2**k):
            keep = np.array([(mask >> (k - 1 - j)) & 1 for j in range(k)], dtype=bool)
            # every kept position must be a real attribute (each subset once per marginal)
            ok = np.all(real[:, keep], axis=1)
            sub = np.where(keep, rows, d)[ok]
            subs.append(np.sort(sub, axis=1))
            owner.append(np.flatnonzero(ok))
        sub_all = np.vstack(subs)
        own = np.concatenate(owner)
        codes = _codes(sub_all, d)
        uniq, first, inv = np.unique(codes, return_index=True, return_inverse=True)
        res = sub_all[first]
        logn, logc = self._log_tables()
        logc_res = logc[res].sum(axis=1)
        # order residuals by size, then lexicographically (codes are lexicographic)
        order = np.lexsort((uniq, (res < d).sum(axis=1)))
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        res, logc_res, pidx = res[order], logc_res[order], rank[inv]
        alive = np.isfinite(logc_res)  # residuals of a size-1 attribute are empty
        keep_idx = np.cumsum(alive) - 1
        sel = alive[pidx]
        own, pidx = own[sel], keep_idx[pidx[sel]]
        res, logc_res = res[alive], logc_res[alive]
        log_ns = logn[rows].sum(axis=1)
        log_na = logn[res].sum(axis=1)
        v = np.exp(logc_res[pidx] - 2.0 * (log_ns[own] - log_na[pidx]))
        self._residuals = res
        self._pairs = Pairs(own.astype(np.int64), pidx.astype(np.int64), v)
        return self._residuals, self._pairs

    # -- variances ---------------------------------------------------------------
    def cell_variances(self, precision: np.ndarray) -> np.ndarray:
        """Per-cell variance ``V_S`` of every marginal under residual precisions ``u``."""
        p = self.pairs()
        with np.errstate(divide="ignore"):
            terms = p.v / precision[p.residual]
        return np.bincount(p.marginal, weights=terms, minlength=self.m)

    def total_variance(self, precision: np.ndarray) -> float:
        """``sum_S w_S^2 N_S V_S``: the expected total squared error of the weighted workload."""
        return float(np.sum(self.weights**2 * self.cells() * self.cell_variances(precision)))

    def sensitivity2(self, precision: np.ndarray) -> float:
        """Squared L2 sensitivity ``sum_A c_A u_A`` of the residual measurements."""
        return float(self.residual_cost() @ precision)


def marginal_covariance(
    sizes: Sequence[int],
    variances: dict[tuple[int, ...], float],
    S: tuple[int, ...],
    T: tuple[int, ...] | None = None,
) -> np.ndarray:
    """``Cov(M_S, M_T)`` (dense, ``N_S x N_T``, C order) from residual noise variances.

    ``variances`` maps each residual ``A`` (sorted tuple) to ``s_A^2``; the residuals
    that are subsets of both ``S`` and ``T`` contribute
    ``s_A^2 (x)_i F_i`` with ``F_i = P_i`` on ``A``, ``J / n_i^2`` on the rest of
    ``S`` and ``T``, the column ``1 / n_i`` on ``S`` only, the row ``1 / n_i`` on ``T`` only.
    """
    T = S if T is None else T
    cov = np.zeros((math.prod(sizes[i] for i in S), math.prod(sizes[i] for i in T)))
    for A, s2 in variances.items():
        if not (set(A) <= set(S) and set(A) <= set(T)):
            continue
        M: np.ndarray = np.ones((1, 1))
        for i in sorted(set(S) | set(T)):
            n = sizes[i]
            if i in A:
                F = np.eye(n) - 1.0 / n
            elif i in S and i in T:
                F = np.full((n, n), 1.0 / n**2)
            elif i in S:
                F = np.full((n, 1), 1.0 / n)
            else:
                F = np.full((1, n), 1.0 / n)
            M = np.kron(M, F)
        cov += s2 * M
    return cov


def _padded(subsets: Iterable[Iterable[int]] | np.ndarray, d: int) -> np.ndarray:
    if isinstance(subsets, np.ndarray) and subsets.ndim == 2:
        rows = np.sort(subsets.astype(np.int64), axis=1)
        if rows.size and (rows.min() < 0 or rows.max() > d):
            raise DomainError(f"attribute indices must be in 0..{d - 1}")
        return rows
    sets = [sorted({int(i) for i in s}) for s in subsets]
    for s in sets:
        if s and (s[0] < 0 or s[-1] >= d):
            raise DomainError(f"marginal {tuple(s)} names an attribute outside 0..{d - 1}")
    k = max((len(s) for s in sets), default=0)
    out = np.full((len(sets), k), d, dtype=np.int64)
    for j, s in enumerate(sets):
        out[j, : len(s)] = s
    return out
