"""The HDMM reference's SF1 person workload against a person-level oracle.

The oracle lists, for one person (sex, Hispanic origin, set of races, relationship,
age), the value of every query of every product, written here from the table
descriptions (each predicate a condition on the person), not from the module's
predicate matrices. Row order within a product is its attributes' order with the
last attribute varying fastest, as the reference's Kronecker products have it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpdask import Domain
from dpdask.linalg import Dense, Kron
from dpdask.privacy import PureDP
from dpdask.strategy import Plan
from dpdask.workloads.named import named
from dpdask.workloads.sf1_reference import (
    REFERENCE_TABLES,
    hdmm_reference_domain,
    race_code,
    sf1_hdmm_reference,
    sf1_hdmm_reference_tables,
)
from tests.helpers import P12_BANDS, PCT12_BANDS  # the SF1 age bands, as published

# -- the oracle ------------------------------------------------------------------
PUBLISHED_SIZES = {  # the [n] of each table in the SF1 technical documentation
    "P1": 1, "P3": 8, "P4": 3, "P5": 17, "P8": 71, "P9": 73, "P10": 71, "P11": 73, "P12": 49,
    "P12A_I": 9 * 49, "PCT12": 209, "PCT12A_O": 15 * 209,
}  # fmt: skip
WHITE = 0


def _code(races: frozenset[int]) -> int:
    """The reference's coding: bit i set when race i is checked."""
    return sum(2**i for i in races)


def _person_products(s: int, h: int, races: frozenset[int], a: int) -> dict[str, list[list]]:
    """Each table's products for one person: a list of 0/1 values per product."""
    k = len(races)
    sex = [s == 0, s == 1]
    sex_t = [*sex, True]
    hisp = [h == 0, h == 1]
    hisp_t = [*hisp, True]
    # race1: each race alone, then everything else (two or more, and no race)
    race1 = [races == {j} for j in range(6)] + [k != 1]
    # race2: each combination by its code, then exactly k races, then two or more
    race2 = [races == frozenset(j for j in range(6) if v >> j & 1) for v in range(1, 64)]
    race2 += [k == m for m in range(1, 7)] + [k >= 2]
    white = [races == {WHITE}]
    adult = [a >= 18]
    age1 = [lo <= a <= hi for lo, hi in P12_BANDS]
    age3 = [lo <= a <= hi for lo, hi in PCT12_BANDS]
    yes, no = [h == 1], [h == 0]

    def prod(*preds: list) -> list:
        return [all(c) for c in itertools.product(*preds)]

    def iterations(age: list, last_race: list) -> list[list]:
        return [
            prod(sex, race1, age),
            prod(sex_t, race1),
            prod(sex, yes, age),
            prod(sex_t, yes),
            prod(sex, no, last_race, age),
            prod(sex_t, no, last_race),
        ]

    total = [True]
    return {
        "P1": [total],
        "P3": [race1, total],
        "P4": [hisp, total],
        "P5": [prod(hisp, race1), hisp_t],
        "P8": [race2, total],
        "P9": [hisp, prod(no, race2), total],
        "P10": [prod(race2, adult), adult],
        "P11": [prod(hisp, adult), prod(no, race2, adult), adult],
        "P12": [prod(sex, age1), sex_t],
        "P12A_I": iterations(age1, white),
        "PCT12": [prod(sex, age3), sex_t],
        "PCT12A_O": iterations(age3, race1),
    }


def _person_total(person: tuple) -> int:
    s, h, races, _, a = person
    return sum(sum(p) for ps in _person_products(s, h, races, a).values() for p in ps)


# hand-built persons: (sex, hisp, races, relationship, age)
PERSONS = [
    (0, 0, frozenset({WHITE}), 0, 30),  # non-Hispanic White man, householder
    (1, 1, frozenset({1}), 1, 17),  # Hispanic Black girl
    (1, 0, frozenset({0, 3}), 2, 18),  # White and Asian woman, just adult
    (0, 1, frozenset(range(6)), 16, 110),  # Hispanic, six races, 110
    (0, 0, frozenset({5}), 5, 85),  # Some Other Race alone, 85
    (1, 0, frozenset({2, 4, 5}), 11, 104),  # three races, 104
    (0, 1, frozenset({3}), 7, 0),  # Asian baby
    (1, 1, frozenset(), 3, 62),  # no race checked (a cell no real person occupies)
]


def _cell(domain: Domain, person: tuple) -> int:
    s, h, races, rel, a = person
    values = {"sex": s, "hisp": h, "race": _code(races), "relation": rel, "age": a}
    return int(np.ravel_multi_index([values[n] for n in domain.attrs], domain.shape))


@pytest.fixture(scope="module")
def W():
    return sf1_hdmm_reference()


@pytest.fixture(scope="module")
def tables():
    return sf1_hdmm_reference_tables()


def test_race_code_is_the_binary_coding():
    for k in range(7):
        for races in itertools.combinations(range(6), k):
            assert race_code(races) == _code(frozenset(races))
    with pytest.raises(ValueError, match="outside"):
        race_code([6])


def test_size_and_products_are_the_references(W, tables):
    assert hdmm_reference_domain().shape == (2, 2, 64, 17, 115)
    assert W.shape == (4151, 2 * 2 * 64 * 17 * 115)
    assert len(W.parts) == 33  # the reference module's Kronecker products
    assert all(isinstance(p, Kron) for p in W.parts)
    assert tuple(tables) == REFERENCE_TABLES
    sizes = {t: sum(p.shape[0] for p in ps) for t, ps in tables.items()}
    assert sizes == PUBLISHED_SIZES
    oracle = _person_products(*PERSONS[0][:3], 30)
    assert {t: [len(p) for p in ps] for t, ps in oracle.items()} == {
        t: [p.shape[0] for p in ps] for t, ps in tables.items()
    }
    spans = list(zip(W.part_slices(), W.names, strict=True))
    assert {t: sum(s.stop - s.start for s, n in spans if n == t) for t in sizes} == sizes


def test_answers_match_the_person_oracle(tables, rng):
    """Each query's count on a few persons equals a direct count of those persons."""
    domain = hdmm_reference_domain()
    groups = [PERSONS[:3], PERSONS[3:], PERSONS]
    # plus random persons, each group a column of the data matrix
    for _ in range(2):
        groups.append(
            [
                (
                    int(rng.integers(2)),
                    int(rng.integers(2)),
                    frozenset(np.flatnonzero(rng.random(6) < 0.3).tolist()),
                    int(rng.integers(17)),
                    int(rng.integers(115)),
                )
                for _ in range(25)
            ]
        )
    X = np.zeros((domain.size, len(groups)))
    for j, group in enumerate(groups):
        for person in group:
            X[_cell(domain, person), j] += 1
    oracle = [[_person_products(s, h, r, a) for s, h, r, _, a in group] for group in groups]
    for t, products in tables.items():
        for i, part in enumerate(products):
            got = part @ X
            want = np.array([np.sum([o[t][i] for o in per], axis=0) for per in oracle]).T
            np.testing.assert_array_equal(got, want, err_msg=f"{t} product {i}")


def test_l1_sensitivity_against_a_brute_force_max(W):
    """The structural L1 sensitivity equals the most queries any sampled person enters."""
    domain = hdmm_reference_domain()
    ages = (0, 17, 18, 64, 85, 104, 110)  # one per age class the predicates tell apart
    persons = [
        (s, h, frozenset(j for j in range(6) if v >> j & 1), 0, a)
        for s, h, v, a in itertools.product(range(2), range(2), range(64), ages)
    ]
    counts = np.array([_person_total(p) for p in persons])
    cells = [_cell(domain, p) for p in persons]
    np.testing.assert_array_equal(W.column_norms(1)[cells], counts)
    assert W.sensitivity(1) == counts.max() == 41
    worst = persons[int(np.argmax(counts))]
    assert worst[1] == 0 and len(worst[2]) >= 2 and worst[4] >= 18  # non-Hispanic, 2+ races, adult
    # the relationship is summed everywhere: every relationship value gives the same column
    col = W.column_norms(1).reshape(domain.shape)
    np.testing.assert_array_equal(col, np.broadcast_to(col[:, :, :, :1, :], domain.shape))


def test_relationship_dropped_is_the_same_queries(W, rng):
    full = hdmm_reference_domain()
    small = full.project(["sex", "hisp", "race", "age"])
    W2 = sf1_hdmm_reference(small)
    assert W2.shape == (4151, small.size) and len(W2.parts) == 33
    x = rng.integers(0, 5, size=full.shape).astype(float)
    np.testing.assert_allclose(W2 @ x.sum(axis=3).ravel(), W @ x.ravel())


@pytest.mark.parametrize(
    ("domain", "match"),
    [
        (Domain(sex=2, hisp=2, race=63, relation=17, age=115), "'race' with 64"),
        (Domain(sex=2, hisp=2, race=64, relation=17, age=100), "age"),
        (Domain(sex=2, race=64, age=115), "'hisp'"),
    ],
)
def test_bad_domain_is_refused(domain, match):
    with pytest.raises(ValueError, match=match):
        sf1_hdmm_reference(domain)


def test_named():
    W = named("sf1-hdmm", hdmm_reference_domain())
    assert W.shape == (4151, 500_480)


# -- the error convention the reference's figures use ------------------------------
def test_expected_error_convention_by_monte_carlo(rng):
    """``Plan.expected_error()`` is ``2 / eps^2 ||A||_1^2 ||W A^+||_F^2``.

    That is the reference's ``expected_error(W, A, eps)``, whose default
    ``eps = sqrt(2)`` gives ``||A||_1^2 ||W A^+||_F^2`` (the optimisers' objective).
    Checked against least squares on Laplace-noised answers.
    """
    Wd = rng.integers(0, 2, size=(7, 6)).astype(float)
    Wd[0] = 1.0
    A = Dense(np.vstack([np.eye(6), rng.random((2, 6))]))
    eps = 0.8
    plan = Plan(Dense(Wd), A, PureDP(eps))
    Ad = A.dense()
    sens = np.abs(Ad).sum(axis=0).max()
    objective = sens**2 * np.linalg.norm(Wd @ np.linalg.pinv(Ad)) ** 2
    assert plan.expected_error() == pytest.approx(2 / eps**2 * objective, rel=1e-9)
    x = rng.integers(0, 30, size=6).astype(float)
    trials = 40_000
    noise = rng.laplace(0.0, sens / eps, size=(trials, Ad.shape[0]))
    est = (Ad @ x + noise) @ np.linalg.pinv(Ad).T @ Wd.T
    mc = ((est - Wd @ x) ** 2).sum(axis=1).mean()
    assert mc == pytest.approx(plan.expected_error(), rel=0.03)
    assert not math.isclose(mc, objective, rel_tol=0.1)
