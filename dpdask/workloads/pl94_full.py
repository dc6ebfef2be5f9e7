"""The Census Bureau's 2020 P.L. 94-171 person workload on the 2,016-cell histogram.

On :func:`dpdask.census.pl94_full_domain` (hhgq 8, votingage 2, hisp 2, race 63) the
Bureau's production system measures eleven query groups at every geography level
(``../shared/design/tda-2020.md``). Each group is one Kronecker product of
per-attribute factors (Total, Identity, or the ``3 x 8`` ``hhinstlevels`` recode of
hhgq) and one named part of the workload, in the facts sheet's order:

==============================  =====================================  ====
group                           factors (hhgq, votingage, hisp, race)  rows
==============================  =====================================  ====
``total``                       T, T, T, T                                1
``cenrace``                     T, T, T, I                               63
``hispanic``                    T, T, I, T                                2
``votingage``                   T, I, T, T                                2
``hhinstlevels``                R, T, T, T                                3
``hhgq``                        I, T, T, T                                8
``hispanic*cenrace``            T, T, I, I                              126
``votingage*cenrace``           T, I, T, I                              126
``votingage*hispanic``          T, I, I, T                                4
``votingage*hispanic*cenrace``  T, I, I, I                              252
``detailed``                    I, I, I, I                            2,016
==============================  =====================================  ====

2,603 queries in all. Group names are the Bureau's (its ``hispanic`` and ``cenrace``
are this domain's ``hisp`` and ``race``); rows follow the domain's C order within a
group, so a release labels them ``hhgq_001`` (household) .. ``hhgq_008``.
"""

from __future__ import annotations

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError
from dpdask.linalg import Identity, LinearQuery, Sparse, VStack
from dpdask.workloads.products import indicator, product

__all__ = [
    "PL94_FULL_GROUPS",
    "group_factor_kinds",
    "hhinstlevels_recode",
    "pl94_full",
    "pl94_full_group",
]

PL94_FULL_GROUPS: tuple[str, ...] = (
    "total",
    "cenrace",
    "hispanic",
    "votingage",
    "hhinstlevels",
    "hhgq",
    "hispanic*cenrace",
    "votingage*cenrace",
    "votingage*hispanic",
    "votingage*hispanic*cenrace",
    "detailed",
)
"""The Bureau's eleven query groups, in the facts sheet's order (the workload's parts)."""

# each group's factors: attribute -> "I" (identity) or "R" (the hhinstlevels recode)
_FACTORS: dict[str, dict[str, str]] = {
    "total": {},
    "cenrace": {"race": "I"},
    "hispanic": {"hisp": "I"},
    "votingage": {"votingage": "I"},
    "hhinstlevels": {"hhgq": "R"},
    "hhgq": {"hhgq": "I"},
    "hispanic*cenrace": {"hisp": "I", "race": "I"},
    "votingage*cenrace": {"votingage": "I", "race": "I"},
    "votingage*hispanic": {"votingage": "I", "hisp": "I"},
    "votingage*hispanic*cenrace": {"votingage": "I", "hisp": "I", "race": "I"},
    "detailed": {"hhgq": "I", "votingage": "I", "hisp": "I", "race": "I"},
}


def hhinstlevels_recode() -> Sparse:
    """The ``3 x 8`` recode of hhgq: household, institutional, noninstitutional.

    Examples
    --------
    >>> hhinstlevels_recode().dense().astype(int)
    array([[1, 0, 0, 0, 0, 0, 0, 0],
           [0, 1, 1, 1, 1, 0, 0, 0],
           [0, 0, 0, 0, 0, 1, 1, 1]])
    """
    return indicator(len(census.HHGQ), [types for _, types in census.HHINSTLEVELS])


def _check(domain: Domain) -> None:
    expected = census.pl94_full_domain()
    if tuple(domain.items()) != tuple(expected.items()):
        raise DomainError(f"the pl94-full workload needs the domain {expected!r}, got {domain!r}")


def group_factor_kinds(name: str) -> tuple[str, ...]:
    """Each attribute's factor of group ``name`` (in the domain's order): ``"I"``
    (identity), ``"R"`` (the hhinstlevels recode) or ``"T"`` (total).

    Examples
    --------
    >>> group_factor_kinds("votingage*cenrace")
    ('T', 'I', 'T', 'I')
    """
    if name not in _FACTORS:
        raise ArgumentError(f"unknown query group {name!r}; groups are {PL94_FULL_GROUPS}")
    return tuple(_FACTORS[name].get(a, "T") for a in census.pl94_full_domain().attrs)


def pl94_full_group(name: str, domain: Domain | None = None) -> LinearQuery:
    """One of :data:`PL94_FULL_GROUPS` as a Kronecker product on ``domain``.

    Raises
    ------
    ArgumentError
        For an unknown group; ``DomainError`` for a domain other than the 2,016-cell
        histogram.
    """
    domain = census.pl94_full_domain() if domain is None else domain
    _check(domain)
    if name not in _FACTORS:
        raise ArgumentError(f"unknown query group {name!r}; groups are {PL94_FULL_GROUPS}")
    factors: dict[str, LinearQuery] = {
        attr: hhinstlevels_recode() if kind == "R" else Identity(domain[attr])
        for attr, kind in _FACTORS[name].items()
    }
    return product(domain, factors)


def pl94_full(domain: Domain | None = None) -> VStack:
    """The Bureau's eleven P.L. 94-171 query groups: 2,603 queries on 2,016 cells.

    Parameters
    ----------
    domain : Domain, optional
        :func:`dpdask.census.pl94_full_domain` (the default; no other is accepted).

    Returns
    -------
    VStack
        One part per group of :data:`PL94_FULL_GROUPS`, named as there.

    Raises
    ------
    DomainError
        If the domain is not the 2,016-cell histogram.

    Examples
    --------
    >>> W = pl94_full()
    >>> W.shape, W.names[:3]
    ((2603, 2016), ('total', 'cenrace', 'hispanic'))
    """
    domain = census.pl94_full_domain() if domain is None else domain
    return VStack([pl94_full_group(g, domain) for g in PL94_FULL_GROUPS], names=PL94_FULL_GROUPS)
