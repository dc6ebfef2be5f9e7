"""The Rhode Island 2010 block domain (voting age x race/ethnicity) and its workload.

The ALARM Project's census-2020 block files (``ri_2010_block.csv``; read by
:func:`dpdask.store.read_ri2010`) give each block's population by eight mutually
exclusive race/ethnicity groups, for all ages and for the voting-age population. The
domain of those counts is::

    votingage (0 under 18, 1 18 and over) x raceeth (8 groups, RACEETH order)

16 cells. The groups are Hispanic or Latino (of any race) and, for the population
that is not Hispanic or Latino, each of the six races alone and two or more races.
"""

from __future__ import annotations

from dpdask.domain import Domain
from dpdask.errors import DomainError
from dpdask.linalg import Identity, VStack
from dpdask.workloads.products import product

__all__ = ["RACEETH", "RACEETH_LABELS", "ri2010", "ri2010_domain"]

RACEETH: tuple[str, ...] = ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")
"""Short names of the race/ethnicity groups, in the order of the file's columns
(``pop_white`` .. ``pop_two``); value ``i`` of ``raceeth`` is ``RACEETH[i]``."""

RACEETH_LABELS: tuple[str, ...] = (
    "White alone, not Hispanic or Latino",
    "Black or African American alone, not Hispanic or Latino",
    "Hispanic or Latino",
    "American Indian and Alaska Native alone, not Hispanic or Latino",
    "Asian alone, not Hispanic or Latino",
    "Native Hawaiian and Other Pacific Islander alone, not Hispanic or Latino",
    "Some Other Race alone, not Hispanic or Latino",
    "Two or more races, not Hispanic or Latino",
)
"""Readable names of the race/ethnicity groups, in :data:`RACEETH` order."""


def ri2010_domain() -> Domain:
    """The domain of the Rhode Island 2010 block counts: votingage 2 x raceeth 8.

    Returns
    -------
    Domain
        ``Domain(votingage=2, raceeth=8)``, 16 cells.

    Examples
    --------
    >>> ri2010_domain()
    Domain(votingage=2, raceeth=8)
    """
    return Domain(votingage=2, raceeth=len(RACEETH))


def ri2010(domain: Domain | None = None) -> VStack:
    """The RI 2010 workload: the total, both one-way marginals and every cell.

    Parameters
    ----------
    domain : Domain, optional
        Default :func:`ri2010_domain`. Any domain with ``votingage`` (2) and
        ``raceeth`` (8); other attributes are summed over.

    Returns
    -------
    VStack
        Parts ``"total"`` (1), ``"votingage"`` (2), ``"raceeth"`` (8) and
        ``"identity"`` (16: the votingage x raceeth cells), 27 queries.

    Raises
    ------
    DomainError
        If ``votingage`` or ``raceeth`` is missing or has the wrong size.

    Examples
    --------
    >>> W = ri2010()
    >>> W.shape, W.names
    ((27, 16), ('total', 'votingage', 'raceeth', 'identity'))
    """
    domain = ri2010_domain() if domain is None else domain
    for attr, size in (("votingage", 2), ("raceeth", len(RACEETH))):
        if attr not in domain:
            raise DomainError(f"the ri2010 workload needs attribute {attr!r} ({size} values)")
        if domain[attr] != size:
            raise DomainError(f"attribute {attr!r} must have {size} values, not {domain[attr]}")
    parts = [
        product(domain, {}),
        product(domain, {"votingage": Identity(2)}),
        product(domain, {"raceeth": Identity(len(RACEETH))}),
        product(domain, {"votingage": Identity(2), "raceeth": Identity(len(RACEETH))}),
    ]
    return VStack(parts, names=["total", "votingage", "raceeth", "identity"])
