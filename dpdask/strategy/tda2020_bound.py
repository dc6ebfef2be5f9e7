"""A lower bound on the budget any unbiased mechanism needs to match the Bureau's variances.

:func:`~dpdask.strategy.tda2020.fitness_plan` finds a budget at which dpdask's unbiased
release meets, on every query, the variance of the Bureau's measured answer. This
module bounds that budget from below for *every* data-independent Gaussian mechanism
with a linear unbiased (least-squares) estimator, so the plan's budget ratio can be
certified optimal or not.

The bound. A strategy ``A`` with unit Gaussian noise has information ``M = A^T A``; its
privacy cost is ``s = max_i M_ii`` (the squared L2 sensitivity under add/remove-one-
person neighbours; zCDP ``rho = s / 2``), and the least-squares variance of a query
``w`` is ``w^T M^-1 w``. Meeting per-group targets ``c_g`` on groups ``W_g`` (``k_g``
queries each) means, for any weights ``lambda_g >= 0``,
``sum_g lambda_g k_g c_g >= tr(G M^-1)`` with ``G = sum_g lambda_g W_g^T W_g``; and
``tr(G M^-1) >= tr(G^(1/2))^2 / tr(M)`` (Cauchy-Schwarz) with ``tr(M) <= n s``. So

    s >= tr(G^(1/2))^2 / (n sum_g lambda_g k_g c_g)       for every lambda >= 0,

and the best ``lambda`` maximises a concave function (``tr(G^(1/2))`` under a linear
normalisation): :func:`cost_bound` solves that small convex problem.

On the 2,016-cell histogram every group is a Kronecker product whose votingage,
Hispanic and race factors are ``I`` or the all-ones matrix, which share one eigenbasis
(constant vector and its complement per attribute); so ``G`` splits into ``2^3`` blocks
of ``8 x 8`` matrices on hhgq (the ``hhinstlevels`` recode does not commute with the
all-ones matrix there), each with a known multiplicity.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize

from dpdask import census
from dpdask.errors import ArgumentError
from dpdask.privacy import zCDP
from dpdask.strategy.tda2020 import (
    LEVEL_SHARES,
    PERSONS_RHO_ADD_REMOVE,
    QUERY_SHARES,
    tda2020_groups,
)
from dpdask.workloads.pl94_full import (
    PL94_FULL_GROUPS,
    group_factor_kinds,
    hhinstlevels_recode,
    pl94_full_group,
)

__all__ = ["CostBound", "budget_ratio_bound", "cost_bound", "group_gram_blocks"]

_Float = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CostBound:
    """The result of :func:`cost_bound`.

    Attributes
    ----------
    cost : float
        Lower bound on ``max_i M_ii`` (the squared sensitivity at unit noise) of any
        mechanism meeting the targets; zCDP ``rho >= cost / 2``.
    weights : dict
        The group weights ``lambda_g`` that give it (any non-negative weights give a
        valid bound; these are the solver's best).
    """

    cost: float
    weights: dict[str, float]


def _hhgq_gram(kind: str) -> _Float:
    if kind == "I":
        return np.eye(8)
    if kind == "R":
        R = np.asarray(hhinstlevels_recode().dense(), dtype=float)
        gram: _Float = R.T @ R
        return gram
    return np.ones((8, 8))


def group_gram_blocks(
    groups: tuple[str, ...] = PL94_FULL_GROUPS,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``W_g^T W_g`` of every group in the shared eigenbasis: ``2^3`` blocks of ``8 x 8``.

    Returns
    -------
    blocks : ndarray
        ``(len(groups), 8, 8, 8)``: group, eigen-class of (votingage, hisp, race) in
        C order (0 the constant vector, 1 its complement), hhgq matrix.
    multiplicity : ndarray
        ``(8,)``: how many eigenvectors each class has.
    """
    sizes = census.pl94_full_domain().shape[1:]
    classes = list(itertools.product((0, 1), repeat=3))
    mult = np.array([np.prod([1 if c == 0 else m - 1 for c, m in zip(cl, sizes, strict=True)])
                     for cl in classes], dtype=float)  # fmt: skip
    out = np.zeros((len(groups), len(classes), 8, 8))
    for i, g in enumerate(groups):
        kinds = group_factor_kinds(g)
        for j, cl in enumerate(classes):
            w = 1.0
            for kind, c, m in zip(kinds[1:], cl, sizes, strict=True):
                w *= 1.0 if kind == "I" else (float(m) if c == 0 else 0.0)
            out[i, j] = w * _hhgq_gram(kinds[0])
    return out, mult


def _sqrt_trace(lam: _Float, blocks: _Float, mult: _Float) -> tuple[float, _Float]:
    """``tr(G^(1/2))`` and its gradient in ``lam``."""
    G = np.einsum("g,gcij->cij", lam, blocks)
    ev, vec = np.linalg.eigh(G)
    ev = np.clip(ev, 0.0, None)
    value = float((mult * np.sqrt(ev).sum(axis=1)).sum())
    inv_root = np.where(ev > 1e-12 * max(ev.max(), 1.0), 1 / np.sqrt(np.maximum(ev, 1e-300)), 0.0)
    Ginv = np.einsum("cik,ck,cjk->cij", vec, inv_root, vec)  # G^(-1/2) per class
    g = 0.5 * np.einsum("c,cij,gcij->g", mult, Ginv, blocks)
    return value, g


def cost_bound(targets: Mapping[str, float], *, starts: int = 3) -> CostBound:
    """Lower bound on the privacy cost of meeting per-group variance ``targets``.

    Parameters
    ----------
    targets : mapping
        Group name (of :data:`~dpdask.workloads.pl94_full.PL94_FULL_GROUPS`) to the
        largest variance allowed on each of its queries; groups left out are free.
    starts : int
        Starting points of the concave maximisation (the first is uniform weights).

    Returns
    -------
    CostBound

    Raises
    ------
    ArgumentError
        For an unknown group or a target that is not positive and finite.
    """
    names = tuple(targets)
    for g, c in targets.items():
        if g not in PL94_FULL_GROUPS:
            raise ArgumentError(f"unknown query group {g!r}; groups are {PL94_FULL_GROUPS}")
        if not (np.isfinite(c) and c > 0):
            raise ArgumentError(f"target of {g!r} must be positive and finite, got {c!r}")
    blocks, mult = group_gram_blocks(names)
    n = census.pl94_full_domain().size
    rows = np.array([pl94_full_group(g).shape[0] for g in names], dtype=float)
    a = rows * np.array([float(targets[g]) for g in names])  # sum_g lambda_g k_g c_g = a.lam

    def bound(lam: _Float) -> float:
        value, _ = _sqrt_trace(lam, blocks, mult)
        return value**2 / (n * float(a @ lam))

    # maximise tr(G^(1/2)) over mu = a * lambda on the simplex (concave: one optimum)
    scaled = blocks / a[:, None, None, None]

    def neg(theta: _Float) -> tuple[float, _Float]:
        mu = np.exp(theta - theta.max())
        mu /= mu.sum()
        value, g = _sqrt_trace(mu, scaled, mult)
        return -value, -mu * (g - mu @ g)  # softmax chain rule

    rng = np.random.default_rng(0)
    best = np.full(len(names), 1.0 / len(names))
    for k in range(max(1, starts)):
        theta0 = np.zeros(len(names)) if k == 0 else rng.normal(size=len(names))
        res = minimize(neg, theta0, jac=True, method="L-BFGS-B",
                       options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})  # fmt: skip
        mu = np.exp(res.x - res.x.max())
        mu /= mu.sum()
        if bound(mu / a) > bound(best / a):
            best = mu
    best = best / a
    return CostBound(cost=bound(best), weights=dict(zip(names, map(float, best), strict=True)))


def budget_ratio_bound(level: str, persons: zCDP | None = None) -> float:
    """Least budget ratio to ``tda-2020`` at ``level`` that any unbiased mechanism needs.

    The targets are the Bureau's measured-answer variances at ``level`` (``1 / (2 rho l
    q)``); the ratio does not depend on the persons budget ``rho``, which only scales
    them. A fitness plan's ``budget_ratio`` (:func:`~dpdask.strategy.tda2020.fitness_plan`)
    is at least this; equal to it within the solver's tolerance means it is optimal
    among data-independent Gaussian mechanisms with least-squares answers.

    Examples
    --------
    >>> round(budget_ratio_bound("block"), 3)  # at least the detailed cells' share
    0.963
    """
    rho = Fraction(persons.rho if persons is not None else PERSONS_RHO_ADD_REMOVE)
    rho_level = rho * LEVEL_SHARES[level]
    shares = QUERY_SHARES[level]
    targets = {g: float(1 / (2 * rho_level * shares[g])) for g in tda2020_groups(level)}
    return cost_bound(targets).cost / (2 * float(rho_level))
