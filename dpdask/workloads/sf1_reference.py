"""The SF1 person workload as the HDMM reference encodes it, for like-for-like comparisons.

HDMM's authors published their own encoding of the Census 2010 Summary File 1
person tables (paper 003 quotes "4151 queries, a union of 32 products"). It is
smaller than :func:`dpdask.workloads.sf1_persons` (4,327 queries in 78 products:
all published lines of more tables) and uses another race coding, so error
figures of the two cannot be compared. This module rebuilds the reference's
workload from its description, on its own domain
(:func:`hdmm_reference_domain`), so that a strategy selected by dpdask can be
held against the reference's figures.

Domain: ``sex 2 x hisp 2 x race 64 x relation 17 x age 115``
(500,480 cells). Sex and Hispanic origin follow
:mod:`dpdask.census` (0 = male, 1 = female; 0 = not Hispanic,
1 = Hispanic). Race is a 6-bit code: bit ``i`` is set when race
:data:`~dpdask.census.RACES` ``[i]`` is checked (bit 0 White, 1 Black,
2 AIAN, 3 Asian, 4 NHPI, 5 Some Other Race), so value 0 means *no race checked*,
a cell no real person occupies. No query of this workload looks at the
relationship, which is summed over everywhere; on a domain without a
``relation`` attribute the builder gives the same queries on the smaller domain.

Predicates (rows of the per-attribute factors):

``race1`` (7 rows)
    each race alone (values 1, 2, 4, 8, 16, 32), then "two or more races",
    the complement of the six: as in the reference, it also counts value 0.
``race2`` (70 rows)
    each of the 63 non-empty combinations (values 1..63 in numeric order), then
    "exactly k races" for k = 1..6, then "two or more races"; value 0 is in no row.
``white``
    White alone (value 1).
``sex``, ``sex+``
    each sex (2 rows); each sex then both (3 rows).
``hisp``
    each origin (2 rows); ``hisp=1`` Hispanic only, ``hisp=0`` not Hispanic only.
``adult``
    18 and over. ``age1``: P12's 23 age bands (0-4, 5-9, ..., 80-84, 85+).
    ``age3``: PCT12's 103 groups (single years 0..99, 100-104, 105-109, 110+).

=========  =====================================================================  =====
table      products (unnamed attributes are summed over)                          rows
=========  =====================================================================  =====
P1         total                                                                      1
P3         race1; total                                                           7 + 1
P4         hisp; total                                                            2 + 1
P5         hisp x race1; hisp+ (each origin then both)                           14 + 3
P8         race2; total                                                          70 + 1
P9         hisp; hisp=0 x race2; total                                       2 + 70 + 1
P10        race2 x adult; adult                                                  70 + 1
P11        hisp x adult; hisp=0 x race2 x adult; adult                       2 + 70 + 1
P12        sex x age1; sex+                                                      46 + 3
P12A_I     sex x race1 x age1; sex+ x race1; sex x hisp=1 x age1; sex+ x        441
           hisp=1; sex x hisp=0 x white x age1; sex+ x hisp=0 x white
PCT12      sex x age3; sex+                                                     206 + 3
PCT12A_O   sex x race1 x age3; sex+ x race1; sex x hisp=1 x age3; sex+ x       3,135
           hisp=1; sex x hisp=0 x race1 x age3; sex+ x hisp=0 x race1
=========  =====================================================================  =====

In all **4,151 queries in 33 products**: the reference's module lists 33
Kronecker products (the total P1 appears five times, P10's "adult" and P12's
"sex+" twice each); the slides' "32" is one fewer. Its L1 sensitivity is 41 (a
non-Hispanic adult of two or more races enters 41 queries; see
``tests/unit/test_sf1_reference.py``); the slides quote "sensitivity = 50".
"""

from __future__ import annotations

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import DomainError
from dpdask.linalg import Identity, Kron, LinearQuery, VStack
from dpdask.workloads.products import indicator, product
from dpdask.workloads.sf1 import P12_AGE_BANDS, PCT12_AGE_BANDS, age_bands, check_person_domain

__all__ = [
    "REFERENCE_TABLES",
    "hdmm_reference_domain",
    "race_code",
    "sf1_hdmm_reference",
    "sf1_hdmm_reference_tables",
]

_N_RACE = 64
_MIN_AGE = 111  # age3 needs 110 and one more value

REFERENCE_TABLES: tuple[str, ...] = (
    "P1", "P3", "P4", "P5", "P8", "P9", "P10", "P11", "P12", "P12A_I", "PCT12", "PCT12A_O",
)  # fmt: skip
"""Names of the reference's SF1 person tables, in the order of :func:`sf1_hdmm_reference`."""


def hdmm_reference_domain() -> Domain:
    """The reference's person domain: sex 2, hisp 2, race 64, relation 17, age 115."""
    return Domain(sex=2, hisp=2, race=_N_RACE, relation=17, age=115)


def race_code(races: set[int] | frozenset[int] | list[int] | tuple[int, ...]) -> int:
    """The 6-bit race value of a set of race indices (0 White, ..., 5 Some Other Race).

    Examples
    --------
    >>> race_code([0]), race_code([0, 1]), race_code([])
    (1, 3, 0)
    """
    code = 0
    for i in set(races):
        if not 0 <= int(i) < 6:
            raise DomainError(f"race index {i} is outside 0..5")
        code |= 1 << int(i)
    return code


# -- per-attribute predicates -------------------------------------------------
def _bits() -> np.ndarray:
    return np.array([bin(v).count("1") for v in range(_N_RACE)])


def _race1() -> LinearQuery:
    alone = [[1 << i] for i in range(6)]
    rest = [v for v in range(_N_RACE) if v not in {1 << i for i in range(6)}]
    return indicator(_N_RACE, [*alone, rest])


def _race2() -> LinearQuery:
    k = _bits()
    combos = [[v] for v in range(1, _N_RACE)]
    counts = [np.flatnonzero(k == j) for j in range(1, 7)]
    return indicator(_N_RACE, [*combos, *counts, np.flatnonzero(k >= 2)])


def _products(n_age: int) -> dict[str, list[dict[str, LinearQuery]]]:
    race1, race2 = _race1(), _race2()
    white = indicator(_N_RACE, [[1]])
    sex, sex_t = Identity(2), indicator(2, [[0], [1], range(2)])
    hisp, hisp_t = Identity(2), indicator(2, [[0], [1], range(2)])
    yes, no = indicator(2, [[1]]), indicator(2, [[0]])
    adult = indicator(n_age, [range(18, n_age)])
    age1 = indicator(n_age, age_bands(P12_AGE_BANDS, n_age))
    age3 = indicator(n_age, age_bands(PCT12_AGE_BANDS, n_age))
    total: dict[str, LinearQuery] = {}

    def iterations(age: LinearQuery, last_race: LinearQuery) -> list[dict[str, LinearQuery]]:
        return [
            {"sex": sex, "race": race1, "age": age},
            {"sex": sex_t, "race": race1},
            {"sex": sex, "hisp": yes, "age": age},
            {"sex": sex_t, "hisp": yes},
            {"sex": sex, "hisp": no, "race": last_race, "age": age},
            {"sex": sex_t, "hisp": no, "race": last_race},
        ]

    return {
        "P1": [total],
        "P3": [{"race": race1}, total],
        "P4": [{"hisp": hisp}, total],
        "P5": [{"hisp": hisp, "race": race1}, {"hisp": hisp_t}],
        "P8": [{"race": race2}, total],
        "P9": [{"hisp": hisp}, {"hisp": no, "race": race2}, total],
        "P10": [{"race": race2, "age": adult}, {"age": adult}],
        "P11": [{"hisp": hisp, "age": adult}, {"hisp": no, "race": race2, "age": adult},
                {"age": adult}],
        "P12": [{"sex": sex, "age": age1}, {"sex": sex_t}],
        "P12A_I": iterations(age1, white),
        "PCT12": [{"sex": sex, "age": age3}, {"sex": sex_t}],
        "PCT12A_O": iterations(age3, race1),
    }  # fmt: skip


def sf1_hdmm_reference_tables(domain: Domain | None = None) -> dict[str, list[Kron]]:
    """The reference's SF1 person tables, each as its list of product workloads.

    Parameters
    ----------
    domain : Domain, optional
        Default :func:`hdmm_reference_domain`. It needs ``sex`` (2), ``hisp`` (2),
        ``race`` (64, the 6-bit code) and ``age`` (at least 111 single years), in
        any order; every other attribute (``relation`` on the default) is summed over.

    Returns
    -------
    dict of str to list of Kron
        Table name to its products, in :data:`REFERENCE_TABLES` order.

    Raises
    ------
    DomainError
        If an attribute is missing or has the wrong size.
    """
    domain = hdmm_reference_domain() if domain is None else domain
    check_person_domain(
        domain, "the HDMM reference SF1", {"sex": 2, "hisp": 2, "race": _N_RACE}, _MIN_AGE,
        missing="none",
    )  # fmt: skip
    return {t: [product(domain, f) for f in fs] for t, fs in _products(domain["age"]).items()}


def sf1_hdmm_reference(domain: Domain | None = None) -> VStack:
    """The HDMM reference's SF1 person workload: 4,151 queries in 33 Kronecker products.

    Parameters
    ----------
    domain : Domain, optional
        As in :func:`sf1_hdmm_reference_tables`; pass one without ``relation``
        (``hdmm_reference_domain().project(["sex", "hisp", "race", "age"])``) for
        the workload with the relationship attribute dropped.

    Returns
    -------
    VStack
        One part per product, named by its table.

    Examples
    --------
    >>> W = sf1_hdmm_reference()
    >>> W.shape, len(W.parts)
    ((4151, 500480), 33)
    """
    parts, names = [], []
    for name, products in sf1_hdmm_reference_tables(domain).items():
        parts.extend(products)
        names.extend([name] * len(products))
    return VStack(parts, names=names)
