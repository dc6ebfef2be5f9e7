"""Census codings shared by the workloads, the ingestion code, the labels and the
synthetic data.

One place fixes how the categorical Census attributes are numbered, so that a
workload row, an ingested summary-file column, a published label and a synthetic
record agree. A low-level module: it depends only on :mod:`dpdask.domain`.

Race (``race``, 63 values)
    The six OMB race categories of the 2010 Census, in the Census's own order,
    :data:`RACES`: White; Black or African American; American Indian and Alaska
    Native; Asian; Native Hawaiian and Other Pacific Islander; Some Other Race. A
    person reports any non-empty subset of them, giving 63 values. Index order is
    the Census tabulation order (Table P1 of the P.L. 94-171 file, Table P8 of
    SF1): by number of races (1, 2, ..., 6), then lexicographically in
    :data:`RACES` order. So indices 0-5 are the six single races, 6-20 the 15
    two-race combinations (White;Black, White;AIAN, ..., NHPI;Some Other Race),
    21-40 the 20 three-race ones, 41-55 four, 56-61 five and 62 all six.
    :func:`race_combinations` lists them, :func:`race_index` inverts it.

Hispanic origin (``hisp``, 2 values)
    0 = Not Hispanic or Latino, 1 = Hispanic or Latino (the order of SF1 P4/P5).

Sex (``sex``, 2 values)
    0 = Male, 1 = Female (the order of SF1 P12).

Voting age (``votingage``, 2 values)
    0 = under 18 years, 1 = 18 years and over.

Age (``age``)
    Single years from 0; on the CPH domain 115 values, 0..114 (SF1's top age band
    is "110 years and over", values 110..114).

Household or group-quarters type (``hhgq``, 8 values), :data:`HHGQ`
    The 2020 P.L. 94-171 person histogram's type of living quarters: 0 household,
    1 correctional facilities for adults, 2 juvenile facilities, 3 nursing /
    skilled-nursing facilities, 4 other institutional, 5 college / university
    student housing, 6 military quarters, 7 other noninstitutional. The
    ``hhinstlevels`` recode, :data:`HHINSTLEVELS`, groups them into household
    {0}, institutional {1, 2, 3, 4} and noninstitutional {5, 6, 7}.

Relationship (``relation``, 17 values), :data:`RELATIONSHIPS`
    The 2010 questionnaire's relationship item in its order (Person 1 is the
    householder; Persons 2+ choose one of 15 relationships to Person 1), plus one
    category for everyone in group quarters: 0 householder, 1 husband or wife,
    2 biological son or daughter, 3 adopted son or daughter, 4 stepson or
    stepdaughter, 5 brother or sister, 6 father or mother, 7 grandchild,
    8 parent-in-law, 9 son-in-law or daughter-in-law, 10 other relative,
    11 roomer or boarder, 12 housemate or roommate, 13 unmarried partner,
    14 foster child, 15 other nonrelative, 16 in group quarters. The person
    domain has no household type (family or not, living alone) and does not
    split group quarters into institutionalised and not; tables that need them
    are encoded without those lines (see :mod:`dpdask.workloads.sf1`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from functools import cache

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError

__all__ = [
    "HHGQ",
    "HHGQ_LABELS",
    "HHINSTLEVELS",
    "HISPANIC",
    "RACES",
    "RACE_LABELS",
    "RELATIONSHIPS",
    "SEXES",
    "cph_domain",
    "n_races",
    "pl94_domain",
    "pl94_full_domain",
    "race_combinations",
    "race_index",
    "race_label",
    "race_membership",
    "relation_index",
]

RACES: tuple[str, ...] = ("white", "black", "aian", "asian", "nhpi", "other")
"""Short names of the six OMB race categories, in Census order."""

RACE_LABELS: tuple[str, ...] = (
    "White",
    "Black or African American",
    "American Indian and Alaska Native",
    "Asian",
    "Native Hawaiian and Other Pacific Islander",
    "Some Other Race",
)
"""The Census's labels of :data:`RACES`."""

SEXES: tuple[str, ...] = ("male", "female")
HISPANIC: tuple[str, ...] = ("not hispanic", "hispanic")

HHGQ: tuple[str, ...] = (
    "household",
    "correctional",
    "juvenile",
    "nursing",
    "other institutional",
    "college",
    "military",
    "other noninstitutional",
)
"""Short names of the 8 household / group-quarters types (module docstring)."""

HHGQ_LABELS: tuple[str, ...] = (
    "Household",
    "Correctional facilities for adults",
    "Juvenile facilities",
    "Nursing facilities/Skilled-nursing facilities",
    "Other institutional facilities",
    "College/University student housing",
    "Military quarters",
    "Other noninstitutional facilities",
)
"""Readable labels of :data:`HHGQ`."""

HHINSTLEVELS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("household", (0,)),
    ("institutional", (1, 2, 3, 4)),
    ("noninstitutional", (5, 6, 7)),
)
"""The ``hhinstlevels`` recode of :data:`HHGQ`: each level's name and its types."""

RELATIONSHIPS: tuple[str, ...] = (
    "householder",
    "spouse",
    "biological child",
    "adopted child",
    "stepchild",
    "sibling",
    "parent",
    "grandchild",
    "parent-in-law",
    "child-in-law",
    "other relative",
    "roomer or boarder",
    "housemate or roommate",
    "unmarried partner",
    "foster child",
    "other nonrelative",
    "group quarters",
)
"""The 17 relationship categories of the CPH person domain (module docstring)."""


@cache
def race_combinations() -> tuple[tuple[int, ...], ...]:
    """The 63 race combinations, as sorted tuples of indices into :data:`RACES`.

    Ordered by number of races, then lexicographically (the Census order).

    Examples
    --------
    >>> combos = race_combinations()
    >>> len(combos), combos[0], combos[6], combos[-1]
    (63, (0,), (0, 1), (0, 1, 2, 3, 4, 5))
    """
    k = len(RACES)
    return tuple(c for r in range(1, k + 1) for c in itertools.combinations(range(k), r))


@cache
def _race_lookup() -> dict[tuple[int, ...], int]:
    return {c: i for i, c in enumerate(race_combinations())}


def race_index(races: Iterable[int | str]) -> int:
    """The race value (0..62) of a set of races given by index or short name.

    Raises
    ------
    ArgumentError
        If the set is empty; ``DomainError`` if it names an unknown race.

    Examples
    --------
    >>> race_index(["white"]), race_index(["black", "white"]), race_index(range(6))
    (0, 6, 62)
    """
    idx = set()
    for r in races:
        if isinstance(r, str):
            if r not in RACES:
                raise DomainError(f"unknown race {r!r}; races are {RACES}")
            idx.add(RACES.index(r))
        else:
            if not 0 <= int(r) < len(RACES):
                raise DomainError(f"race index {r!r} is outside 0..{len(RACES) - 1}")
            idx.add(int(r))
    if not idx:
        raise ArgumentError("a race combination needs at least one race")
    return _race_lookup()[tuple(sorted(idx))]


def race_label(index: int) -> str:
    """A readable label of race value ``index``, e.g. ``"White; Asian"``."""
    return "; ".join(RACE_LABELS[r] for r in race_combinations()[index])


def race_membership() -> np.ndarray:
    """Boolean ``(63, 6)`` matrix: ``[c, r]`` is true when combination ``c`` includes race ``r``."""
    M = np.zeros((len(race_combinations()), len(RACES)), dtype=bool)
    for c, combo in enumerate(race_combinations()):
        M[c, list(combo)] = True
    return M


def n_races() -> np.ndarray:
    """Number of races (1..6) of each of the 63 combinations."""
    return np.array([len(c) for c in race_combinations()])


def relation_index(name: str) -> int:
    """The relationship value of a category name in :data:`RELATIONSHIPS`."""
    if name not in RELATIONSHIPS:
        raise DomainError(f"unknown relationship {name!r}; categories are {RELATIONSHIPS}")
    return RELATIONSHIPS.index(name)


def cph_domain() -> Domain:
    """The Census CPH person domain: sex 2, hisp 2, race 63, relation 17, age 115."""
    return Domain(sex=2, hisp=2, race=63, relation=len(RELATIONSHIPS), age=115)


def pl94_domain() -> Domain:
    """The P.L. 94-171 domain of paper 000 section 7.3: votingage 2, hisp 2, race 63."""
    return Domain(votingage=2, hisp=2, race=63)


def pl94_full_domain() -> Domain:
    """The 2020 P.L. 94-171 person histogram: hhgq 8, votingage 2, hisp 2, race 63.

    2,016 cells, the Census Bureau's production histogram (``pl94-full``). The
    attributes keep this module's names and codings (:data:`HHGQ`, voting age,
    Hispanic origin, race), so the Bureau's ``hispanic`` is ``hisp`` here and its
    ``cenrace`` is ``race``.

    Examples
    --------
    >>> pl94_full_domain().size
    2016
    """
    return Domain(hhgq=len(HHGQ), votingage=2, hisp=2, race=63)
