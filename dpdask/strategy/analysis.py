"""Error analytics of the matrix mechanism, implicit for structured strategies.

Measuring ``A x`` with i.i.d. noise of variance ``v`` per row and answering the
workload by least squares, ``W A^+ y``, gives unbiased answers with covariance
``v W (A^T A)^+ W^T`` (when ``A`` supports ``W``, i.e. ``W A^+ A = W``). So

* total squared error: ``v ||W A^+||_F^2 = v tr(W^T W (A^T A)^+)``;
* per-query variances: ``v diag(W (A^T A)^+ W^T)``;

with ``v = 2 b^2`` for Laplace noise of scale ``b = ||A||_1 / epsilon`` and
``v = sigma^2`` for Gaussian noise (``sigma = ||A||_2 / sqrt(2 rho)`` under zCDP).
The functions here compute the parts that do not depend on the budget (``v = 1``);
:class:`dpdask.strategy.Plan` multiplies by the noise.

Nothing of size ``N x N`` is formed. The workload is read as a union of
Kronecker terms (:func:`~dpdask.strategy._terms.kron_terms`) and:

* a Kronecker strategy ``(x)_i A_i`` is handled factor by factor:
  ``||W_j A^+||_F^2 = w_j^2 prod_i tr(G_ji X_i)`` with ``X_i = (A_i^T A_i)^+`` in
  low-rank form, and the variances of term ``j`` are the Kronecker product of
  ``diag(W_ji X_i W_ji^T)``;
* a strategy whose Gram matrix is a combination of ``(x)_i (I or J)`` (weighted
  marginals, identity, unions of such) through the eigenspaces of that algebra
  (:mod:`dpdask.strategy._marginals`);
* a union of two Kronecker strategies exactly, by diagonalising the two factor
  Grams of each attribute together (:mod:`dpdask.strategy._pair`; vectors over
  the domain, no ``N x N`` matrix);
* a union strategy ``[c_1 A_1; ...; c_g A_g]`` with ``groups`` (the workload terms
  each part answers) by answering each group from its own part: the error is
  ``sum_g ||W_g A_g^+||_F^2 / c_g^2``. This is exact for that block
  reconstruction and an upper bound for least squares over the whole union.

Other strategies fall back to dense matrices when the domain is small.

The SVD bound (Li and Miklau, 2012): for any ``A`` supporting ``W``,
``||A||_2^2 ||W A^+||_F^2 >= (sum_k sigma_k(W))^2 / N``, since
``||A||_2^2 >= ||A||_F^2 / N`` and ``||A||_F ||W A^+||_F >= tr((W^T W)^{1/2})``. As
``||A||_1 >= ||A||_2`` it bounds the pure-DP error too (loosely).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.linalg import Kron, LinearQuery, VStack, kron_vector
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import InverseGram, inverse_gram
from dpdask.strategy._marginals import (
    check_marginal_support,
    eigenspace_dims,
    marginal_eigenvalues,
    marginal_gram,
    pseudo_inverse_eigenvalues,
    workload_spectrum,
)
from dpdask.strategy._pair import PAIR_MAX_CELLS, PairAnalysis
from dpdask.strategy._terms import KronTerms, kron_terms

__all__ = ["ErrorAnalysis", "query_variances", "squared_error", "svd_bound"]

# Largest domain for the dense fallback (an N x N pseudo-inverse).
_DENSE_MAX_N = 4096
# Largest number of Kronecker-combined eigenvalues summed for the SVD bound.
_SVD_MAX_CELLS = 50_000_000


@dataclass(frozen=True)
class _PairState:
    pair: PairAnalysis
    c1: float
    c2: float


@dataclass(frozen=True)
class _MarginalState:
    traces: np.ndarray
    totals: np.ndarray
    mu_inv: np.ndarray


_State = _PairState | _MarginalState | list[InverseGram]


class ErrorAnalysis:
    """``||W A^+||_F^2`` and ``diag(W (A^T A)^+ W^T)`` for one strategy, per workload term.

    Parameters
    ----------
    workload : LinearQuery or KronTerms
        The workload ``W``.
    strategy : LinearQuery
        The strategy ``A`` (rows as measured, weights included).
    sizes : sequence of int, optional
        Attribute sizes of the domain (default: read from the workload).
    groups : sequence of sequence of int, optional
        For a :class:`~dpdask.linalg.VStack` strategy, the workload terms (indices
        into :attr:`terms`) that each part answers; each term in exactly one group.

    Raises
    ------
    dpdask.errors.PlanError, dpdask.errors.ShapeError
        If the strategy does not support the workload.
    NotImplementedError
        If no implicit formula applies and the domain is too large for dense matrices.
    """

    def __init__(
        self,
        workload: LinearQuery | KronTerms,
        strategy: LinearQuery,
        sizes: Sequence[int] | None = None,
        groups: Sequence[Sequence[int]] | None = None,
    ):
        terms = workload if isinstance(workload, KronTerms) else kron_terms(workload, sizes)
        if strategy.shape[1] != math.prod(terms.sizes):
            raise ShapeError(
                f"the strategy has {strategy.shape[1]} columns but the workload's domain "
                f"has {math.prod(terms.sizes)} cells"
            )
        self.terms = terms
        self.strategy = strategy
        self.groups = None if groups is None else [list(g) for g in groups]
        self._errors: np.ndarray | None = None
        if self.groups is not None:
            self._parts = self._grouped(strategy, self.groups)
        else:
            self._kind, self._state = self._prepare(terms, strategy)

    # -- public ------------------------------------------------------------
    def by_term(self) -> np.ndarray:
        """``||W_j A^+||_F^2`` for every workload term ``j``."""
        if self._errors is None:
            if self.groups is not None:
                out = np.zeros(self.terms.k)
                for idx, sub, c2 in self._parts:
                    out[idx] = sub.by_term() / c2
                self._errors = out
            else:
                self._errors = self._term_errors()
        return self._errors

    def total(self) -> float:
        """``||W A^+||_F^2``."""
        return float(self.by_term().sum())

    def term_variances(self, j: int) -> np.ndarray:
        """``diag(W_j (A^T A)^+ W_j^T)`` for the rows of term ``j`` (C order)."""
        if self.groups is not None:
            for idx, sub, c2 in self._parts:
                if j in idx:
                    out: np.ndarray = sub.term_variances(idx.index(j)) / c2
                    return out
        return self._term_variances(j)

    def variances(self) -> np.ndarray:
        """Per-query variances of the whole workload, in its row order."""
        return np.concatenate([self.term_variances(j) for j in range(self.terms.k)])

    # -- dispatch ----------------------------------------------------------
    def _grouped(
        self, A: LinearQuery, groups: list[list[int]]
    ) -> list[tuple[list[int], ErrorAnalysis, float]]:
        if not isinstance(A, VStack) or len(A.parts) != len(groups):
            raise ArgumentError("groups need a VStack strategy with one part per group")
        seen = sorted(j for g in groups for j in g)
        if seen != list(range(self.terms.k)):
            raise ArgumentError("groups must assign every workload term to exactly one part")
        parts = []
        for g, part, c in zip(groups, A.parts, A.weights, strict=True):
            if c == 0:
                raise PlanError("a strategy part with weight 0 cannot answer its group")
            parts.append((g, ErrorAnalysis(self.terms.subset(g), part), float(c) ** 2))
        return parts

    def _prepare(self, terms: KronTerms, A: LinearQuery) -> tuple[str, _State]:
        sizes = terms.sizes
        if isinstance(A, Kron) and A.in_shape == sizes:
            return "kron", self._prepare_kron(terms, list(A.factors))
        u = marginal_gram(A, sizes)
        if u is not None:
            return "marginal", self._prepare_marginal(terms, u)
        if isinstance(A, VStack) and len(A.parts) == 2:
            p0, p1 = A.parts
            if (
                isinstance(p0, Kron)
                and isinstance(p1, Kron)
                and p0.in_shape == sizes
                and p1.in_shape == sizes
                and math.prod(sizes) <= PAIR_MAX_CELLS
            ):
                pair = PairAnalysis(terms, p0, p1)
                c1, c2 = (float(c) for c in A.weights)
                pair.check_supports(c1, c2)
                return "pair", _PairState(pair, c1, c2)
        if terms.d == 1:
            return "kron", self._prepare_kron(terms, [A])
        N = math.prod(sizes)
        if N > _DENSE_MAX_N:
            raise NotImplementedError(
                f"no implicit error formula for a {type(A).__name__} strategy on a domain "
                f"of sizes {sizes} ({N:,} cells); use a Kronecker, marginals or grouped "
                "union strategy"
            )
        flat = KronTerms((N,), terms.weights, [[_flat(f)] for f in terms.factors], terms.names)
        self.terms_flat = flat
        return "flat", self._prepare_kron(flat, [A])

    def _prepare_kron(self, terms: KronTerms, factors: list[LinearQuery]) -> list[InverseGram]:
        Xs = [inverse_gram(f) for f in factors]
        for j in range(terms.k):
            for i, X in enumerate(Xs):
                X.check_supports(terms.factors[j][i], f"workload term {terms.names[j]!r}")
        return Xs

    def _prepare_marginal(self, terms: KronTerms, u: np.ndarray) -> _MarginalState:
        tr, to = terms.traces_totals()
        h = workload_spectrum(tr, to, terms.weights**2, terms.sizes)
        mu = marginal_eigenvalues(u, terms.sizes)
        check_marginal_support(h, mu)
        return _MarginalState(tr, to, pseudo_inverse_eigenvalues(mu))

    def _kron_terms(self) -> KronTerms:
        return self.terms_flat if self._kind == "flat" else self.terms

    def _term_errors(self) -> np.ndarray:
        state = self._state
        if isinstance(state, _PairState):
            return state.pair.by_term(state.c1, state.c2)
        if isinstance(state, _MarginalState):
            tr, to = state.traces, state.totals
            out = np.empty(self.terms.k)
            for j in range(self.terms.k):
                w2 = self.terms.weights[j : j + 1] ** 2
                h = workload_spectrum(tr[j : j + 1], to[j : j + 1], w2, self.terms.sizes)
                out[j] = float(h @ state.mu_inv)
            return out
        terms = self._kron_terms()
        return np.array(
            [
                terms.weights[j] ** 2
                * math.prod(X.trace(terms.gram(j, i)) for i, X in enumerate(state))
                for j in range(terms.k)
            ]
        )

    def _term_variances(self, j: int) -> np.ndarray:
        state = self._state
        if isinstance(state, _PairState):
            return state.pair.term_variances(j, state.c1, state.c2)
        w2 = self.terms.weights[j] ** 2
        if isinstance(state, _MarginalState):
            marg: np.ndarray = w2 * _marginal_term_variances(
                self.terms.factors[j], self.terms.sizes, state.mu_inv
            )
            return marg
        terms = self._kron_terms()
        diags = [X.quad_diag(terms.factors[j][i]) for i, X in enumerate(state)]
        out: np.ndarray = w2 * kron_vector(diags)
        return out


def _flat(factors: list[LinearQuery]) -> LinearQuery:
    return factors[0] if len(factors) == 1 else Kron(factors)


def _row_stats(W: LinearQuery) -> tuple[np.ndarray, np.ndarray]:
    """Squared row norms and squared row sums of a factor."""
    sq = W.T.column_norms(2) ** 2
    sums = W._matmat(np.ones((W.shape[1], 1)))[:, 0]
    return sq, sums * sums


def _marginal_term_variances(
    factors: list[LinearQuery], sizes: tuple[int, ...], mu_inv: np.ndarray
) -> np.ndarray:
    """``sum_s mu_inv(s) (x)_i diag(W_i P_{s_i} W_i^T)`` without enumerating rows per subset."""
    d = len(sizes)
    K = mu_inv.reshape((2,) * d)
    vecs: list[np.ndarray | None] = []
    for i, W in enumerate(factors):
        sq, s2 = _row_stats(W)
        n = sizes[i]
        pair = np.stack([s2 / n, sq - s2 / n])  # (2, m_i): J/n part, (I - J/n) part
        if np.ptp(pair, axis=1).max(initial=0.0) <= 1e-12 * max(np.abs(pair).max(), 1.0):
            K = np.tensordot(K, pair[:, 0], axes=([_pos(vecs, i)], [0]))
            vecs.append(None)
        else:
            vecs.append(pair)
    # K now has one axis per varying attribute, in order
    out = K
    ax = 0
    for vec in vecs:
        if vec is None:
            continue
        out = np.moveaxis(np.tensordot(out, vec, axes=([ax], [0])), -1, ax)
        ax += 1
    shape = [f.shape[0] if v is not None else 1 for f, v in zip(factors, vecs, strict=True)]
    full = [f.shape[0] for f in factors]
    return np.broadcast_to(np.asarray(out).reshape(shape), full).ravel()


def _pos(vecs: list[np.ndarray | None], i: int) -> int:
    """Axis of attribute ``i`` in the partially contracted coefficient tensor."""
    return sum(1 for v in vecs[:i] if v is not None)


def squared_error(
    workload: LinearQuery,
    strategy: LinearQuery,
    *,
    sizes: Sequence[int] | None = None,
    groups: Sequence[Sequence[int]] | None = None,
) -> float:
    """``||W A^+||_F^2``: the total squared error per unit noise variance.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Prefix
    >>> squared_error(Prefix(4), Identity(4))  # ||P||_F^2 = 4 + 3 + 2 + 1
    10.0
    """
    return ErrorAnalysis(workload, strategy, sizes, groups).total()


def query_variances(
    workload: LinearQuery,
    strategy: LinearQuery,
    *,
    sizes: Sequence[int] | None = None,
    groups: Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """``diag(W (A^T A)^+ W^T)``: each workload query's variance per unit noise variance."""
    return ErrorAnalysis(workload, strategy, sizes, groups).variances()


def svd_bound(
    workload: LinearQuery | KronTerms, *, sizes: Sequence[int] | None = None
) -> float | None:
    """``(sum_k sigma_k(W))^2 / N``, or ``None`` where it cannot be computed implicitly.

    Computed factor by factor for a Kronecker workload, through the eigenspaces of
    the marginal algebra when every factor Gram is a combination of ``I`` and ``J``,
    by simultaneous diagonalisation when each attribute's factor Grams commute,
    and densely on small domains.
    """
    terms = workload if isinstance(workload, KronTerms) else kron_terms(workload, sizes)
    N = math.prod(terms.sizes)
    try:
        if terms.k == 1:
            s1: float = abs(terms.weights[0]) * math.prod(
                float(np.sqrt(terms.gram(0, i).eigvalsh()).sum()) for i in range(terms.d)
            )
            return s1 * s1 / N
        s = _marginal_svd_sum(terms)
        if s is None:
            s = _commuting_svd_sum(terms)
    except MemoryError:
        return None
    if s is None:
        return None
    return s * s / N


def _marginal_svd_sum(terms: KronTerms) -> float | None:
    """``sum sigma`` when every factor Gram is ``alpha I + beta J``."""
    k, d = terms.k, terms.d
    inside = np.empty((k, d))  # eigenvalue on (I - J/n): alpha
    outside = np.empty((k, d))  # eigenvalue on J/n: alpha + beta n
    for j in range(k):
        for i in range(d):
            coef = _identity_ones_coefficients(terms.gram(j, i))
            if coef is None:
                return None
            alpha, beta = coef
            inside[j, i] = alpha
            outside[j, i] = alpha + beta * terms.sizes[i]
    acc = (terms.weights**2)[:, None] * np.ones((k, 1))
    for i in range(d):
        pair = np.stack([outside[:, i], inside[:, i]], axis=1)
        acc = (acc[:, :, None] * pair[:, None, :]).reshape(k, -1)
    nu = np.clip(acc.sum(axis=0), 0.0, None)
    return float(eigenspace_dims(terms.sizes) @ np.sqrt(nu))


def _identity_ones_coefficients(G: Gram) -> tuple[float, float] | None:
    """``(alpha, beta)`` with ``G = alpha I + beta J``, or ``None``."""
    n = G.n
    terms = G.terms()
    if all(kind in ("identity", "ones") for _, kind, _ in terms):
        alpha = sum(c for c, kind, _ in terms if kind == "identity")
        beta = sum(c for c, kind, _ in terms if kind == "ones")
        return alpha, beta
    if n > 2048:
        return None
    M = G.dense()
    beta = M[0, 1] if n > 1 else 0.0
    alpha = M[0, 0] - beta
    if np.allclose(M, alpha * np.eye(n) + beta, rtol=1e-12, atol=1e-12 * max(abs(M).max(), 1)):
        return float(alpha), float(beta)
    return None


def _commuting_svd_sum(terms: KronTerms) -> float | None:
    """``sum sigma`` when, per attribute, the factor Grams of all terms commute."""
    N = math.prod(terms.sizes)
    if N > _SVD_MAX_CELLS:
        return None
    lams = []  # per attribute: (k, n_i) eigenvalues in a shared eigenbasis
    for i in range(terms.d):
        Gs = [terms.gram(j, i).dense() for j in range(terms.k)]
        mix = sum((1.0 + 0.1 * np.sqrt(t + 1.0)) * G for t, G in enumerate(Gs))
        _, V = np.linalg.eigh(mix)
        lam = np.empty((terms.k, terms.sizes[i]))
        for j, G in enumerate(Gs):
            D = V.T @ G @ V
            off = D - np.diag(np.diag(D))
            if np.abs(off).max(initial=0.0) > 1e-8 * max(np.abs(D).max(), 1.0):
                return None
            lam[j] = np.diag(D)
        lams.append(lam)
    w2 = terms.weights**2
    total = 0.0
    # sum over cells of sqrt(sum_j w_j^2 prod_i lam[i][j, c_i]), one leading index at a time
    for c0 in range(terms.sizes[0]):
        acc = (w2 * lams[0][:, c0])[:, None]
        for lam in lams[1:]:
            acc = (acc[:, :, None] * lam[:, None, :]).reshape(terms.k, -1)
        total += float(np.sqrt(np.clip(acc.sum(axis=0), 0.0, None)).sum())
    return total
