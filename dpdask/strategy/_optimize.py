"""HDMM's optimisers: OPT_0 (one attribute), OPT_x (Kronecker), OPT_+ (union), OPT_M (marginals).

Every optimiser minimises ``||A||_p^2 ||W A^+||_F^2`` over a template of strategies
with unit sensitivity, so its loss is the expected total squared error per unit
of the mechanism's noise variance at sensitivity 1 (``2 / epsilon^2`` for Laplace,
``1 / (2 rho)`` for Gaussian noise under zCDP).

* OPT_0 fits a p-Identity strategy to one Gram matrix (:mod:`._pidentity`). For
  the L2 norm (Gaussian noise) and up to :data:`CONVEX_MAX_N` cells,
  :func:`opt_0_l2` solves it instead as the convex program over ``X = A^T A``
  (:mod:`.convex`), whose optimum is global and certified by a dual bound: a
  p-Identity with ``p = n`` reaches the same optimum by L-BFGS over ``n^2``
  parameters, at ``O(n^3)`` per iteration and hundreds of iterations, where the
  dual Newton method takes ``O(n^3)`` per iteration and about ten.
* OPT_x fits a Kronecker product of factors to a union of Kronecker terms. With
  ``e_ji = tr(G_ji X_i)`` the loss is ``sum_j w_j^2 prod_i e_ji``; holding the other
  factors fixed it is linear in ``G``: an OPT_0 problem for the combined Gram
  ``sum_j (w_j^2 prod_{l != i} e_jl) G_ji``. The factors are updated in turn
  (block coordinate descent, each step warm-started) until a sweep gains less than
  ``rtol``. An attribute on which every term asks only the total gets the total as
  its factor, one on which every term asks every cell gets the identity. The
  descent starts from the factors fitted each to its own factor workload (exactly
  optimal for a single term, whose loss is the product of the factors' errors) and,
  for a union, also from the random start; the better result is kept.
* OPT_+ fits one Kronecker strategy per group of terms and splits the budget:
  with group errors ``E_g`` at unit sensitivity, part weights ``c_g`` proportional
  to ``E_g^(1/3)`` (L1: sensitivity ``sum c_g``) or ``c_g^2`` to ``E_g^(1/2)`` (L2:
  sensitivity^2 ``sum c_g^2``) minimise the total, giving ``(sum_g E_g^(1/3))^3``
  and ``(sum_g E_g^(1/2))^2``.
* OPT_M fits the weights of all ``2^d`` marginals (:mod:`._marginals`).

Solver. ``method="lbfgs"`` (the default, :data:`METHOD`) is the vectorised
projected L-BFGS of :mod:`._lbfgs`; ``method="scipy"`` is SciPy's L-BFGS-B. Both
use the analytic gradients and reach the same optima (tested), but SciPy's costs
about 3 ms of set-up per call and 0.1-0.4 ms per iteration in bound handling:
on SF1 (25 restarts, hundreds of small factor problems) OPT_x took 3.0 s with it
against 1.6 s, and at ``n = 8192, p = 512`` (4.2 million parameters) its
per-iteration cost exceeds the objective's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, minimize

from dpdask.linalg import Identity, Kron, LinearQuery, Ones
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._lbfgs import lbfgs
from dpdask.strategy._marginals import (
    complement_sizes,
    marginals_loss,
    workload_spectrum,
)
from dpdask.strategy._pidentity import PIdentity, pidentity_loss
from dpdask.strategy._terms import KronTerms

__all__ = [
    "CONVEX_MAX_N",
    "FactorResult",
    "budget_split",
    "default_p",
    "factor_kind",
    "fit_marginals",
    "opt_0",
    "opt_0_l2",
    "opt_kron",
    "opt_marginals",
]

METHOD = "lbfgs"
"""Default solver: ``"lbfgs"`` (vectorised, :mod:`._lbfgs`) or ``"scipy"`` (L-BFGS-B)."""


def default_p(n: int, norm: int = 1) -> int:
    """Rows of ``Theta`` used when none are given.

    L1 (Laplace): ``n / 8`` (rounded up, at most 16) on small attributes, HDMM's
    ``n / 16`` for ``256 <= n <= 1024``, and 64 beyond: one evaluation costs
    ``O(n p^2)``, and at ``n = 4096`` going from ``p = 64`` to HDMM's 256 costs 16
    times as much per evaluation and about four times as many iterations for an
    RMSE 3% lower (ratio to Identity 5.05 against 5.21). L2 (Gaussian): the optimum
    is close to ``(W^T W)^(1/4)``, which needs a full-rank ``Theta``: ``p = n`` up to
    1024, then ``n / 8``.
    """
    if norm == 1:
        if n < 256:
            return max(1, min(-(-n // 8), 16))
        return n // 16 if n <= 1024 else 64
    return n if n <= 1024 else max(1024, n // 8)


def _minimize(
    fun, x0: np.ndarray, nonneg: bool, ftol: float, maxiter: int, method: str | None = None
) -> tuple:
    method = METHOD if method is None else method
    if method not in ("lbfgs", "scipy"):
        raise ValueError(f"method must be 'lbfgs' or 'scipy', got {method!r}")
    if method == "scipy":
        res = minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            bounds=Bounds(0.0, np.inf) if nonneg else None,
            options={"ftol": ftol, "gtol": 1e-12, "maxiter": maxiter},
        )
        return res.x, float(res.fun), int(res.nit)
    res = lbfgs(fun, x0, ftol=ftol, maxiter=maxiter, nonneg=nonneg)
    return res.x, res.fun, res.nit


def opt_0(
    G: Gram,
    p: int | None = None,
    *,
    norm: int = 1,
    seed: int = 0,
    theta0: np.ndarray | None = None,
    ftol: float = 1e-5,
    maxiter: int = 5000,
    method: str | None = None,
) -> tuple[np.ndarray, float, int]:
    """OPT_0: the p-Identity strategy minimising ``tr(G (A^T A)^-1)``.

    Parameters
    ----------
    G : Gram
        The workload's Gram matrix.
    p : int, optional
        Rows of ``Theta`` (default :func:`default_p`).
    norm : {1, 2}
        Sensitivity norm (1: Laplace, 2: Gaussian).
    seed : int
        Seed of the random start (``Theta`` uniform on ``[0, 1)``).
    theta0 : ndarray, optional
        A start to use instead (warm start).
    ftol : float
        Stop when one iteration improves the loss by less than this fraction.
    maxiter : int
        Iteration limit.
    method : {"lbfgs", "scipy"}, optional
        Solver (default :data:`METHOD`).

    Returns
    -------
    theta : ndarray, shape (p, n)
    loss : float
        ``tr(G (A^T A)^-1)`` at ``theta`` (the error at unit sensitivity), checked
        against an independent evaluation (:func:`_checked_loss`).
    nit : int
        Iterations used.
    """
    n = G.n
    if theta0 is None:
        p = default_p(n, norm) if p is None else int(p)
        x0 = np.random.default_rng(seed).random(p * n)
    else:
        p = theta0.shape[0]
        x0 = np.asarray(theta0, dtype=float).ravel().copy()
    gdiag = G.diag()

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        return pidentity_loss(x, p, G, gdiag, norm)

    x, f, nit = _minimize(fun, x0, norm == 1, ftol, maxiter, method)
    theta = x.reshape(p, n)
    return theta, _checked_loss(theta, norm, G, f), nit


CONVEX_MAX_N = 2048
"""Largest attribute on which Gaussian OPT_0 is solved by the convex program."""

CONVEX_TOL = 1e-4
"""Relative duality gap at which :func:`opt_0_l2` stops."""


def opt_0_l2(G: Gram, *, tol: float = CONVEX_TOL) -> tuple[LinearQuery, float, int, float]:
    """OPT_0 for the L2 norm: ``min tr(G X^+)`` over ``X = A^T A`` with ``diag(X) <= 1``.

    Parameters
    ----------
    G : Gram
        The workload's Gram matrix.
    tol : float
        Relative duality gap at which to stop.

    Returns
    -------
    strategy : Dense
        ``A`` with largest column L2 norm 1 (``r x n``, ``r`` the rank of ``G``).
    loss : float
        ``tr(G (A^T A)^+)``, the error at unit sensitivity.
    nit : int
        Newton iterations.
    lower_bound : float
        The dual bound: no strategy has a loss below it.
    """
    from dpdask.strategy.convex import ca_solve_gram

    sol = ca_solve_gram(G.dense(), tol=tol)
    return sol.strategy, float(sol.error), int(sol.iterations), float(sol.lower_bound)


LOSS_RTOL = 1e-6
"""Largest relative gap between the optimiser's loss and the loss recomputed at its answer."""


def _checked_loss(theta: np.ndarray, norm: int, G: Gram, f: float) -> float:
    """The loss at ``theta``: the optimiser's ``f`` unless an independent evaluation disagrees.

    The objective's Woodbury form ``tr(Gt) - <Z, Y>`` loses digits where ``Theta`` runs
    off to huge values (``M = I + Theta Theta^T`` is then ill-conditioned), and the
    optimiser can end there on a value well below the true loss (on ``Prefix(12)``,
    55.1 reported for 67.4 actual). The loss is recomputed through the Cholesky
    factor of ``M`` (:func:`inverse_gram`, as every error analysis does) and that
    value is returned when the two differ by more than :data:`LOSS_RTOL`.
    """
    exact = float(inverse_gram(PIdentity(theta, norm)).trace(G))
    if not abs(exact - f) <= LOSS_RTOL * abs(exact):
        return exact
    return f


# ---------------------------------------------------------------------------
# factors of Kronecker strategies
# ---------------------------------------------------------------------------
def factor_kind(terms: KronTerms, i: int) -> str:
    """``"total"``, ``"identity"`` or ``"pidentity"``: the factor template of attribute ``i``."""
    kinds = set()
    for j in range(terms.k):
        G = terms.gram(j, i)
        ks = {k for _, k, _ in G.terms()}
        kinds.add(ks.pop() if len(ks) == 1 and ks <= {"identity", "ones"} else "other")
    if kinds == {"ones"}:
        return "total"
    if kinds == {"identity"} or terms.sizes[i] == 1:
        return "identity"
    return "pidentity"


def fixed_factor(kind: str, n: int) -> LinearQuery:
    return Ones(n) if kind == "total" else Identity(n)


@dataclass
class FactorResult:
    """A factor strategy: ``theta`` for a p-Identity, else a fixed ``kind``."""

    kind: str
    n: int
    theta: np.ndarray | None = None
    norm: int = 1

    def strategy(self) -> LinearQuery:
        if self.kind == "pidentity":
            return PIdentity(self.theta, self.norm)  # type: ignore[arg-type]
        return fixed_factor(self.kind, self.n)


@dataclass
class KronResult:
    """The outcome of OPT_x on a set of terms."""

    factors: list[FactorResult]
    loss: float
    sweeps: int = 0
    history: list[float] = field(default_factory=list)

    def strategy(self) -> Kron:
        return Kron([f.strategy() for f in self.factors])


def _factor_errors(terms: KronTerms, i: int, A: LinearQuery) -> np.ndarray:
    """``e[j] = tr(G_ji X_i)`` for every term ``j``, with ``X_i = (A^T A)^+``."""
    X = inverse_gram(A)
    stack = terms.stacked_grams(i)
    if stack is None:
        return np.array([X.trace(terms.gram(j, i)) for j in range(terms.k)])
    Gs, index = stack
    return np.einsum("uab,ab->u", Gs, X.dense())[index]


def _combined_gram(terms: KronTerms, i: int, coefs: np.ndarray) -> Gram:
    """``sum_j coefs[j] G_ji``."""
    stack = terms.stacked_grams(i)
    if stack is None:
        return Gram.combine(coefs, [terms.gram(j, i) for j in range(terms.k)])
    Gs, index = stack
    c = np.bincount(index, weights=coefs, minlength=Gs.shape[0])
    return Gram(terms.sizes[i], [(1.0, "dense", np.einsum("u,uab->ab", c, Gs))])


def _random_factors(
    terms: KronTerms, norm: int, seeds: np.ndarray, ps: Sequence[int | None] | None
) -> list[FactorResult]:
    """Factors of the template, p-Identity ones uniform on ``[0, 1)`` (stream ``seeds[i]``)."""
    facs = []
    for i in range(terms.d):
        kind = factor_kind(terms, i)
        n = terms.sizes[i]
        if kind == "pidentity":
            p = default_p(n, norm) if ps is None or ps[i] is None else int(ps[i])  # type: ignore[arg-type]
            theta = np.random.default_rng(int(seeds[i])).random((p, n))
            facs.append(FactorResult("pidentity", n, theta, norm))
        else:
            facs.append(FactorResult(kind, n))
    return facs


def _per_factor(
    terms: KronTerms,
    starts: Sequence[list[FactorResult]],
    norm: int,
    ftol: float,
    maxiter: int,
) -> list[FactorResult]:
    """Each p-Identity factor fitted to its own factor workload, best of ``starts``.

    The factor workload of attribute ``i`` is ``sum_j w_j^2 (prod_{l != i} e_jl) G_ji``
    with ``e_jl`` the errors of the identity (or the fixed factor) on the other
    attributes. For a single term it is ``G_0i`` up to a positive factor, and the
    loss is the product of the factors' errors, so fitting every factor separately
    is optimal for the product (up to the local optima of OPT_0, hence the starts).
    """
    base = [f if f.kind != "pidentity" else FactorResult("identity", f.n) for f in starts[0]]
    E0 = np.column_stack([_factor_errors(terms, i, f.strategy()) for i, f in enumerate(base)])
    w2 = terms.weights**2
    facs = list(starts[0])
    for i, f in enumerate(starts[0]):
        if f.kind != "pidentity":
            continue
        coefs = np.prod(np.delete(E0, i, axis=1), axis=1) * w2
        G = _combined_gram(terms, i, coefs / coefs.max())
        best = math.inf
        for st in starts:
            theta, loss, _ = opt_0(G, norm=norm, theta0=st[i].theta, ftol=ftol, maxiter=maxiter)
            if loss < best:
                best = loss
                facs[i] = FactorResult("pidentity", terms.sizes[i], theta, norm)
    return facs


def _sweeps(
    terms: KronTerms,
    facs: list[FactorResult],
    norm: int,
    ftol: float,
    rtol: float,
    max_sweeps: int,
    inner_maxiter: int,
) -> KronResult:
    """Block coordinate descent over the p-Identity factors from ``facs``."""
    facs = list(facs)
    E = np.column_stack([_factor_errors(terms, i, f.strategy()) for i, f in enumerate(facs)])
    w2 = terms.weights**2
    loss = float(w2 @ E.prod(axis=1))
    history = [loss]
    free = [i for i in range(terms.d) if facs[i].kind == "pidentity"]
    sweeps = 0
    for sweeps in range(1, max_sweeps + 1):  # noqa: B007
        for i in free:
            others = np.prod(np.delete(E, i, axis=1), axis=1) * w2
            scale = others.max()
            if scale <= 0:
                continue
            G = _combined_gram(terms, i, others / scale)
            theta, _, _ = opt_0(
                G, norm=norm, theta0=facs[i].theta, ftol=ftol, maxiter=inner_maxiter
            )
            facs[i] = FactorResult("pidentity", terms.sizes[i], theta, norm)
            E[:, i] = _factor_errors(terms, i, facs[i].strategy())
        new = float(w2 @ E.prod(axis=1))
        history.append(new)
        done = loss - new <= rtol * abs(loss)
        loss = min(loss, new)
        if done or not free:
            break
    return KronResult(facs, loss, sweeps, history)


def opt_kron(
    terms: KronTerms,
    *,
    norm: int = 1,
    seed: int = 0,
    ps: Sequence[int | None] | None = None,
    ftol: float = 1e-5,
    rtol: float = 1e-4,
    max_sweeps: int = 25,
    start: Sequence[FactorResult] | None = None,
    inner_maxiter: int = 5000,
    restarts: int = 1,
) -> KronResult:
    """OPT_x: a Kronecker product of p-Identity factors for a union of Kronecker terms.

    Without ``start``, every p-Identity factor is first fitted to its own factor
    workload (:func:`_per_factor`), each from ``restarts`` random starts, keeping
    the best per factor. For a single term that is the optimum of the product
    template (the loss is the product of the factors' errors), reached whatever the
    other factors are. For a union it is one start of the block coordinate descent,
    the random start (``seed``) is the other, and the better result is returned.

    Parameters
    ----------
    terms : KronTerms
        The workload.
    norm : {1, 2}
        Sensitivity norm.
    seed : int
        Seed of the random starts (one stream per attribute and restart).
    ps : sequence of int, optional
        Rows of ``Theta`` per attribute (default :func:`default_p`).
    ftol : float
        Tolerance of each factor's optimisation.
    rtol : float
        Stop when a sweep over the factors improves the loss by less than this fraction.
    max_sweeps : int
        Sweep limit.
    start : sequence of FactorResult, optional
        Factors to start from (for example the result of a shorter run); the block
        coordinate descent then runs from them alone.
    inner_maxiter : int
        Iteration limit of each factor update (a sweep needs progress, not optimality).
    restarts : int
        Random starts of each factor's own fit (OPT_0 has local optima). The first
        is the random start of the block coordinate descent.

    Returns
    -------
    KronResult
        The factors, their loss ``sum_j w_j^2 prod_i e_ji``, the sweeps of the
        kept run and its loss after each sweep.
    """
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, got {restarts!r}")
    run = {
        "norm": norm,
        "ftol": ftol,
        "rtol": rtol,
        "max_sweeps": max_sweeps,
        "inner_maxiter": inner_maxiter,
    }
    if start is not None:
        return _sweeps(terms, list(start), **run)
    streams = [np.random.SeedSequence(seed).generate_state(terms.d)]
    streams += [
        np.random.SeedSequence([seed, r]).generate_state(terms.d) for r in range(1, restarts)
    ]
    starts = [_random_factors(terms, norm, st, ps) for st in streams]
    best = _sweeps(terms, _per_factor(terms, starts, norm, ftol, inner_maxiter), **run)
    if terms.k > 1:
        other = _sweeps(terms, starts[0], **run)
        if other.loss < best.loss:
            best = other
    return best


def budget_split(errors: Sequence[float], norm: int = 1) -> tuple[np.ndarray, float]:
    """Weights of the parts of a union and the union's loss.

    Parameters
    ----------
    errors : sequence of float
        ``E_g = ||W_g A_g^+||_F^2`` of each part at unit sensitivity.
    norm : {1, 2}
        Sensitivity norm.

    Returns
    -------
    weights : ndarray
        ``c_g`` with ``sum c_g = 1`` (L1) or ``sum c_g^2 = 1`` (L2).
    loss : float
        ``(sum E^(1/3))^3`` or ``(sum E^(1/2))^2``.
    """
    E = np.asarray(errors, dtype=float)
    if norm == 1:
        c = np.cbrt(E)
        total = c.sum()
        return c / total, float(total**3)
    c2 = np.sqrt(E)
    total = c2.sum()
    return np.sqrt(c2 / total), float(total**2)


# ---------------------------------------------------------------------------
# OPT_M
# ---------------------------------------------------------------------------
@dataclass
class MarginalsResult:
    theta: np.ndarray
    loss: float
    nit: int


def marginals_spectrum(terms: KronTerms) -> np.ndarray:
    """``h(s)`` of the workload (see :mod:`._marginals`)."""
    tr = np.empty((terms.k, terms.d))
    to = np.empty((terms.k, terms.d))
    for j in range(terms.k):
        for i in range(terms.d):
            G = terms.gram(j, i)
            tr[j, i], to[j, i] = G.trace(), G.total()
    return workload_spectrum(tr, to, terms.weights**2, terms.sizes)


def fit_marginals(
    h: np.ndarray,
    sizes: Sequence[int],
    *,
    norm: int = 1,
    seed: int = 0,
    theta0: np.ndarray | None = None,
    ftol: float = 1e-9,
    maxiter: int = 5000,
) -> MarginalsResult:
    """OPT_M on a precomputed workload spectrum ``h`` (see :func:`marginals_spectrum`)."""
    d = len(sizes)
    wc = complement_sizes(sizes)
    x0 = np.random.default_rng(seed).random(2**d) if theta0 is None else np.array(theta0)

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        return marginals_loss(x, h, wc, d, norm)

    x, f, nit = _minimize(fun, x0, True, ftol, maxiter)
    scale = x.sum() if norm == 1 else math.sqrt(float(x @ x))
    return MarginalsResult(x / scale, f, nit)


def opt_marginals(
    terms: KronTerms,
    *,
    norm: int = 1,
    seed: int = 0,
    ftol: float = 1e-9,
    maxiter: int = 5000,
) -> MarginalsResult:
    """OPT_M: the weights of all ``2^d`` marginals, normalised to unit sensitivity."""
    h = marginals_spectrum(terms)
    return fit_marginals(h, terms.sizes, norm=norm, seed=seed, ftol=ftol, maxiter=maxiter)
