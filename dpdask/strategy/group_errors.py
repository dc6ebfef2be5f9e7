"""Per geography level and workload query group: the error of measured and reconstructed answers.

For a release that measures every level ``l`` of a geography (coarsest first) with its
own plan, this module gives, per level and per query group (the workload's named
terms), the standard deviation of

**the measured answer**
    the answer from the level's own measurements: the plan's per-query variances
    (:meth:`~dpdask.strategy.Plan.query_variances`, of the noise drawn once the plan was
    realised);
**the reconstructed answer**
    the consistent least-squares (GLS) estimate from every level's measurements: each
    unit's histogram ``x_v`` is the sum of its children's, unit ``v`` at level ``l``
    measures ``A_l x_v`` with i.i.d. noise of variance ``s_l``, and the estimate is the
    best linear unbiased one given all of them.

A group's figure is ``sqrt(mean_i var_i)`` over its queries ``i`` (the root mean
variance; equal to each query's sd when the group's queries share one variance).

The tree GLS, exactly, for a balanced tree. Let ``M_l = A_l^T A_l / s_l`` be level
``l``'s information matrix in cell space and ``f_l`` the number of children of a unit
at level ``l - 1``. Every unit of a level then has the same

* information from its own subtree, upward: ``J_L = M_L`` at the finest level and
  ``J_l = M_l + J_{l+1} / f_{l+1}``. (``f`` independent children with information
  ``J`` each: in coordinates ``s = sum_c x_c`` and the differences ``x_c - s / f`` the
  quadratic form splits into ``s^T (J / f) s`` plus a form in the differences alone, so
  the sum has information ``J / f`` even when ``J`` is singular.)
* information from outside its subtree, downward: ``K = 0`` at the top level; a child
  ``c`` of ``p`` learns ``H = K_p + M_p`` about ``x_p = x_c + S``, its ``f - 1``
  siblings' sum ``S`` has information ``J' = J_{l+1} / (f - 1)``, and eliminating
  ``S`` leaves ``K_c = H - H (H + J')^+ H = H (H + J')^+ J'`` (``K_c = H`` for an only
  child).

The subtree and the outside are independent given ``x_v``, so the estimate of ``x_v``
has covariance ``(J_l + K_l)^+`` and a query row ``w`` the variance ``w (J_l + K_l)^+
w^T``. Dense matrices of the domain's size: up to :data:`MAX_DENSE_CELLS` cells. A
geography whose units have unequal numbers of children is approximated by the
balanced tree with each level's **mean** fan-out.

:func:`group_errors` gives both figures for a release's level plans;
:func:`tda2020_level_plans` the Census Bureau's plans for the same levels and total
budget, to compare with (:mod:`dpdask.strategy.tda2020`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.linalg
import scipy.sparse

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import Kron
from dpdask.privacy import zCDP
from dpdask.strategy._terms import KronTerms
from dpdask.strategy.plan import Plan

__all__ = [
    "MAX_DENSE_CELLS",
    "GroupError",
    "LevelErrors",
    "covariance_group_variances",
    "group_errors",
    "information_matrix",
    "measured_group_variances",
    "tda2020_level_plans",
    "tree_information",
]

MAX_DENSE_CELLS = 4096
"""The largest domain the reconstructed (GLS) figures are computed for (``N x N``
matrices)."""

_MAX_GROUP_ROWS = 10_000_000  # per-query variances of a larger group are not listed


@dataclass(frozen=True)
class GroupError:
    """One query group's standard deviations at one level.

    Attributes
    ----------
    group : str
        The workload term's name.
    queries : int
        The group's number of queries.
    sd_measured : float or None
        ``sqrt`` of the mean variance of the measured answers (``None``: too many
        queries to list, or the level is not measured).
    sd_reconstructed : float or None
        ``sqrt`` of the mean variance of the GLS answers (``None``: see
        :attr:`LevelErrors.note`).
    """

    group: str
    queries: int
    sd_measured: float | None
    sd_reconstructed: float | None


@dataclass(frozen=True)
class LevelErrors:
    """A level's :class:`GroupError` list.

    Attributes
    ----------
    level : str
        The level's name.
    fanout : float or None
        The mean number of units of this level per unit of the level above (``None``
        at the top level or when unknown).
    groups : tuple of GroupError
        In the workload's order.
    note : str or None
        Why the reconstructed figures are missing (``None`` when they are given).
    """

    level: str
    fanout: float | None
    groups: tuple[GroupError, ...]
    note: str | None = None


def _named_terms(terms: KronTerms) -> dict[str, list[int]]:
    """The workload's terms by name, in the order names first appear."""
    out: dict[str, list[int]] = {}
    for j, name in enumerate(terms.names):
        out.setdefault(name, []).append(j)
    return out


def measured_group_variances(plan: Plan) -> dict[str, tuple[int, float | None]]:
    """Per query group: its number of queries and the mean variance of its measured answers.

    The plan's own per-query variances (:meth:`Plan.query_variances`: of the noise
    drawn once :meth:`Plan.realise` fixed it, nominal before), averaged over the
    queries of each named workload term.

    Parameters
    ----------
    plan : Plan
        A level's plan.

    Returns
    -------
    dict of str to (int, float or None)
        Group name to ``(queries, mean variance)``; the mean is ``None`` for a group
        of more than ten million queries (not evaluated query by query).
    """
    terms = plan.analysis.terms
    out: dict[str, tuple[int, float | None]] = {}
    for name, idx in _named_terms(terms).items():
        rows = sum(terms.rows(j) for j in idx)
        if rows > _MAX_GROUP_ROWS:
            out[name] = (rows, None)
            continue
        total = sum(float(plan.analysis.term_variances(j).sum()) for j in idx)
        out[name] = (rows, plan.noise_variance * total / rows)
    return out


def information_matrix(plan: Plan) -> np.ndarray:
    """``A^T A / s``: the information one unit's measurement gives on its histogram.

    ``A`` is the strategy as measured (for a level plan, the Gram root
    :meth:`Plan.at` measures: the same Gram) and ``s`` the variance of each row's noise
    (:attr:`Plan.row_variance`: of the noise drawn once realised).

    Raises
    ------
    PlanError
        If the domain has more than :data:`MAX_DENSE_CELLS` cells.
    """
    n = plan.strategy.shape[1]
    if n > MAX_DENSE_CELLS:
        raise PlanError(
            f"the domain has {n:,} cells: the dense information matrix is computed up to "
            f"{MAX_DENSE_CELLS:,}"
        )
    G = np.asarray(plan.strategy.gram().dense(), dtype=float)
    out: np.ndarray = (G + G.T) / (2.0 * plan.row_variance)
    return out


def _solve_psd(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A^+ B`` for a positive semi-definite ``A`` (Cholesky; eigenvalues if singular)."""
    try:
        factor = scipy.linalg.cho_factor(A, lower=True, check_finite=False)
        out: np.ndarray = scipy.linalg.cho_solve(factor, B, check_finite=False)
    except np.linalg.LinAlgError:
        out = scipy.linalg.pinvh(A) @ B
    return out


def _inverse_psd(A: np.ndarray) -> np.ndarray:
    """``A^+`` for a positive semi-definite ``A`` (from its Cholesky factor; eigenvalues if
    it is singular)."""
    try:
        c, _ = scipy.linalg.cho_factor(A, lower=True, check_finite=False)
        inv, info = scipy.linalg.lapack.dpotri(c, lower=True)
        if info != 0:
            raise np.linalg.LinAlgError("dpotri failed")
    except np.linalg.LinAlgError:
        out: np.ndarray = scipy.linalg.pinvh(A)
        return out
    low: np.ndarray = np.tril(inv)
    full: np.ndarray = low + np.tril(low, -1).T
    return full


def tree_information(
    infos: Sequence[np.ndarray], fanouts: Sequence[float | None]
) -> list[np.ndarray]:
    """The information on one unit's histogram from every level's measurements, per level.

    The balanced-tree GLS of the module docstring: ``J_l + K_l`` for every level.

    Parameters
    ----------
    infos : sequence of ndarray
        ``M_l`` per level, coarsest first (``N x N``, positive semi-definite).
    fanouts : sequence of float or None
        ``f_l``: children per unit of the level above, per level (the first is not
        used: the top level's units have no parent in the release). ``f_l >= 1``.

    Returns
    -------
    list of ndarray
        ``J_l + K_l`` per level; its pseudo-inverse is the covariance of the GLS
        estimate of a unit's histogram.

    Raises
    ------
    ArgumentError
        If the lengths differ or a fan-out below the top is missing or below 1.
    """
    L = len(infos)
    if len(fanouts) != L or L == 0:
        raise ArgumentError(f"{L} information matrices but {len(fanouts)} fan-outs")
    f: list[float] = [1.0] * L
    for lv in range(1, L):
        value = fanouts[lv]
        if value is None or not math.isfinite(value) or value < 1:
            raise ArgumentError(f"level {lv}: a fan-out of at least 1 is needed, got {value!r}")
        f[lv] = float(value)
    J = [np.asarray(M, dtype=float) for M in infos]
    for lv in range(L - 2, -1, -1):  # upward
        J[lv] = J[lv] + J[lv + 1] / f[lv + 1]
    K = [np.zeros_like(J[0])]
    for lv in range(1, L):  # downward
        H = K[lv - 1] + np.asarray(infos[lv - 1], dtype=float)
        if f[lv] - 1 <= 1e-12:  # an only child: its parent's information is its own
            K.append(H)
            continue
        siblings = J[lv] * ((f[lv] - 1) ** -1)
        Kc = H @ _solve_psd(H + siblings, siblings)
        K.append((Kc + Kc.T) / 2)
    return [J[lv] + K[lv] for lv in range(L)]


def covariance_group_variances(
    terms: KronTerms, covariance: np.ndarray
) -> dict[str, tuple[int, float]]:
    """Per query group: its number of queries and the mean of ``diag(W_g C W_g^T)``.

    Parameters
    ----------
    terms : KronTerms
        The workload's terms (:attr:`ErrorAnalysis.terms` of a plan).
    covariance : ndarray
        ``C``, the covariance of an estimate of one unit's histogram (``N x N``).

    Raises
    ------
    PlanError
        If a term is too large to form as a sparse matrix (more than ten million rows).
    """
    out: dict[str, tuple[int, float]] = {}
    for name, idx in _named_terms(terms).items():
        rows, total = 0, 0.0
        for j in idx:
            r = terms.rows(j)
            if r > _MAX_GROUP_ROWS:
                raise PlanError(f"workload term {name!r} has {r:,} queries: too many to list")
            Wj = scipy.sparse.csr_matrix(Kron(terms.factors[j]).dense() * terms.weights[j])
            total += float(Wj.multiply(Wj @ covariance).sum())
            rows += r
        out[name] = (rows, total / rows)
    return out


def _sd(v: float | None) -> float | None:
    return None if v is None else math.sqrt(max(v, 0.0))


def group_errors(
    plans: Mapping[str, Plan],
    fanouts: Mapping[str, float] | None = None,
    unmeasured: Collection[str] = (),
) -> list[LevelErrors]:
    """Per level and query group: the sd of the measured and of the reconstructed answer.

    Parameters
    ----------
    plans : mapping of str to Plan
        Each released level's plan, coarsest level first (e.g. as
        :func:`dpdask.graph.level_plans` makes them: realised, the figures are of the
        noise drawn).
    fanouts : mapping of str to float, optional
        Mean units per unit of the level above, for every level but the first. Without
        it (or with a level missing) the reconstructed figures of a release of several
        levels are ``None`` and each level's ``note`` says why.
    unmeasured : collection of str, optional
        Levels that are not measured (a spine level, whose units reuse their parent's
        estimate: :mod:`dpdask.graph._spine`): no information in the GLS and no
        measured figures, whatever their plan.

    Returns
    -------
    list of LevelErrors
        In the order of ``plans``.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> from dpdask.privacy import zCDP
    >>> W = VStack([Total(4), Identity(4)], names=["total", "cells"])
    >>> p = Plan(W, Identity(4), zCDP(Fraction(1, 2)))   # noise variance 1 per cell
    >>> [round(g.sd_measured, 3) for g in group_errors({"top": p})[0].groups]
    [2.0, 1.0]
    """
    levels = list(plans)
    n = next(iter(plans.values())).strategy.shape[1] if plans else 0
    note: str | None = None
    if n > MAX_DENSE_CELLS:
        note = (
            f"n/a: the domain has {n:,} cells; the GLS is computed with dense matrices up to "
            f"{MAX_DENSE_CELLS:,}"
        )
    elif len(levels) > 1 and (fanouts is None or any(lv not in fanouts for lv in levels[1:])):
        note = "n/a: the mean fan-out of the levels is unknown (give --fanout)"
    f: list[float | None] = [None]
    f += [None if fanouts is None else fanouts.get(lv) for lv in levels[1:]]
    recon: list[dict[str, tuple[int, float]] | None] = [None] * len(levels)
    if note is None and levels:
        infos = [
            np.zeros((n, n)) if lv in unmeasured else information_matrix(plans[lv]) for lv in levels
        ]
        for i, T in enumerate(tree_information(infos, f)):
            C = _inverse_psd(T)
            recon[i] = covariance_group_variances(plans[levels[i]].analysis.terms, C)
    out: list[LevelErrors] = []
    for i, lv in enumerate(levels):
        measured = measured_group_variances(plans[lv])
        rec = recon[i]
        groups = tuple(
            GroupError(
                g, q, None if lv in unmeasured else _sd(v), None if rec is None else _sd(rec[g][1])
            )
            for g, (q, v) in measured.items()
        )
        out.append(LevelErrors(lv, f[i], groups, note))
    return out


def tda2020_level_plans(
    total: zCDP, levels: Sequence[str], *, domain: Domain | None = None
) -> dict[str, Plan]:
    """The Census Bureau's plans for ``levels``, spending ``total`` at its production shares.

    The persons budget is ``total / sum_l share_l`` over the released levels, and
    each level gets its production share of it
    (:func:`~dpdask.strategy.tda2020.level_budget`), so the levels spend ``total``
    between them in the Bureau's proportions. The plans are nominal: the Bureau
    measures integer counts with the discrete Gaussian, whose noise is the
    calibration's (no lattice).

    Parameters
    ----------
    total : zCDP
        The release's total budget (add/remove-one-person neighbours).
    levels : sequence of str
        The released levels, each one of :data:`~dpdask.strategy.tda2020.LEVELS`.
    domain : Domain, optional
        :func:`dpdask.census.pl94_full_domain` (the default).

    Raises
    ------
    PlanError
        For a level the Bureau does not have, or a budget that is not zCDP.
    """
    from dpdask.strategy.tda2020 import LEVEL_SHARES, LEVELS, level_budget, tda2020_plan
    from dpdask.workloads.pl94_full import pl94_full

    if not isinstance(total, zCDP):
        raise PlanError(f"the tda-2020 comparison needs a zCDP budget, got {total!r}")
    unknown = [lv for lv in levels if lv not in LEVEL_SHARES]
    if unknown or not levels:
        raise PlanError(
            f"the tda-2020 comparison needs the Bureau's levels {list(LEVELS)}, got "
            f"{list(unknown or levels)}"
        )
    persons = total * (1 / sum((LEVEL_SHARES[lv] for lv in levels), Fraction(0)))
    W = pl94_full(domain)
    return {
        lv: tda2020_plan(W, level_budget(persons, lv), level=lv, domain=domain) for lv in levels
    }
