"""OPT_x: HDMM's Kronecker template, one p-Identity (or fixed) factor per attribute.

OPT_x fits a Kronecker product of factors to a union of Kronecker terms. With
``e_ji = tr(G_ji X_i)`` the loss is ``sum_j w_j^2 prod_i e_ji``; holding the other
factors fixed it is linear in ``G``: an OPT_0 problem for the combined Gram
``sum_j (w_j^2 prod_{l != i} e_jl) G_ji``. The factors are updated in turn
(block coordinate descent, each step warm-started) until a sweep gains less than
``rtol``. An attribute on which every term asks only the total gets the total as
its factor, one on which every term asks every cell gets the identity. The
descent starts from the factors fitted each to its own factor workload (exactly
optimal for a single term, whose loss is the product of the factors' errors) and,
for a union, also from the random start; the better result is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError
from dpdask.linalg import Identity, Kron, LinearQuery, Ones
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._terms import KronTerms
from dpdask.strategy.hdmm._optimize import default_p, fit_0, opt_0
from dpdask.strategy.hdmm._pidentity import PIdentity

__all__ = ["FactorResult", "KronResult", "factor_kind", "fixed_factor", "opt_kron"]


def factor_kind(terms: KronTerms, i: int) -> str:
    """``"total"``, ``"identity"`` or ``"pidentity"``: the factor template of attribute ``i``."""
    known = terms.kinds.get(i)
    if known is not None:
        return known
    kind = _factor_kind(terms, i)
    terms.kinds[i] = kind
    return kind


def _factor_kind(terms: KronTerms, i: int) -> str:
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
    out: np.ndarray = np.einsum("uab,ab->u", Gs, X.dense())[index]
    return out


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
            theta, _, _ = fit_0(
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
        raise ArgumentError(f"restarts must be at least 1, got {restarts!r}")
    run: dict[str, Any] = {
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
