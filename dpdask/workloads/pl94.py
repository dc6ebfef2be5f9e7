"""The P.L. 94-171 redistricting workload of paper 000 (section 7.3).

On the domain (votingage 2, hisp 2, race 63) of 252 cells the workload is the
union of

a) the voting-age marginal (2 queries: under 18, 18 and over),
b) the ethnicity marginal (2: not Hispanic, Hispanic),
c) each single race (6: the people who reported exactly that one race),
d) each combination of two or more races (57),
e) the identity (252),

319 queries in all. Race values follow :mod:`dpdask.census`.
(The HDMM tutorial, paper 003, quotes 288 PL94 queries for its own variant.)
"""

from __future__ import annotations

import numpy as np

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import DomainError
from dpdask.linalg import Identity, LinearQuery, VStack
from dpdask.workloads.products import indicator, product

__all__ = ["VOTING_AGE", "pl94", "voting_age_factor"]

VOTING_AGE = 18
"""Age at which a person counts as voting age (18 and over)."""


def voting_age_factor(domain: Domain) -> tuple[str, LinearQuery]:
    """The voting-age predicates (under 18, 18 and over) on ``domain``.

    Returns the attribute they act on and their ``2 x n`` matrix: Identity on a
    ``votingage`` attribute of size 2, or the two age ranges on an ``age``
    attribute of single years.

    Raises
    ------
    DomainError
        If the domain has neither attribute (or ``age`` has no one of voting age).
    """
    if "votingage" in domain:
        _require_size(domain, "votingage", 2)
        return "votingage", Identity(2)
    if "age" in domain:
        n = domain["age"]
        if n <= VOTING_AGE:
            raise DomainError(f"attribute 'age' has {n} values, so nobody is {VOTING_AGE} or over")
        return "age", indicator(n, [range(0, VOTING_AGE), range(VOTING_AGE, n)])
    raise DomainError(f"the domain {domain!r} has neither a 'votingage' nor an 'age' attribute")


def _require_size(domain: Domain, attr: str, size: int) -> None:
    if domain[attr] != size:
        raise DomainError(f"attribute {attr!r} must have {size} values, not {domain[attr]}")


def pl94(domain: Domain | None = None) -> VStack:
    """The PL94 workload of paper 000 section 7.3: 319 queries on 252 cells.

    Parameters
    ----------
    domain : Domain, optional
        Default :func:`dpdask.census.pl94_domain` (votingage 2, hisp 2,
        race 63). Any domain with ``hisp`` (2), ``race`` (63) and either
        ``votingage`` (2) or ``age`` (single years) works; other attributes are
        summed over, so on the CPH domain the same 319 queries are asked.

    Returns
    -------
    VStack
        Parts ``"votingage"`` (2), ``"hisp"`` (2), ``"race-single"`` (6),
        ``"race-multiple"`` (57) and ``"identity"`` (252: the voting age x hisp x
        race cells, in the domain's attribute order).

    Raises
    ------
    DomainError
        If a required attribute is missing or has the wrong size.

    Examples
    --------
    >>> W = pl94()
    >>> W.shape, W.names
    ((319, 252), ('votingage', 'hisp', 'race-single', 'race-multiple', 'identity'))
    """
    domain = census.pl94_domain() if domain is None else domain
    _require_size(domain, "hisp", 2)
    _require_size(domain, "race", len(census.race_combinations()))
    va_attr, va = voting_age_factor(domain)
    k = census.n_races()
    single = indicator(k.size, [[c] for c in np.flatnonzero(k == 1)])
    multiple = indicator(k.size, [[c] for c in np.flatnonzero(k >= 2)])
    parts = [
        product(domain, {va_attr: va}),
        product(domain, {"hisp": Identity(2)}),
        product(domain, {"race": single}),
        product(domain, {"race": multiple}),
        product(domain, {va_attr: va, "hisp": Identity(2), "race": Identity(k.size)}),
    ]
    return VStack(parts, names=["votingage", "hisp", "race-single", "race-multiple", "identity"])
