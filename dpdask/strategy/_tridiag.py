"""CA (the optimal Gaussian strategy) when the workload's Gram matrix has a tridiagonal inverse.

Prefix and all-range workloads have such Gram matrices: ``P^T P`` (``n - max(a, b)``)
has inverse ``tridiag(-1, [1, 2, ..., 2], -1)``, and the all-range Gram
``(min(a, b) + 1)(n - max(a, b))`` has inverse ``tridiag(-1, 2, -1) / (n + 1)``.
With ``Tri = G^-1`` and ``lambda > 0`` (one multiplier per cell), the dual of
:mod:`.convex` is a function of the tridiagonal matrix
``B = diag(lambda)^-1/2 Tri diag(lambda)^-1/2``: the eigenvalues of ``K`` are those of
``B^-1``, so

    g(lambda) = 2 tr(B^-1/2) - sum(lambda),    diag X(lambda) = diag(B^-1/2) / lambda.

Neither needs an ``n x n`` matrix. ``diag(B^-1/2)`` comes from the quadrature
``B^-1/2 = (2/pi) int_0^inf (B + t^2 I)^-1 dt`` (trapezoidal in ``log t``, error
below ``1e-11``), each node the diagonal of a shifted tridiagonal inverse from two
``O(n)`` factorisations (LAPACK ``dpttrf``, forward and backward; the twisted
factorisation). The scale-invariant dual bound ``h = tr(B^-1/2)^2 / sum(lambda)`` is
maximised over ``log lambda`` by L-BFGS (:mod:`._lbfgs`), and every candidate is
certified exactly, from the eigendecomposition of ``B`` (``O(n^2)``, LAPACK
``stemr``): the strategy ``A = B^-1/4 diag(lambda)^-1/2``, scaled to unit column
norm, has error ``tr(B^-1/2) max_i X_ii``, and no strategy has an error below
``h`` (weak duality, as in :mod:`.convex`).

The strategy is a :class:`SpectralStrategy`: a dense ``n x n`` matrix that also knows
its inverse Gram, ``(A^T A)^-1 = R^T R`` with ``R`` a row scaling and column scaling of
``A`` itself, so that its error analysis costs ``O(n^2)``, not an ``n x n``
eigendecomposition.

Gaussian OPT_0 (:func:`._optimize.opt_0_l2`) uses it for these workloads at every
size; :func:`.convex.ca_solve` only beyond :data:`.convex.CONVEX_MAX_N` values,
where the dense solver cannot go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.linalg import eigh_tridiagonal, eigvalsh_tridiagonal
from scipy.linalg.lapack import dpttrf

from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import (
    AllRange,
    Dense,
    LinearQuery,
    Prefix,
    Scaled,
    check_dense_size,
    register_operator,
)
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import InverseGram
from dpdask.strategy._lbfgs import lbfgs

if TYPE_CHECKING:
    from dpdask.strategy.convex import ConvexSolution

__all__ = [
    "SpectralStrategy",
    "ca_solve_tridiagonal",
    "sqrt_inverse_diag",
    "tridiagonal_ca",
    "tridiagonal_inverse",
    "uses_tridiagonal",
]

STEP = 0.3
"""Quadrature step in ``log t``: relative error about ``exp(-pi^2 / STEP)``."""

TAIL = 36.0
"""Quadrature nodes beyond the spectrum, in ``log t``: the integrand decays as ``exp(-|s|)``."""


def tridiagonal_inverse(G: Gram) -> tuple[np.ndarray, np.ndarray] | None:
    """``(diagonal, off-diagonal)`` of ``G^-1`` when ``G`` is one prefix or all-range term."""
    terms = G.terms()
    if len(terms) != 1 or terms[0][1] not in ("prefix", "allrange") or not terms[0][0] > 0:
        return None
    c, kind, _ = terms[0]
    n = G.n
    if kind == "prefix":
        d = np.full(n, 2.0)
        d[0] = 1.0
        return d / c, np.full(n - 1, -1.0 / c)
    return np.full(n, 2.0 / ((n + 1) * c)), np.full(n - 1, -1.0 / ((n + 1) * c))


def uses_tridiagonal(G: Gram, min_n: int = 1) -> bool:
    """Whether CA on ``G`` is solved here: at least ``min_n`` values, a tridiagonal
    inverse, and an ``n x n`` strategy within ``dpdask.linalg.max-dense-elements``.

    Gaussian OPT_0 (:func:`._optimize.opt_0_l2`) takes every size; :func:`.convex.ca_solve`
    only sizes beyond :data:`.convex.CONVEX_MAX_N`, so that its dense solver remains
    an independent check of this one up to that size.
    """
    if G.n < min_n or tridiagonal_inverse(G) is None:
        return False
    try:
        check_dense_size(G.n * G.n, "")
    except MemoryError:
        return False
    return True


def tridiagonal_ca(
    W: LinearQuery | Gram, *, tol: float, max_iter: int, min_n: int = 1
) -> ConvexSolution | None:
    """:class:`.convex.ConvexSolution` of CA by :func:`ca_solve_tridiagonal`, or ``None``
    where :func:`uses_tridiagonal` (with ``min_n``) says no, or ``W`` is not a prefix
    or all-range workload.

    ``max_iter`` counts Newton iterations of :mod:`.convex`; here at most ten
    evaluations of the dual are allowed per iteration (an evaluation costs ``O(n)`` per
    quadrature node, a Newton iteration ``O(n^3)``).
    """
    from dpdask.strategy.convex import ConvexSolution

    if isinstance(W, Gram):
        G = W
    elif isinstance(W, Prefix | AllRange | Scaled) and W.shape[1] >= min_n:
        G = Gram.of(W)
    else:
        return None
    if not uses_tridiagonal(G, min_n):
        return None
    d, e = tridiagonal_inverse(G)  # type: ignore[misc]
    A, error, lower, evaluations, converged = ca_solve_tridiagonal(
        d, e, tol=tol, max_iter=10 * max_iter
    )
    return ConvexSolution(A, error, lower, A.lam, evaluations, converged)


def _nodes(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Shifts ``t^2`` and weights of the quadrature for a spectrum inside ``[lo, hi]``."""
    s = np.arange(0.5 * np.log(lo) - TAIL, 0.5 * np.log(hi) + TAIL + STEP, STEP)
    return np.exp(2.0 * s), (2.0 / np.pi) * STEP * np.exp(s)


def sqrt_inverse_diag(d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``diag(B^-1/2)`` of the positive definite tridiagonal ``B = tridiag(e, d, e)``.

    Parameters
    ----------
    d : ndarray, shape (n,)
        Diagonal.
    e : ndarray, shape (n - 1,)
        Off-diagonal.

    Returns
    -------
    ndarray, shape (n,)
        To a relative error of about ``1e-11`` (see the module docstring).
    """
    lo = float(eigvalsh_tridiagonal(d, e, select="i", select_range=(0, 0))[0])
    hi = float(np.max(d + np.abs(np.concatenate([e, [0.0]])) + np.abs(np.concatenate([[0.0], e]))))
    if not lo > 0:
        raise ArgumentError("the tridiagonal matrix is not positive definite")
    shifts, weights = _nodes(0.5 * lo, 2.0 * hi)
    out = np.zeros(d.size)
    for sigma, w in zip(shifts, weights, strict=True):
        out += w * _inverse_diagonal(d + sigma, e)
    return out


class SpectralStrategy(Dense):
    """``A = s diag(mu^-1/4) V^T diag(lambda)^-1/2`` with ``B = V diag(mu) V^T``.

    A dense strategy that knows its inverse Gram: ``(A^T A)^-1 = R^T R`` with
    ``R = diag(mu^1/2) A diag(lambda) / s^2``.

    Parameters
    ----------
    matrix : ndarray, shape (n, n)
        ``A``.
    mu : ndarray, shape (n,)
        Eigenvalues of ``B``, in the order of ``A``'s rows.
    lam : ndarray, shape (n,)
        The multipliers.
    s : float
        The scale.
    """

    def __init__(self, matrix: np.ndarray, mu: np.ndarray, lam: np.ndarray, s: float):
        super().__init__(matrix)
        self.mu = np.asarray(mu, dtype=float)
        self.lam = np.asarray(lam, dtype=float)
        self.s = float(s)

    def _inverse_gram(self) -> InverseGram:
        R = (np.sqrt(self.mu)[:, None] * self.matrix) * (self.lam / self.s**2)[None, :]
        return InverseGram(np.zeros(self.shape[1]), R, 1)

    def _params(self) -> tuple[object, ...]:
        return (self.matrix, self.mu, self.lam, self.s)


register_operator(
    SpectralStrategy,
    lambda o, w: {
        "matrix": w.array(o.matrix),
        "mu": w.array(o.mu),
        "lam": w.array(o.lam),
        "s": o.s,
    },
    lambda d, r: SpectralStrategy(
        r.array(d["matrix"]), r.array(d["mu"]), r.array(d["lam"]), d["s"]
    ),
)


class _Converged(Exception):
    pass


def _certify(
    d: np.ndarray, e: np.ndarray, lam: np.ndarray
) -> tuple[SpectralStrategy, float, float] | None:
    """The exact strategy, error and dual bound at ``lam`` (one eigendecomposition of ``B``)."""
    r = 1.0 / np.sqrt(lam)
    mu, V = eigh_tridiagonal(d * r * r, e * r[:-1] * r[1:], lapack_driver="stemr")
    if not mu[0] > 0:
        return None
    root = mu**-0.5
    T = float(root.sum())
    Xd = ((V * V) @ root) / lam
    scale = float(Xd.max())
    s = 1.0 / np.sqrt(scale)
    A = (s * mu**-0.25)[:, None] * V.T * r[None, :]
    return SpectralStrategy(A, mu, lam, s), T * scale, T * T / float(lam.sum())


def ca_solve_tridiagonal(
    d: np.ndarray, e: np.ndarray, *, tol: float = 1e-4, max_iter: int = 500
) -> tuple[SpectralStrategy, float, float, int, bool]:
    """CA for a workload whose Gram matrix has inverse ``tridiag(e, d, e)``.

    The dual bound is maximised by L-BFGS over ``log lambda``; where that stalls short
    of ``tol`` (the bound is flat to rounding near its maximum, the primal error is
    not), the fixed-point steps ``lambda_i <- lambda_i X_ii^2`` (exact in one step for
    a diagonal ``G``) drive every ``X_ii`` to 1. Every point whose gap, from the
    quadrature, is within ``tol`` is certified exactly (:func:`_certify`).

    Parameters
    ----------
    d, e : ndarray
        Diagonal and off-diagonal of ``G^-1`` (:func:`tridiagonal_inverse`).
    tol : float
        Relative duality gap, certified exactly, at which to stop.
    max_iter : int
        Most evaluations of the dual.

    Returns
    -------
    strategy : SpectralStrategy
        With unit largest column L2 norm; ``strategy.lam`` holds the multipliers.
    error : float
        Its error ``tr(G (A^T A)^-1)``.
    lower_bound : float
        No strategy has an error below it.
    evaluations : int
        Evaluations of the dual.
    converged : bool
        Whether the certified gap reached ``tol``.
    """
    d = np.asarray(d, dtype=float)
    e = np.asarray(e, dtype=float)
    state: dict[str, Any] = {"gap": np.inf, "certified": np.inf, "calls": 0}

    def evaluate(lam: np.ndarray) -> tuple[np.ndarray, float, float, np.ndarray]:
        state["calls"] += 1
        r = 1.0 / np.sqrt(lam)
        sd = sqrt_inverse_diag(d * r * r, e * r[:-1] * r[1:])
        T, L = float(sd.sum()), float(lam.sum())
        Xd = sd / lam
        gap = float(Xd.max()) * L / T - 1.0
        if gap < state["gap"]:
            state.update(gap=gap, lam=lam)
        if gap <= tol and state["certified"] > tol:
            cert = _certify(d, e, lam)
            if cert is not None:
                state.update(certified=cert[1] / cert[2] - 1.0, cert=cert)
                if state["certified"] <= tol:
                    raise _Converged
        if state["calls"] >= max_iter:
            raise _Converged
        return sd, T, L, Xd

    def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
        lam = np.exp(u - u.max())  # h is scale-invariant: keep lambda of order 1
        _, T, L, Xd = evaluate(lam)
        # maximise log h = 2 log T - log sum(lambda) over u = log lambda
        return -(2.0 * np.log(T) - np.log(L)), -lam * (Xd / T - 1.0 / L)

    try:
        # start: lambda = diag(G), exact for a diagonal G (as :mod:`.convex` starts)
        lbfgs(fun, np.log(_inverse_diagonal(d, e)), maxiter=max_iter, ftol=0.0, gtol=0.0)
        lam = state["lam"]
        while True:
            _, _, _, Xd = evaluate(lam)
            lam = lam * Xd * Xd
            lam = lam / lam.max()
    except _Converged:
        pass
    if state["certified"] <= tol:
        strategy, error, lower = state["cert"]
        return strategy, error, lower, state["calls"], True
    cert = _certify(d, e, state["lam"]) if "lam" in state else None
    if cert is None:
        raise PlanError("the dual iterations left the positive definite region")
    strategy, error, lower = cert
    return strategy, error, lower, state["calls"], error / lower - 1.0 <= tol


def _inverse_diagonal(d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``diag(T^-1)`` of the positive definite tridiagonal ``T = tridiag(e, d, e)``.

    From the twisted factorisation: with ``f`` and ``b`` the pivots of the ``L D L^T``
    factorisations from the top and from the bottom (LAPACK ``dpttrf``),
    ``1 / (T^-1)_ii = f_i + b_i - d_i``.
    """
    if d.size == 1:
        if not d[0] > 0:
            raise ArgumentError("the tridiagonal matrix is not positive definite")
        return 1.0 / d
    forward, _, info = dpttrf(d, e)
    backward, _, info2 = dpttrf(d[::-1].copy(), e[::-1].copy())
    if info or info2:
        raise ArgumentError("the tridiagonal matrix is not positive definite")
    out: np.ndarray = 1.0 / (forward + backward[::-1] - d)
    return out
