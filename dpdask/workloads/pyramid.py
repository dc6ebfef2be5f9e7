"""The age-pyramid workload of paper 000 (section 7.6).

Schema: sex (2) x age (116 single years, 0..115). The age queries are one range
per age ``a`` plus the voting-age population (age 18 and over); they are asked
(1) for males, (2) for females and (3) for everybody: ``3 x 117 = 351`` queries.

The extracted paper text lost the comparison sign of "age [?] a for all a". We
follow the team's reading that the authors used *suffix* queries, age >= a
(``kind="suffix"``, the default); ``kind="prefix"`` gives age <= a instead. With
suffix queries the voting-age query coincides with the ``a = 18`` suffix; it is
kept as its own row all the same (``voting_age=False`` drops it), so that both
readings ask the same number of queries.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError
from dpdask.linalg import Identity, RangeQueries, VStack
from dpdask.workloads.pl94 import VOTING_AGE
from dpdask.workloads.products import product

__all__ = ["age_pyramid", "age_ranges"]


def age_ranges(
    n: int, kind: Literal["suffix", "prefix"] = "suffix", voting_age: bool = True
) -> RangeQueries:
    """The age queries of the pyramid on ``n`` single years.

    Row ``a`` counts ages ``>= a`` (suffix) or ``<= a`` (prefix), ``a = 0..n-1``;
    with ``voting_age`` a last row counts ages 18 and over.

    Raises
    ------
    ArgumentError
        If ``kind`` is unknown; ``DomainError`` if ``voting_age`` is asked on fewer
        than 19 ages.
    """
    a = np.arange(n)
    if kind == "suffix":
        lo, hi = a, np.full(n, n - 1)
    elif kind == "prefix":
        lo, hi = np.zeros(n, dtype=np.int64), a
    else:
        raise ArgumentError(f"kind must be 'suffix' or 'prefix', not {kind!r}")
    if voting_age:
        if n <= VOTING_AGE:
            raise DomainError(f"the voting-age query needs ages up to at least {VOTING_AGE}")
        lo, hi = np.append(lo, VOTING_AGE), np.append(hi, n - 1)
    return RangeQueries(n, lo, hi)


def age_pyramid(
    domain: Domain | None = None,
    kind: Literal["suffix", "prefix"] = "suffix",
    voting_age: bool = True,
) -> VStack:
    """The age-pyramid workload: age ranges by sex and for all.

    Parameters
    ----------
    domain : Domain, optional
        Default ``Domain(sex=2, age=116)``. Any domain with ``sex`` and ``age``
        attributes works; other attributes are summed over.
    kind : {"suffix", "prefix"}
        Age >= a (default, see the module docstring) or age <= a.
    voting_age : bool
        Add the query age >= 18 to each group.

    Returns
    -------
    VStack
        Part ``"sex*age"`` (the ranges for each sex, sex-major) and part ``"age"``
        (the same ranges for everybody).

    Examples
    --------
    >>> age_pyramid().shape
    (351, 232)
    """
    domain = Domain(sex=2, age=116) if domain is None else domain
    R = age_ranges(domain["age"], kind=kind, voting_age=voting_age)
    by_sex = product(domain, {"sex": Identity(domain["sex"]), "age": R})
    everybody = product(domain, {"age": R})
    return VStack([by_sex, everybody], names=["sex*age", "age"])
