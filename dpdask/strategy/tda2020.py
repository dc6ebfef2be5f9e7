"""The Census Bureau's 2020 P.L. 94-171 production strategy, as a baseline plan.

The Bureau's TopDown system (production settings in ``../shared/design/tda-2020.md``)
measures, at every geography level, the eleven query groups of
:data:`~dpdask.workloads.pl94_full.PL94_FULL_GROUPS` directly: each group's answers plus
discrete Gaussian noise, the level getting the share :data:`LEVEL_SHARES` of the
persons budget and each group the share :data:`QUERY_SHARES` of its level's. A query
with level share ``l`` and query share ``q`` has noise variance ``1 / (2 rho l q)``
(``rho`` the persons budget under add/remove-one-person neighbours; the Bureau's own
``rho`` is stated for change-one-record neighbours and is twice that, see
:mod:`dpdask.privacy.neighbours`).

As a :class:`~dpdask.strategy.Plan`: the strategy is the vertical stack of the groups,
group ``g`` scaled by ``sqrt(q_g)``. Every person is in exactly one cell of each
group, so the stack's L2 sensitivity is ``sqrt(sum_g q_g) = 1`` and one Gaussian noise
scale ``sigma^2 = 1 / (2 rho_level)`` gives group ``g`` the variance
``sigma^2 / q_g``. Each workload group is answered from its own measurement (the
plan's ``groups``), as the Bureau measures it; so the plan's per-query variances are
those of the measured answers. The US level measures no ``total``: there it is
answered from the ``detailed`` cells.

:func:`tda2020_strategy` builds the stack for one level, :func:`level_budget` gives
the level's budget from the persons budget, and :func:`tda2020_variances` the closed
form of every group's variance.

**On the 252-cell ``pl94`` domain** (voting age x Hispanic x race, no hhgq: the richest
a public P.L. 94-171 file supports), :func:`tda2020_plan` measures the Bureau's groups
that exist without hhgq (:data:`PL94_GROUPS`): ``hhinstlevels`` and ``hhgq`` are gone,
and ``detailed`` summed over hhgq is ``votingage*hispanic*cenrace``, so that group takes
both shares (two Gaussian measurements of one query are one with the shares added).
The shares are then renormalised over the kept groups (:func:`pl94_shares`: the
dropped groups' shares go to the others in proportion), so the level spends its whole
budget and group ``g`` has the measured variance ``1 / (2 rho l q'_g)``; any workload
on the domain (e.g. ``pl94``) is answered from them by least squares.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import LinearQuery, VStack
from dpdask.privacy import Budget, mechanism_for, zCDP
from dpdask.strategy.plan import Plan
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS, pl94_full_group

__all__ = [
    "LEVELS",
    "LEVEL_SHARES",
    "PERSONS_RHO_ADD_REMOVE",
    "PERSONS_RHO_CHANGE_ONE",
    "PL94_GROUPS",
    "QUERY_SHARES",
    "fitness_plan",
    "level_budget",
    "pl94_shares",
    "symmetry_blocks",
    "tda2020_groups",
    "tda2020_plan",
    "tda2020_strategy",
    "tda2020_variances",
]

LEVELS: tuple[str, ...] = ("us", "state", "county", "tract", "block_group", "block")
"""The Bureau's geography levels, top down, as this project names them."""

LEVEL_SHARES: dict[str, Fraction] = {
    lv: Fraction(n, 4099) for lv, n in zip(LEVELS, (104, 1440, 447, 687, 1256, 165), strict=True)
}
"""Each level's share of the persons budget (of 4,099)."""

PERSONS_RHO_CHANGE_ONE: Fraction = Fraction(542, 339) ** 2
"""The persons budget in the Bureau's accounting (``global_scale = 339/542``): zCDP
``rho = (542/339)^2 = 2.5562`` for change-one-record neighbours."""

PERSONS_RHO_ADD_REMOVE: Fraction = PERSONS_RHO_CHANGE_ONE / 2
"""The same noise under add/remove-one-person neighbours: ``rho = 1.2781``."""


def _shares(*pairs: tuple[int, int]) -> tuple[Fraction, ...]:
    return tuple(Fraction(a, b) for a, b in pairs)


QUERY_SHARES: dict[str, dict[str, Fraction]] = {
    lv: dict(zip(PL94_FULL_GROUPS, shares, strict=True))
    for lv, shares in {
        "us": (Fraction(0), *_shares(
            (52, 4097), (26, 4097), (26, 4097), (26, 4097), (26, 4097), (130, 4097),
            (130, 4097), (26, 4097), (26, 241), (189, 241),
        )),
        "state": _shares(
            (3773, 4097), (6, 4097), (6, 4097), (6, 4097), (6, 4097), (6, 4097), (12, 4097),
            (12, 4097), (6, 4097), (2, 241), (230, 4097),
        ),
        "county": _shares(
            (3126, 4097), (10, 4097), (10, 4097), (10, 4097), (10, 4097), (10, 4097),
            (28, 4097), (28, 4097), (10, 4097), (101, 4097), (754, 4097),
        ),
        "tract": _shares(
            (1567, 4102), (4, 2051), (5, 4102), (5, 4102), (5, 4102), (5, 4102),
            (1933, 4102), (10, 2051), (5, 4102), (67, 4102), (241, 2051),
        ),
        "block_group": _shares(
            (1705, 4099), (3, 4099), (3, 4099), (3, 4099), (3, 4099), (3, 4099),
            (1055, 4099), (9, 4099), (3, 4099), (24, 4099), (1288, 4099),
        ),
        "block": _shares(
            (5, 4097), (9, 4097), (5, 4097), (5, 4097), (5, 4097), (5, 4097), (21, 4097),
            (21, 4097), (5, 4097), (71, 4097), (3945, 4097),
        ),
    }.items()
}  # fmt: skip
"""Each level's query shares (the production strategy
``ProductionCandidate20210527US_mult8_add02_dsepJune3``), by group; the US measures no
``total`` (share 0)."""


PL94_GROUPS: dict[str, tuple[str, ...]] = {
    "total": ("total",),
    "cenrace": ("cenrace",),
    "hispanic": ("hispanic",),
    "votingage": ("votingage",),
    "hispanic*cenrace": ("hispanic*cenrace",),
    "votingage*cenrace": ("votingage*cenrace",),
    "votingage*hispanic": ("votingage*hispanic",),
    "votingage*hispanic*cenrace": ("votingage*hispanic*cenrace", "detailed"),
}
"""The groups measured on the ``pl94`` domain, each with the Bureau's groups whose
shares it takes (``hhinstlevels`` and ``hhgq`` have none: they need hhgq)."""

_PL94_ATTRS = {"cenrace": "race", "hispanic": "hisp", "votingage": "votingage"}


def _check_level(level: str) -> str:
    if level not in LEVEL_SHARES:
        raise PlanError(f"tda-2020: unknown level {level!r}; the levels are {list(LEVELS)}")
    return level


def level_budget(persons: Budget, level: str) -> Budget:
    """The budget the Bureau gives ``level``: its share of the persons budget.

    Whatever other levels a release measures, the level gets ``persons * l`` (so
    releasing fewer levels spends less than ``persons``).

    Parameters
    ----------
    persons : Budget
        The persons budget (in the release's neighbour relation).
    level : str
        One of :data:`LEVELS`.

    Examples
    --------
    >>> level_budget(zCDP(4099), "county")
    zCDP(rho=447)
    """
    return persons * LEVEL_SHARES[_check_level(level)]


def tda2020_groups(level: str) -> tuple[str, ...]:
    """The query groups measured at ``level`` (all eleven but the US level's ``total``)."""
    shares = QUERY_SHARES[_check_level(level)]
    return tuple(g for g in PL94_FULL_GROUPS if shares[g] > 0)


def tda2020_strategy(level: str, domain: Domain | None = None) -> tuple[VStack, list[list[int]]]:
    """The Bureau's measurements at ``level``: the groups stacked, scaled by ``sqrt(q)``.

    Parameters
    ----------
    level : str
        One of :data:`LEVELS`.
    domain : Domain, optional
        :func:`dpdask.census.pl94_full_domain` (the default).

    Returns
    -------
    strategy : VStack
        One part per measured group (named as the group), weight ``sqrt(q_g)``; L2
        sensitivity 1.
    groups : list of list of int
        The :func:`~dpdask.workloads.pl94_full.pl94_full` workload terms each part
        answers (its own group; at the US also ``total``, from ``detailed``).

    Raises
    ------
    PlanError
        For an unknown level.
    """
    measured = tda2020_groups(level)
    shares = QUERY_SHARES[level]
    parts: list[LinearQuery] = [pl94_full_group(g, domain) for g in measured]
    weights = [math.sqrt(shares[g]) for g in measured]
    groups = [[PL94_FULL_GROUPS.index(g)] for g in measured]
    for g in PL94_FULL_GROUPS:
        if g not in measured:  # answered from the detailed cells
            groups[measured.index("detailed")].append(PL94_FULL_GROUPS.index(g))
    for gr in groups:
        gr.sort()
    return VStack(parts, weights=weights, names=measured), groups


def tda2020_variances(persons: zCDP, level: str) -> dict[str, float]:
    """The closed form of every measured group's per-query variance at ``level``.

    ``1 / (2 rho l q)`` with ``rho`` the persons budget (add/remove neighbours),
    ``l`` the level's share and ``q`` the group's.

    Examples
    --------
    >>> round(tda2020_variances(zCDP(PERSONS_RHO_ADD_REMOVE), "county")["total"], 2)
    4.7
    """
    rho = Fraction(persons.rho) * LEVEL_SHARES[_check_level(level)]
    shares = QUERY_SHARES[level]
    return {g: float(1 / (2 * rho * shares[g])) for g in tda2020_groups(level)}


def pl94_shares(level: str) -> dict[str, Fraction]:
    """Each :data:`PL94_GROUPS` group's share of ``level``'s budget on the ``pl94``
    domain: the Bureau's shares of its groups, renormalised to add up to 1 (groups of
    share 0, the US level's ``total``, are not measured).

    Examples
    --------
    >>> s = pl94_shares("county")
    >>> s["total"], sum(s.values())
    (Fraction(1042, 1359), Fraction(1, 1))
    """
    q = QUERY_SHARES[_check_level(level)]
    raw = {g: sum((q[b] for b in bureau), Fraction(0)) for g, bureau in PL94_GROUPS.items()}
    kept = sum(raw.values(), Fraction(0))
    return {g: share / kept for g, share in raw.items() if share > 0}


def _pl94_plan(workload: LinearQuery, privacy: Budget, level: str, domain: Domain) -> Plan:
    """The Bureau's groups without hhgq at ``level``, any workload on the pl94 domain."""
    from dpdask.linalg import Identity
    from dpdask.workloads.products import product

    if workload.shape[1] != domain.size:
        raise PlanError(
            f"strategy tda-2020: the workload has {workload.shape[1]} columns, not {domain.size}"
        )
    shares = pl94_shares(level)
    parts: list[LinearQuery] = [
        product(
            domain,
            {
                _PL94_ATTRS[a]: Identity(domain[_PL94_ATTRS[a]])
                for a in g.split("*")
                if a != "total"
            },
        )
        for g in shares
    ]
    strategy = VStack(parts, weights=[math.sqrt(s) for s in shares.values()], names=tuple(shares))
    info = {
        "level": level,
        "level_share": str(LEVEL_SHARES[level]),
        "domain": "pl94: hhinstlevels and hhgq dropped, detailed in votingage*hispanic*cenrace",
        "query_shares": {g: str(s) for g, s in shares.items()},
    }
    return Plan(workload, strategy, privacy, domain=domain, template="tda-2020", info=info)


def tda2020_plan(
    workload: LinearQuery, privacy: Budget, *, level: str, domain: Domain | None = None
) -> Plan:
    """The plan that measures the Bureau's groups at ``level`` with ``privacy``.

    Parameters
    ----------
    workload : LinearQuery
        The :func:`~dpdask.workloads.pl94_full.pl94_full` workload (its eleven groups,
        in order); on the ``pl94`` domain any workload (answered by least squares).
    privacy : zCDP or ApproxDP
        The level's budget (for the Bureau's, :func:`level_budget`).
    level : str
        One of :data:`LEVELS`: which query shares.
    domain : Domain, optional
        :func:`dpdask.census.pl94_full_domain` (the default) or
        :func:`dpdask.census.pl94_domain` (the groups without hhgq, :func:`pl94_shares`).

    Raises
    ------
    PlanError
        For an unknown level, a workload that is not the eleven groups, or a pure-DP
        budget (the Bureau's noise is Gaussian).
    """
    from dpdask import census

    domain = census.pl94_full_domain() if domain is None else domain
    if mechanism_for(privacy) != "gaussian":
        raise PlanError(
            "strategy tda-2020 adds Gaussian noise: give a zCDP or (epsilon, delta) budget"
        )
    if tuple(domain.items()) == tuple(census.pl94_domain().items()):
        return _pl94_plan(workload, privacy, _check_level(level), domain)
    if not (
        isinstance(workload, VStack)
        and workload.names == PL94_FULL_GROUPS
        and workload.shape[1] == domain.size
    ):
        raise PlanError(
            "strategy tda-2020 answers the pl94-full workload (the Bureau's eleven query "
            "groups on the 2,016-cell domain), or any workload on the 252-cell pl94 domain"
        )
    strategy, groups = tda2020_strategy(level, domain)
    info = {"level": level, "level_share": str(LEVEL_SHARES[level])}
    return Plan(
        workload, strategy, privacy, domain=domain, groups=groups, template="tda-2020", info=info
    )


def symmetry_blocks() -> list[list[list[int]]]:
    """The blocks of values the pl94-full groups cannot tell apart, per attribute.

    hhgq by ``hhinstlevels`` (household, institutional, noninstitutional); every other
    attribute one block. Permuting values inside a block maps every group onto itself.
    """
    from dpdask import census

    dom = census.pl94_full_domain()
    return [[list(types) for _, types in census.HHINSTLEVELS]] + [
        [list(range(dom[a]))] for a in dom.attrs[1:]
    ]


def fitness_plan(
    workload: LinearQuery,
    privacy: Budget | None,
    *,
    targets: str = "tda-2020",
    level: str,
    persons: Budget | None = None,
    domain: Domain | None = None,
    maxiter: int = 300,
) -> Plan:
    """Fitness-for-use with the Bureau's per-query variances at ``level`` as targets.

    Problem 1 (``privacy=None``): the least budget whose unbiased release meets, on
    every query, the variance of the Bureau's measured answer at ``level`` when the
    persons budget is ``persons`` (default the production
    :data:`PERSONS_RHO_ADD_REMOVE`); ``plan.info["budget_ratio"]`` is that budget over
    the Bureau's for the level. Problem 2 (a budget): the targets are those of
    ``tda-2020`` with the same budget, and the plan spends it.

    Solved in the workload's invariant algebra
    (:func:`~dpdask.strategy.fitness.solve_symmetric`) from the least-squares
    covariance of the Bureau's own measurements; the plan re-checks every target on
    its dense whitened strategy (``A^T A = Sigma^-1``, 2,016 columns). ``maxiter``
    bounds the solver's iterations (the start already meets the targets).

    Raises
    ------
    PlanError
        For targets other than ``"tda-2020"``, an unknown level, or a solution that
        misses a target.
    """
    import numpy as np

    from dpdask import census
    from dpdask.linalg import Dense
    from dpdask.strategy.fitness import FitnessPlan, solve_symmetric

    if targets != "tda-2020":
        raise PlanError(f"targets: expected 'tda-2020' or numbers, got {targets!r}")
    domain = census.pl94_full_domain() if domain is None else domain
    base = privacy
    if base is None:
        base = level_budget(persons if persons is not None else zCDP(PERSONS_RHO_ADD_REMOVE), level)
    baseline = tda2020_plan(workload, base, level=level, domain=domain)
    c = baseline.query_variances()
    A_tda, _ = tda2020_strategy(level, domain)
    sol = solve_symmetric(workload, c, symmetry_blocks(), start=A_tda, maxiter=maxiter)
    L = np.linalg.cholesky(sol.inverse_dense())
    spend = privacy
    if spend is None:
        rho = Fraction(sol.privacy_cost**2 / 2 * (1 + 1e-9))
        spend = zCDP(Fraction(math.ceil(rho * 10**12), 10**12))
    info = {
        "targets": "tda-2020",
        "level": level,
        "baseline_rho": str(Fraction(base.rho)) if isinstance(base, zCDP) else None,
        "solver": sol.info,
        "start_privacy_cost": sol.start_cost,
        "solution_privacy_cost": sol.privacy_cost,
    }
    plan = FitnessPlan(workload, Dense(np.ascontiguousarray(L.T)), spend, targets=c,
                       domain=domain, info=info)  # fmt: skip
    if privacy is None:
        if plan.max_ratio > 1 + 1e-6:
            raise PlanError(
                f"fitness vs tda-2020 at {level}: a target is missed ({plan.max_ratio})"
            )
        if isinstance(base, zCDP):
            plan.info["budget_ratio"] = float(plan.zcdp().rho / base.rho)
    return plan
