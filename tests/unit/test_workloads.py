"""Workload builders against oracles built independently here.

Small workloads are compared with dense matrices written out cell by cell. The SF1
workload is too large for that: its answers are compared with a record-level
oracle that lists, for one person, the value of every published line of every
table, written from the table shells (not from the Kronecker factors).
"""

from __future__ import annotations

import itertools
import json
import math
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask import Domain, census
from dpdask.linalg import Identity, Kron, Prefix
from dpdask.testing.strategies import domains
from dpdask.workloads import (
    age_pyramid,
    all_range,
    identity,
    indicator,
    marginal,
    marginals,
    pl94,
    prefix,
    product,
    random_ranges,
    sf1_persons,
    sf1_tables,
    sum_query,
)
from tests.helpers import P12_BANDS, PCT12_BANDS

# -- the codings, restated here as the contract other modules rely on ------------
COMBOS = [c for k in range(1, 7) for c in itertools.combinations(range(6), k)]
RELATIONSHIPS = (
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
REL = {name: i for i, name in enumerate(RELATIONSHIPS)}


def test_race_combinations_in_census_order():
    assert census.race_combinations() == tuple(COMBOS)
    assert [sum(len(c) == k for c in COMBOS) for k in range(1, 7)] == [6, 15, 20, 15, 6, 1]
    # Census P8 / PL94 P1 order: singles, then White;Black, White;AIAN, ...
    assert census.race_label(6) == "White; Black or African American"
    assert census.race_label(20) == "Native Hawaiian and Other Pacific Islander; Some Other Race"
    assert census.race_label(21) == (
        "White; Black or African American; American Indian and Alaska Native"
    )


def test_race_index_inverts_the_combinations():
    for i, combo in enumerate(COMBOS):
        assert census.race_index(combo) == i
        assert census.race_index([census.RACES[r] for r in reversed(combo)]) == i
    M = census.race_membership()
    assert M.shape == (63, 6)
    np.testing.assert_array_equal(M.sum(1), census.n_races())
    np.testing.assert_array_equal(census.n_races(), [len(c) for c in COMBOS])


@pytest.mark.parametrize("bad", [[], ["purple"], [6], [-1]])
def test_race_index_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        census.race_index(bad)


def test_relationship_coding_and_domains():
    assert census.RELATIONSHIPS == RELATIONSHIPS
    assert census.relation_index("group quarters") == 16
    with pytest.raises(ValueError, match="unknown relationship"):
        census.relation_index("cousin")
    assert census.cph_domain().size == 2 * 2 * 63 * 17 * 115 == 492_660
    assert census.pl94_domain().shape == (2, 2, 63)


# -- generic builders ----------------------------------------------------------
def test_product_is_the_kronecker_product_in_domain_order(rng):
    d = Domain(a=2, b=3, c=4)
    B = rng.normal(size=(2, 3))
    W = product(d, {"c": Prefix(4), "b": B})
    expected = np.kron(np.kron(np.ones((1, 2)), B), np.tril(np.ones((4, 4))))
    np.testing.assert_allclose(W.dense(), expected)


def test_product_rejects_unknown_attributes_and_sizes():
    d = Domain(a=2, b=3)
    with pytest.raises(ValueError, match="unknown attribute 'z'"):
        product(d, {"z": Identity(2)})
    with pytest.raises(ValueError, match="attribute 'b' has 2 columns"):
        product(d, {"b": Identity(2)})


def test_indicator():
    M = indicator(5, [range(1, 3), [4, 0], slice(2, None)], weights=[1, 2, 3, 4, 5])
    np.testing.assert_array_equal(M.dense(), [[0, 2, 3, 0, 0], [1, 0, 0, 0, 5], [0, 0, 3, 4, 5]])
    with pytest.raises(ValueError, match="outside"):
        indicator(3, [[3]])
    with pytest.raises(ValueError, match="twice"):
        indicator(3, [[1, 1]])


@pytest.mark.parametrize("n", [1, 2, 7])
def test_prefix_and_all_range(n):
    np.testing.assert_array_equal(prefix(n).dense(), np.tril(np.ones((n, n))))
    rows = [[1.0 if i <= c <= j else 0.0 for c in range(n)] for i in range(n) for j in range(i, n)]
    A = all_range(n)
    assert A.shape[0] == n * (n + 1) // 2
    np.testing.assert_array_equal(A.dense(), np.array(rows))


def test_random_ranges(rng):
    n, k = 10, 20_000
    R = random_ranges(n, k, rng)
    assert R.shape == (k, n)
    assert (R.lo <= R.hi).all() and R.lo.min() >= 0 and R.hi.max() < n
    # two independent uniform end-points: E|U - V| = (n^2 - 1) / (3 n)
    assert abs((R.hi - R.lo).mean() - (n * n - 1) / (3 * n)) < 0.1
    again = random_ranges(n, 50, np.random.default_rng(7))
    np.testing.assert_array_equal(again.lo, random_ranges(n, 50, np.random.default_rng(7)).lo)
    x = rng.integers(0, 5, n).astype(float)
    sums = [x[a : b + 1].sum() for a, b in zip(again.lo, again.hi, strict=True)]
    np.testing.assert_array_equal(again @ x, sums)


@pytest.mark.parametrize("bad", [None, 3, np.random.RandomState(0)])
def test_random_ranges_needs_a_generator(bad):
    with pytest.raises(TypeError, match="Generator"):
        random_ranges(5, 3, bad)


def test_random_ranges_needs_queries(rng):
    with pytest.raises(ValueError):
        random_ranges(5, 0, rng)


def test_identity(small_domain, rng):
    x = rng.normal(size=small_domain.size)
    np.testing.assert_array_equal(identity(small_domain) @ x, x)


@settings(max_examples=40, deadline=None)
@given(domains(max_attrs=4, max_size=4), st.data())
def test_marginal_matches_numpy_sum(domain, data):
    keep = data.draw(st.lists(st.sampled_from(domain.attrs), unique=True, max_size=len(domain)))
    x = np.arange(domain.size, dtype=float) ** 1.5
    drop = tuple(i for i, a in enumerate(domain.attrs) if a not in keep)
    expected = x.reshape(domain.shape).sum(axis=drop).ravel()
    np.testing.assert_allclose(marginal(domain, keep) @ x, expected)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_marginals_counts_names_and_sensitivity(k):
    d = Domain(a=2, b=3, c=4)
    W = marginals(d, k)
    combos = list(itertools.combinations("abc", k))
    assert W.names == tuple("*".join(c) if c else "total" for c in combos)
    assert W.shape == (sum(math.prod(d[a] for a in c) for c in combos), d.size)
    # every cell is counted exactly once by each marginal
    assert W.sensitivity(1) == pytest.approx(len(combos))
    assert W.sensitivity(2) == pytest.approx(math.sqrt(len(combos)))
    x = np.arange(d.size, dtype=float)
    for part, c in zip(W.parts, combos, strict=True):
        np.testing.assert_array_equal(part @ x, marginal(d, c) @ x)


def test_marginals_rejects_bad_k():
    with pytest.raises(ValueError):
        marginals(Domain(a=2), 2)


# -- PL94 ---------------------------------------------------------------------
def _pl94_oracle() -> np.ndarray:
    cells = list(itertools.product(range(2), range(2), range(63)))
    rows = []
    rows += [[float(va == v) for va, _, _ in cells] for v in range(2)]
    rows += [[float(h == v) for _, h, _ in cells] for v in range(2)]
    for size_ok in (lambda k: k == 1, lambda k: k >= 2):
        for i, combo in enumerate(COMBOS):
            if size_ok(len(combo)):
                rows.append([float(r == i) for _, _, r in cells])
    rows += np.eye(len(cells)).tolist()
    return np.array(rows)


def test_pl94_equals_the_hand_built_matrix():
    W = pl94()
    assert W.shape == (2 + 2 + 6 + 57 + 252, 252) == (319, 252)
    np.testing.assert_array_equal(W.dense(), _pl94_oracle())


def test_pl94_on_a_domain_with_single_years_of_age(rng):
    d = Domain(age=25, sex=2, hisp=2, race=63)  # age first: identity rows in PL94 order
    x = rng.poisson(0.5, d.shape).astype(float)
    cells = x.sum(axis=1)  # (age, hisp, race)
    va = np.stack([cells[:18].sum(0), cells[18:].sum(0)])  # (va, hisp, race)
    np.testing.assert_array_equal(pl94(d) @ x.ravel(), _pl94_oracle() @ va.ravel())


def test_ri2010_equals_the_hand_built_matrix():
    from dpdask.workloads import ri2010, ri2010_domain
    from dpdask.workloads.ri2010 import RACEETH, RACEETH_LABELS

    domain = ri2010_domain()
    assert domain == Domain(votingage=2, raceeth=8) and len(RACEETH_LABELS) == 8
    assert RACEETH == ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")
    cells = list(itertools.product(range(2), range(8)))  # C order: votingage, raceeth
    rows = [[1] * 16]
    rows += [[int(v == a) for v, _ in cells] for a in range(2)]
    rows += [[int(r == g) for _, r in cells] for g in range(8)]
    rows += [[int(c == cell) for c in cells] for cell in cells]
    W = ri2010()
    assert W.names == ("total", "votingage", "raceeth", "identity")
    np.testing.assert_array_equal(W.dense(), np.array(rows))
    np.testing.assert_array_equal(ri2010(Domain(raceeth=8, sex=2, votingage=2)).shape, (27, 32))
    for bad in (
        Domain(votingage=2),
        Domain(votingage=2, raceeth=7),
        Domain(votingage=3, raceeth=8),
    ):
        with pytest.raises(ValueError, match=r"votingage|raceeth"):
            ri2010(bad)


def test_pl94_rejects_wrong_domains():
    with pytest.raises(ValueError, match="'race' must have 63"):
        pl94(Domain(votingage=2, hisp=2, race=62))
    with pytest.raises(ValueError, match="neither"):
        pl94(Domain(hisp=2, race=63))


# -- age pyramid --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["suffix", "prefix"])
def test_age_pyramid_equals_the_hand_built_matrix(kind):
    ages = range(116)
    cond = (lambda age, a: age >= a) if kind == "suffix" else (lambda age, a: age <= a)
    preds = [lambda age, a=a: cond(age, a) for a in ages] + [lambda age: age >= 18]
    cells = list(itertools.product(range(2), ages))
    rows = [[float(s == sex and p(age)) for s, age in cells] for sex in range(2) for p in preds]
    rows += [[float(p(age)) for _, age in cells] for p in preds]
    W = age_pyramid(kind=kind)
    assert W.shape == (3 * 117, 232)
    np.testing.assert_array_equal(W.dense(), np.array(rows))


def test_age_pyramid_options():
    assert age_pyramid(voting_age=False).shape == (3 * 116, 232)
    with pytest.raises(ValueError, match="kind"):
        age_pyramid(kind="middle")


# -- sum queries --------------------------------------------------------------
def test_sum_query_total_and_by(rng):
    d = Domain(sex=2, income=4)
    v = np.array([5.0, 15.0, 25.0, 40.0])
    x = rng.integers(0, 9, d.shape).astype(float)
    np.testing.assert_allclose(sum_query(d, "income", v) @ x.ravel(), [(x * v).sum()])
    np.testing.assert_allclose(sum_query(d, "income", v, by=["sex"]) @ x.ravel(), x @ v)
    assert sum_query(d, "income", v).sensitivity(1) == pytest.approx(40.0)


def test_sum_query_prefix_sums(rng):
    d = Domain(income=6, sex=2)
    v = np.linspace(1.0, 6.0, 6)
    x = rng.integers(0, 9, d.shape).astype(float)
    W = sum_query(d, "income", v, workload=prefix(6))
    np.testing.assert_allclose(W @ x.ravel(), np.cumsum(x.sum(1) * v))
    # value i enters the prefix sums i..n-1: column norm |v_i| (n - i)
    assert W.sensitivity(1) == pytest.approx(max(v[i] * (6 - i) for i in range(6)))
    assert W.sensitivity(2) == pytest.approx(max(v[i] * math.sqrt(6 - i) for i in range(6)))


def test_sum_query_rejects_bad_input():
    d = Domain(sex=2, income=3)
    with pytest.raises(ValueError, match="3 values"):
        sum_query(d, "income", [1.0, 2.0])
    with pytest.raises(ValueError, match="itself"):
        sum_query(d, "income", [1.0, 2.0, 3.0], by=["income"])
    with pytest.raises(ValueError, match="columns"):
        sum_query(d, "income", [1.0, 2.0, 3.0], workload=prefix(4))


# -- SF1: a record-level oracle written from the table shells ---------------------
P32_BANDS = [(0, 2), (3, 4), (5, 5), (6, 11), (12, 13), (14, 14), (15, 17)]
PUBLISHED_SIZES = {  # the [n] of each table in the SF1 technical documentation
    "P1": 1, "P3": 8, "P4": 3, "P5": 17, "P6": 7, "P7": 15, "P8": 71, "P9": 73, "P10": 71,
    "P11": 73, "P12": 49, "P14": 43, "P16": 3, "PCT12": 209, "PCT13": 49,
    **{f"P12{x}": 49 for x in "ABCDEFGHI"}, **{f"PCT12{x}": 209 for x in "ABCDEFGHIJKLMNO"},
}  # fmt: skip


def _sf1_lines(s: int, h: int, r: int, rel: int, a: int) -> dict[str, list[float]]:
    """Every line of every encoded table for one person, in table line order."""
    races = COMBOS[r]
    k = len(races)
    alone = [k == 1 and races[0] == j for j in range(6)]
    in_hh = rel != REL["group quarters"]
    own = rel in (REL["biological child"], REL["adopted child"], REL["stepchild"])
    nonrel = rel in [REL[x] for x in RELATIONSHIPS[11:16]]
    other_u18 = rel in [
        REL[x]
        for x in (
            "sibling",
            "parent",
            "grandchild",
            "parent-in-law",
            "child-in-law",
            "other relative",
        )
    ]
    hhldr = rel == REL["householder"]

    p3 = [1, *alone, k >= 2]
    p8 = [1, k == 1, *alone, k >= 2]
    for m in range(2, 7):
        p8 += [k == m] + [races == c for c in COMBOS if len(c) == m]
    p9 = [1, h == 1] + [h == 0 and v for v in p8]
    p6 = [k] + [j in races for j in range(6)]

    def sex_by_age(bands, universe=True, total=True):
        out = [universe and total]
        for sx in range(2):
            out.append(universe and s == sx)
            out += [universe and s == sx and lo <= a <= hi for lo, hi in bands]
        return out

    groups = [*alone, k >= 2]  # the 7 race iterations A-G
    iters = dict(zip("ABCDEFG", groups, strict=True))
    iters["H"] = h == 1
    iters.update(zip("IJKLMNO", [h == 0 and g for g in groups], strict=True))
    u18, o65 = a < 18, a >= 65
    lines: dict[str, list] = {
        "P1": [1],
        "P3": p3,
        "P4": [1, h == 0, h == 1],
        "P5": [1] + [x for hh in range(2) for x in [h == hh] + [h == hh and v for v in p3[1:]]],
        "P6": p6,
        "P7": [k] + [x for hh in range(2) for x in [(h == hh) * v for v in p6]],
        "P8": p8,
        "P9": p9,
        "P10": [a >= 18 and v for v in p8],
        "P11": [a >= 18 and v for v in p9],
        "P12": sex_by_age(P12_BANDS),
        **{f"P12{x}": sex_by_age(P12_BANDS, iters[x]) for x in "ABCDEFGHI"},
        "P14": [a < 20]
        + [
            x
            for sx in range(2)
            for x in [s == sx and a < 20] + [s == sx and a == y for y in range(20)]
        ],
        "P16": [in_hh, in_hh and a < 18, in_hh and a >= 18],
        "P29": [1, in_hh, hhldr, rel == REL["spouse"]]
        + [rel == REL[x] for x in RELATIONSHIPS[2:5]]
        + [rel == REL[x] for x in ("grandchild", "sibling", "parent", "parent-in-law")]
        + [rel == REL["child-in-law"], rel == REL["other relative"], nonrel, not in_hh]
        + [hhldr and s == 0, hhldr and s == 1],
        "P32": [u18 and v for v in (1, in_hh, rel <= 1, own or other_u18, own, other_u18)]
        + [u18 and nonrel, u18 and not in_hh]
        + [g and lo <= a <= hi for g in (own, other_u18, nonrel) for lo, hi in P32_BANDS],
        "P34": [o65 and v for v in (1, in_hh, hhldr, rel == REL["spouse"])]
        + [o65 and rel == REL["parent"], o65 and rel == REL["parent-in-law"]]
        + [o65 and rel in (2, 3, 4, 5, 7, 9, 10), o65 and nonrel, o65 and not in_hh]
        + [o65 and hhldr and s == 0, o65 and hhldr and s == 1],
        "PCT12": sex_by_age(PCT12_BANDS),
        **{f"PCT12{x}": sex_by_age(PCT12_BANDS, iters[x]) for x in "ABCDEFGHIJKLMNO"},
        "PCT13": sex_by_age(P12_BANDS, in_hh),
        "votingage": [a < 18, a >= 18],
    }
    return {t: [float(v) for v in vs] for t, vs in lines.items()}


@pytest.fixture(scope="module")
def sf1():
    return sf1_persons()


@pytest.fixture(scope="module")
def sf1_parts():
    return sf1_tables()


def test_sf1_table_sizes_are_the_published_ones(sf1, sf1_parts):
    sizes = {t: sum(p.shape[0] for p in ps) for t, ps in sf1_parts.items()}
    oracle = _sf1_lines(0, 0, 0, 0, 30)
    assert sizes == {t: len(v) for t, v in oracle.items()}
    for t, n in PUBLISHED_SIZES.items():
        assert sizes[t] == n, t
    assert sizes["P29"] == 17 and sizes["P32"] == 29 and sizes["P34"] == 11
    assert sf1.shape == (sum(sizes.values()), 492_660) == (4327, 492_660)
    spans = list(zip(sf1.part_slices(), sf1.names, strict=True))
    rows = {t: sum(s.stop - s.start for s, n in spans if n == t) for t in sizes}
    assert rows == sizes


def _records(rng: np.random.Generator, n: int) -> np.ndarray:
    shape = census.cph_domain().shape
    recs = np.stack([rng.integers(0, m, n) for m in shape], axis=1)
    # people on every age boundary the tables use, in every relationship
    edges = [0, 2, 3, 4, 5, 14, 15, 17, 18, 19, 20, 21, 61, 62, 64, 65, 84, 85, 99, 100, 104]
    edges += [105, 109, 110, 114]
    for i, a in enumerate(edges):
        recs = np.vstack([recs, [[i % 2, (i // 2) % 2, (7 * i) % 63, i % 17, a]]])
    return recs


def test_sf1_answers_match_the_record_oracle(sf1, sf1_parts, rng):
    domain = census.cph_domain()
    X, expected = [], {t: 0.0 for t in sf1_parts}
    for j in range(3):
        recs = _records(rng, 120)
        flat = np.ravel_multi_index(recs.T, domain.shape)
        X.append(np.bincount(flat, minlength=domain.size).astype(float))
        per = [_sf1_lines(*map(int, rec)) for rec in recs]
        for t in sf1_parts:
            col = np.sum([p[t] for p in per], axis=0)
            expected[t] = col[:, None] if j == 0 else np.hstack([expected[t], col[:, None]])
    X = np.stack(X, axis=1)
    Y = sf1 @ X
    got = {t: [] for t in sf1_parts}
    for t, s in zip(sf1.names, sf1.part_slices(), strict=True):
        got[t].append(Y[s])
    for t in sf1_parts:
        np.testing.assert_array_equal(np.vstack(got[t]), expected[t], err_msg=t)


def test_sf1_sensitivity(sf1):
    # all entries are >= 0, so the L1 column norms are W^T 1 (the transpose path)
    l1 = sf1.T @ np.ones(sf1.shape[0])
    np.testing.assert_allclose(sf1.column_norms(1), l1)
    assert sf1.sensitivity(1) == pytest.approx(l1.max())
    # the worst person, worked out from the table shells: a non-Hispanic male
    # householder of six races aged 65+ enters 85 lines (counting races tallied)
    worst = _sf1_lines(0, 0, 62, REL["householder"], 70)
    assert sum(sum(v) for v in worst.values()) == 85 == sf1.sensitivity(1)
    # entries are 0/1 except the three races-tallied lines a person enters (value k)
    k = np.broadcast_to(census.n_races()[None, None, :, None, None], census.cph_domain().shape)
    l2_sq = l1 + 3 * (k.ravel() ** 2 - k.ravel())
    np.testing.assert_allclose(sf1.column_norms(2) ** 2, l2_sq)
    assert sf1.sensitivity(2) == pytest.approx(math.sqrt(l2_sq.max())) == pytest.approx(175**0.5)


def test_sf1_dense_columns(sf1, rng):
    domain = census.cph_domain()
    cells = [np.ravel_multi_index((0, 0, 62, 0, 70), domain.shape)]
    cells += list(rng.integers(0, domain.size, 5))
    E = np.zeros((domain.size, len(cells)))
    E[cells, np.arange(len(cells))] = 1.0
    cols = sf1 @ E  # the dense columns of W at these cells
    np.testing.assert_allclose(np.abs(cols).sum(0), sf1.column_norms(1)[cells])
    np.testing.assert_allclose(np.linalg.norm(cols, axis=0), sf1.column_norms(2)[cells])
    for c, col in zip(cells, cols.T, strict=True):
        lines = _sf1_lines(*map(int, np.unravel_index(c, domain.shape)))
        assert col.sum() == sum(sum(v) for v in lines.values())


def test_sf1_other_attribute_order(rng):
    """On another attribute order each product asks the same queries (rows in that C order)."""
    tables = ["P5", "P12H", "P29", "votingage"]
    W = sf1_persons(Domain(age=115, race=63, sex=2, relation=17, hisp=2), tables=tables)
    W0 = sf1_persons(tables=tables)
    X = rng.poisson(0.05, (*census.cph_domain().shape, 2)).astype(float)
    Y = W @ X.transpose(4, 2, 0, 3, 1, 5).reshape(-1, 2)
    Y0 = W0 @ X.reshape(-1, 2)
    for s, s0 in zip(W.part_slices(), W0.part_slices(), strict=True):
        a, b = Y[s], Y0[s0]
        np.testing.assert_array_equal(a[np.lexsort(a.T)], b[np.lexsort(b.T)])


def test_sf1_build_is_small_and_fast(rng):
    tracemalloc.start()
    sf1_persons()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50e6
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        W = sf1_persons()
        times.append(time.perf_counter() - t0)
    assert min(times) < 1.0
    x = rng.poisson(1.0, W.shape[1]).astype(float)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        W @ x
        times.append(time.perf_counter() - t0)
    assert min(times) < 1.0


def test_sf1_rejects_bad_domains_and_tables():
    with pytest.raises(ValueError, match="'relation' with 17"):
        sf1_persons(Domain(sex=2, hisp=2, race=63, relation=16, age=115))
    with pytest.raises(ValueError, match="up to at least 110"):
        sf1_persons(Domain(sex=2, hisp=2, race=63, relation=17, age=100))
    with pytest.raises(ValueError, match="unknown attribute 'relation'"):
        sf1_persons(Domain(sex=2, hisp=2, race=63, age=115))
    with pytest.raises(ValueError, match="unknown SF1 tables"):
        sf1_persons(tables=["P99"])


def test_sf1_parts_are_kronecker_products(sf1):
    assert all(isinstance(p, Kron) for p in sf1.parts)
    assert set(sf1.names) == set(_sf1_lines(1, 1, 1, 1, 1))


def test_bench_linalg_runs(capsys):
    from dpdask.cli import main

    argv = ["bench", "linalg", "--json", "--repeats", "1", "--sizes", "3", "4", "5", "6"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sf1_queries"] == 4327 and out["sf1_sensitivity_l1"] == 85
    assert out["marginals_domain_cells"] == 360 and out["marginals_parts"] == 4
    assert out["marginals_sensitivity_l1"] == out["marginals_sensitivity_l1_expected"] == 4
    assert out["sf1_matvec_s"] > 0 and out["baseline_np_sum_s"] > 0


# -- workloads by name ------------------------------------------------------------------
def test_named_workloads_answer_like_numpy(rng):
    from dpdask.workloads.named import named

    domain = Domain({"a": 3, "b": 4})
    x = rng.integers(0, 5, domain.shape)
    # one-way marginals: the per-attribute sums, in part order
    got = named("marginals", domain, k=1) @ x.ravel()
    np.testing.assert_array_equal(got, np.concatenate([x.sum(1), x.sum(0)]))
    got = named("marginal", domain, attrs=["b"]) @ x.ravel()
    np.testing.assert_array_equal(got, x.sum(0))
    v = rng.integers(0, 5, 6)
    np.testing.assert_array_equal(named("prefix", n=6) @ v, np.cumsum(v))
    np.testing.assert_array_equal(named("identity", domain) @ x.ravel(), x.ravel())


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("nope", {}, "unknown workload"),
        ("pl94", {}, "needs a domain"),
        ("prefix", {}, "needs option n"),
        ("marginal", {"attrs": ["zz"]}, "zz"),
        ("marginals", {"kk": 2}, "bad options"),
    ],
)
def test_named_workloads_reject_bad_names_and_options(name, kwargs, match):
    from dpdask.workloads.named import named

    domain = Domain({"a": 3, "b": 4}) if name.startswith("marginal") else None
    with pytest.raises(ValueError, match=match):
        named(name, domain, **kwargs)


PLANNED = [
    ("pl94", [], "pl94", {}),
    ("pl94-full", [], "pl94-full", {}),
    ("tda-2020", [], "pl94-full", {}),
    ("ri2010", [], "ri2010", {}),
    ("sf1", [], "cph", {}),
    ("sf1-persons", [], "cph", {}),
    ("age-pyramid", ["--domain", "cph"], "cph", {}),
    ("identity", ["--domain", "a=3,b=2"], {"a": 3, "b": 2}, {}),
    ("marginals", ["--domain", "a=3,b=2,c=2", "--k", "2"], {"a": 3, "b": 2, "c": 2}, {"k": 2}),
    ("marginal", ["--domain", "a=3,b=2", "--attrs", "b"], {"a": 3, "b": 2}, {"attrs": ["b"]}),
    ("prefix", ["--n", "16"], None, {"n": 16}),
    ("allrange", ["--n", "16"], None, {"n": 16}),
    ("all-range", ["--n", "16"], None, {"n": 16}),
]


def test_every_workload_name_is_planned_below():
    """A name added to ``workloads/named.py`` gets a row in PLANNED (``sf1-hdmm``, the
    HDMM reference's encoding, is checked against its reference in test_sf1_reference)."""
    from dpdask.workloads.named import WORKLOAD_ALIASES, WORKLOAD_NAMES

    names = (set(WORKLOAD_NAMES) - {"sf1-hdmm"}) | set(WORKLOAD_ALIASES)
    assert names <= {row[0] for row in PLANNED}


@pytest.mark.parametrize(("name", "extra", "domain", "options"), PLANNED)
def test_plan_accepts_every_workload_name_the_spec_accepts(name, extra, domain, options, capsys):
    """``dpdask plan --workload NAME`` asks the queries of the spec's ``workload: NAME``."""
    import json

    from dpdask.cli import main
    from dpdask.pipeline.spec import parse_domain
    from dpdask.workloads.named import named

    args = ["plan", "--workload", name, "--rho", "1", "--strategy", "identity", "--json"]
    assert main(args + extra) == 0
    shown = json.loads(capsys.readouterr().out)
    W = named(name, None if domain is None else parse_domain(domain), **options)
    assert shown["queries"] == W.shape[0]
