"""The Census 2010 Summary File 1 person workload on the CPH domain.

Every table below is encoded as a union of product workloads on the domain
``sex 2 x hisp 2 x race 63 x relation 17 x age 115`` (492,660 cells; codings in
:mod:`dpdask.census`), one :class:`~dpdask.linalg.Kron` per block of
lines that is a product, with small per-attribute factors. A table's rows are
*all its published lines*, subtotals and the table's own total included, so a
table encodes as many queries as the Census publishes cells (the ``[n]`` of the
SF1 technical documentation), in the published line order, except for the three
relationship tables marked "collapsed": the lines the person domain cannot express
are left out and the rows follow the order listed below.

=========  ===================================================================  =====
table      lines encoded                                                        rows
=========  ===================================================================  =====
P1         total population                                                         1
P3         race: total, 6 races alone, two or more races                            8
P4         Hispanic origin: total, not Hispanic, Hispanic                           3
P5         Hispanic origin by race (P3's lines under each origin) and total        17
P6         total races tallied (each person counts once per race reported),         7
           and each race alone or in combination
P7         P6 by Hispanic origin, and the overall races tallied                    15
P8         race: total, one race (6), two or more: by number of races with         71
           each combination (15, 20, 15, 6, 1) under its subtotal
P9         total; Hispanic; not Hispanic, then P8's lines for not Hispanic         73
P10, P11   P8 and P9 for the population 18 years and over                      71, 73
P12        total; male, then 23 age bands (under 5, 5-9, 10-14, 15-17, 18-19,     49
           20, 21, 22-24, 25-29, ..., 60-61, 62-64, 65-66, 67-69, 70-74, ...,
           85+); female, then the same bands
P12A-I     P12 for White alone, ..., Some Other Race alone, two or more races,  9 x 49
           Hispanic, White alone not Hispanic
P14        sex by single year of age for the population under 20                   43
P16        population in households: total, under 18, 18 and over                   3
P29        relationship (collapsed): total; in households; householder;        17
           spouse; biological, adopted, stepchild; grandchild; brother or
           sister; parent; parent-in-law; son- or daughter-in-law; other
           relatives; nonrelatives; in group quarters; male, female householder
P32        relationship for the population under 18 (collapsed): total; in         29
           households; householder or spouse; related child; own child; other
           relatives; nonrelatives; in group quarters; then own child, other
           relatives and nonrelatives each by age (under 3, 3-4, 5, 6-11, 12-13,
           14, 15-17)
P34        relationship for the population 65 and over (collapsed): total; in      11
           households; householder; spouse; parent; parent-in-law; other
           relatives; nonrelatives; in group quarters; male, female householder
PCT12      sex by single year of age: under 1, 1, ..., 99, 100-104, 105-109,      209
           110 and over
PCT12A-O   PCT12 for the 7 race groups, Hispanic, and the 7 race groups        15 x 209
           not Hispanic
PCT13      sex by age (P12's bands) for the population in households               49
votingage  under 18, 18 and over (the PL94 voting-age rows)                         2
=========  ===================================================================  =====

In all **4,327 queries in 78 products**. The HDMM tutorial (paper 003) quotes
4151 person queries in a union of 32 products with sensitivity about 50 for its
own encoding, whose table list it does not give (its P12 example drops the
table's total line). Here duplicated lines are kept (P1's total is also the first
line of P3, P4, P5, ...): each published cell is a query. So the L1 sensitivity,
the largest number of queries one person enters with the races-tallied lines
weighted by the number of races, is 85 (a non-Hispanic householder of six races,
65 or over); the L2 sensitivity is sqrt(175). Both come from the structure
(:meth:`~dpdask.linalg.LinearQuery.sensitivity`), without materialising.

Collapsed tables: the person domain has no household type (family or nonfamily,
living alone) and no institutional split of group quarters, so P29, P32 and P34
merge the family / nonfamily branches (their householder and nonrelatives lines
count all households) and keep group quarters as one line. "Own child" is a
biological, adopted or stepchild of the householder (marital status is not in the
domain); "other relatives" under 18 are the other relatives of the householder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, VStack
from dpdask.workloads.products import ValueGroup, indicator, product

__all__ = [
    "P12_AGE_BANDS",
    "TABLES",
    "sf1_persons",
    "sf1_tables",
]

P12_AGE_BANDS: tuple[int, ...] = (
    0, 5, 10, 15, 18, 20, 21, 22, 25, 30, 35, 40, 45, 50, 55, 60, 62, 65, 67, 70, 75, 80, 85,
)  # fmt: skip
"""Lower ends of the 23 age bands of table P12 (the last, 85, is open)."""

P32_AGE_BANDS: tuple[int, ...] = (0, 3, 5, 6, 12, 14, 15)
"""Lower ends of the 7 age bands of table P32 (under 18; the last is 15-17)."""

PCT12_AGE_BANDS: tuple[int, ...] = (*range(100), 100, 105, 110)
"""Lower ends of the 103 age groups of table PCT12 (single years to 99, then 5-year, 110+)."""

_N_RACE = 63
_N_REL = len(census.RELATIONSHIPS)
_MIN_AGE = 111  # PCT12 needs 110 and one more value


# -- per-attribute predicate groups -------------------------------------------
def age_bands(lowers: Sequence[int], stop: int) -> list[range]:
    """Consecutive age ranges from their lower ends, the last one ending at ``stop``."""
    ends = [*lowers[1:], stop]
    return [range(lo, hi) for lo, hi in zip(lowers, ends, strict=True)]


class _Codes:
    """Value groups of the Census attributes, built once per age size."""

    def __init__(self, n_age: int):
        k = census.n_races()
        self.n_age = n_age
        self.singles = [[int(c)] for c in np.flatnonzero(k == 1)]
        self.one_race = list(np.flatnonzero(k == 1))
        self.multi = list(np.flatnonzero(k >= 2))
        self.by_count = {j: [int(c) for c in np.flatnonzero(k == j)] for j in range(2, 7)}
        rel = census.relation_index
        self.household = list(range(rel("group quarters")))
        self.gq = [rel("group quarters")]
        self.nonrelatives = [
            rel(x)
            for x in (
                "roomer or boarder",
                "housemate or roommate",
                "unmarried partner",
                "foster child",
                "other nonrelative",
            )
        ]
        self.own_child = [rel(x) for x in ("biological child", "adopted child", "stepchild")]
        # relatives of the householder other than spouse and own children
        self.other_relatives_u18 = [
            rel(x)
            for x in (
                "sibling",
                "parent",
                "grandchild",
                "parent-in-law",
                "child-in-law",
                "other relative",
            )
        ]
        self.other_relatives_65 = [
            rel(x)
            for x in (
                "biological child",
                "adopted child",
                "stepchild",
                "sibling",
                "grandchild",
                "child-in-law",
                "other relative",
            )
        ]

    # race factors ------------------------------------------------------------
    def race_p3(self) -> LinearQuery:
        return indicator(_N_RACE, [range(_N_RACE), *self.singles, self.multi])

    def race_p8(self) -> LinearQuery:
        groups: list[ValueGroup] = [range(_N_RACE), self.one_race, *self.singles, self.multi]
        for j in range(2, 7):
            groups.append(self.by_count[j])
            groups.extend([c] for c in self.by_count[j])
        return indicator(_N_RACE, groups)

    def race_p6(self) -> LinearQuery:
        # total races tallied: a person of k races counts k times; then alone-or-in-combination
        return Dense(np.vstack([census.n_races(), census.race_membership().T]))

    # age factors -------------------------------------------------------------
    def age(self, groups: Sequence[ValueGroup]) -> LinearQuery:
        return indicator(self.n_age, list(groups))

    def ages_from(self, lo: int) -> range:
        return range(lo, self.n_age)

    def p12_age(self) -> LinearQuery:
        return self.age([range(self.n_age), *age_bands(P12_AGE_BANDS, self.n_age)])

    def pct12_age(self) -> LinearQuery:
        return self.age([range(self.n_age), *age_bands(PCT12_AGE_BANDS, self.n_age)])


# -- tables -------------------------------------------------------------------
Products = list[dict[str, LinearQuery]]


def _sex_by_age(
    age_lines: LinearQuery,
    universe: Mapping[str, LinearQuery],
    total_age: LinearQuery | None = None,
) -> Products:
    """A sex-by-age table within a universe: its total line, then sex x ``age_lines``.

    ``age_lines`` starts with the sex subtotal's age predicate (all ages, or the
    universe's ages); ``total_age`` restricts the total line to the universe's ages.
    """
    total = dict(universe)
    if total_age is not None:
        total["age"] = total_age
    return [total, {**universe, "sex": Identity(2), "age": age_lines}]


def _by_iteration(
    age_lines: Callable[[], LinearQuery], universe: Mapping[str, LinearQuery]
) -> Callable[[], Products]:
    """The sex-by-age table of one race / ethnicity iteration, built when called."""
    return lambda: _sex_by_age(age_lines(), universe)


def _iterations(c: _Codes) -> dict[str, dict[str, LinearQuery]]:
    """Race / ethnicity iterations A-O: the filter each applies (hisp and/or race)."""
    nh = indicator(2, [[0]])
    hisp = indicator(2, [[1]])
    groups: list[ValueGroup] = [*c.singles, c.multi]  # A-F: each race alone, G: two or more races
    out: dict[str, dict[str, LinearQuery]] = {}
    for letter, g in zip("ABCDEFG", groups, strict=True):
        out[letter] = {"race": indicator(_N_RACE, [g])}
    out["H"] = {"hisp": hisp}
    for letter, g in zip("IJKLMNO", groups, strict=True):
        out[letter] = {"hisp": nh, "race": indicator(_N_RACE, [g])}
    return out


def _tables(c: _Codes) -> dict[str, Callable[[], Products]]:
    n_age = c.n_age
    adult = {"age": c.age([c.ages_from(18)])}
    hh = {"relation": indicator(_N_REL, [c.household])}
    all_rel = range(_N_REL)
    householder = [census.relation_index("householder")]
    spouse = [census.relation_index("spouse")]
    rel = census.relation_index
    iters = _iterations(c)

    def p5(extra: dict[str, LinearQuery]) -> Products:
        return [{**extra}, {**extra, "hisp": Identity(2), "race": c.race_p3()}]

    def p9(extra: dict[str, LinearQuery]) -> Products:
        return [
            {**extra, "hisp": indicator(2, [range(2), [1]])},
            {**extra, "hisp": indicator(2, [[0]]), "race": c.race_p8()},
        ]

    def p7() -> Products:
        tally = Dense(census.n_races()[None, :])
        return [{"race": tally}, {"hisp": Identity(2), "race": c.race_p6()}]

    def p29() -> Products:
        rows = [
            all_rel,
            c.household,
            householder,
            spouse,
            *([rel(x)] for x in ("biological child", "adopted child", "stepchild")),
            *([rel(x)] for x in ("grandchild", "sibling", "parent", "parent-in-law")),
            *([rel(x)] for x in ("child-in-law", "other relative")),
            c.nonrelatives,
            c.gq,
        ]
        return [
            {"relation": indicator(_N_REL, rows)},
            {"sex": Identity(2), "relation": indicator(_N_REL, [householder])},
        ]

    def p32() -> Products:
        under18 = c.age([range(0, 18)])
        related = c.own_child + c.other_relatives_u18
        rows = [
            all_rel,
            c.household,
            householder + spouse,
            sorted(related),
            c.own_child,
            c.other_relatives_u18,
            c.nonrelatives,
            c.gq,
        ]
        banded = [c.own_child, c.other_relatives_u18, c.nonrelatives]
        return [
            {"relation": indicator(_N_REL, rows), "age": under18},
            {"relation": indicator(_N_REL, banded), "age": c.age(age_bands(P32_AGE_BANDS, 18))},
        ]

    def p34() -> Products:
        over65 = c.age([c.ages_from(65)])
        rows = [
            all_rel,
            c.household,
            householder,
            spouse,
            [rel("parent")],
            [rel("parent-in-law")],
            c.other_relatives_65,
            c.nonrelatives,
            c.gq,
        ]
        return [
            {"relation": indicator(_N_REL, rows), "age": over65},
            {"sex": Identity(2), "relation": indicator(_N_REL, [householder]), "age": over65},
        ]

    tables: dict[str, Callable[[], Products]] = {
        "P1": lambda: [{}],
        "P3": lambda: [{"race": c.race_p3()}],
        "P4": lambda: [{"hisp": indicator(2, [range(2), [0], [1]])}],
        "P5": lambda: p5({}),
        "P6": lambda: [{"race": c.race_p6()}],
        "P7": p7,
        "P8": lambda: [{"race": c.race_p8()}],
        "P9": lambda: p9({}),
        "P10": lambda: [{**adult, "race": c.race_p8()}],
        "P11": lambda: p9(adult),
        "P12": lambda: _sex_by_age(c.p12_age(), {}),
    }
    for letter in "ABCDEFGHI":
        tables[f"P12{letter}"] = _by_iteration(c.p12_age, iters[letter])
    tables["P14"] = lambda: _sex_by_age(
        c.age([range(0, 20), *([a] for a in range(20))]), {}, total_age=c.age([range(0, 20)])
    )
    tables["P16"] = lambda: [{**hh, "age": c.age([range(n_age), range(0, 18), c.ages_from(18)])}]
    tables["P29"] = p29
    tables["P32"] = p32
    tables["P34"] = p34
    tables["PCT12"] = lambda: _sex_by_age(c.pct12_age(), {})
    for letter in "ABCDEFGHIJKLMNO":
        tables[f"PCT12{letter}"] = _by_iteration(c.pct12_age, iters[letter])
    tables["PCT13"] = lambda: _sex_by_age(c.p12_age(), hh)
    tables["votingage"] = lambda: [{"age": c.age([range(0, 18), c.ages_from(18)])}]
    return tables


TABLES: tuple[str, ...] = tuple(_tables(_Codes(115)))
"""Names of the encoded tables, in the order of :func:`sf1_persons`."""


def check_person_domain(
    domain: Domain, what: str, sizes: dict[str, int], min_age: int, *, missing: str | None = None
) -> None:
    """Refuse a domain without the attribute ``sizes`` and ``age`` of ``min_age`` single years.

    The messages start with ``what`` (the workload's name). A missing attribute is
    reported as having the size ``missing``, or, when ``missing`` is None, by the
    domain's own unknown-attribute error.

    Raises
    ------
    DomainError
        Naming the first attribute that is missing or has the wrong size.
    """

    def size(attr: str) -> int | str:
        return domain[attr] if missing is None or attr in domain else missing

    for attr, n in sizes.items():
        if (got := size(attr)) != n:
            raise DomainError(f"{what} needs attribute {attr!r} with {n} values, not {got}")
    got = size("age")
    if isinstance(got, str) or got < min_age:
        raise DomainError(
            f"{what} needs single years of age up to at least {min_age - 1} (attribute 'age' "
            f"with >= {min_age} values), not {got}"
        )


def _select(tables: Sequence[str] | None) -> list[str]:
    if tables is None:
        return list(TABLES)
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        raise ArgumentError(f"unknown SF1 tables {unknown}; encoded tables are {list(TABLES)}")
    return list(tables)


def sf1_tables(
    domain: Domain | None = None, tables: Sequence[str] | None = None
) -> dict[str, list[Kron]]:
    """The encoded SF1 person tables, each as its list of product workloads.

    Parameters
    ----------
    domain : Domain, optional
        Default :func:`dpdask.census.cph_domain`. It needs ``sex`` (2),
        ``hisp`` (2), ``race`` (63), ``relation`` (17) and ``age`` (at least 111
        single years) in any order; other attributes are summed over.
    tables : sequence of str, optional
        A subset of :data:`TABLES` (default all).

    Returns
    -------
    dict of str to list of Kron
        Table name to its products, in :data:`TABLES` order.

    Raises
    ------
    ArgumentError
        If a table is unknown; ``DomainError`` if the domain lacks an attribute or
        has a wrong size.
    """
    domain = census.cph_domain() if domain is None else domain
    check_person_domain(
        domain, "SF1", {"sex": 2, "hisp": 2, "race": _N_RACE, "relation": _N_REL}, _MIN_AGE
    )
    builders = _tables(_Codes(domain["age"]))
    return {t: [product(domain, f) for f in builders[t]()] for t in _select(tables)}


def sf1_persons(domain: Domain | None = None, tables: Sequence[str] | None = None) -> VStack:
    """The SF1 person workload: a union of Kronecker products, one part per product.

    Parameters
    ----------
    domain, tables
        As in :func:`sf1_tables`.

    Returns
    -------
    VStack
        Parts named by their table (the products of one table share its name,
        so ``[s for s, n in zip(W.part_slices(), W.names) if n == "P12"]`` are the
        rows of P12). 4,327 rows and 78 parts with all tables (module docstring).
        On the CPH attribute order (sex, hisp, race, relation, age) the rows of
        each table are in its published line order; on another order each
        product's rows follow that domain's C order.

    Examples
    --------
    >>> W = sf1_persons()
    >>> W.shape
    (4327, 492660)
    >>> W.names[:4]
    ('P1', 'P3', 'P4', 'P5')
    """
    parts, names = [], []
    for name, products in sf1_tables(domain, tables).items():
        parts.extend(products)
        names.extend([name] * len(products))
    return VStack(parts, names=names)
