"""Synthetic Census-like person histograms: layout, determinism, exact totals, shares, memory.

Oracles: populations are exact multinomial totals; marginal counts of a sample
pooled over geographies are Binomial(N, p) with p read from the constants (RI
2010 sums, the assumed relationship shares), checked by an exact two-sided
binomial test; with geography-level variation the pooled count has the closed-form
Dirichlet-multinomial variance; the constants themselves are recomputed from the
shared data files.
"""

from __future__ import annotations

import csv
import itertools
import tracemalloc

import numpy as np
import pytest
import zarr
from scipy import stats

from dpdask import Domain
from dpdask.census import RELATIONSHIPS, race_index
from dpdask.datasets import (
    GROUPS,
    PersonModel,
    draw_populations,
    synthetic_block,
    synthetic_persons,
)
from dpdask.datasets import _constants as C
from dpdask.datasets import _model as M
from tests import requires_shared_data, shared_data

CPH = Domain(sex=2, hisp=2, race=63, relation=17, age=115)
SMALL = Domain(sex=2, age=115)  # 230 cells: groups of 230+ persons use the multinomial
N_TESTS = 1000  # an upper bound on the binomial tests below, for a Bonferroni level
LEVEL = 1e-6 / N_TESTS
SINGLE_RACES = ("white", "black", "aian", "asian", "nhpi", "other")  # Census order


def _binomial_pvalue(x: int, n: int, p: float) -> float:
    """Exact two-sided p-value of ``x`` successes in ``Binomial(n, p)`` (doubled smaller tail)."""
    return float(min(1.0, 2 * min(stats.binom.cdf(x, n, p), stats.binom.sf(x - 1, n, p))))


def _check_binomial(x: int, n: int, p: float, what: str) -> None:
    pv = _binomial_pvalue(int(x), int(n), float(p))
    assert pv > LEVEL, f"{what}: {x} of {n}, expected share {p:.6g} (p-value {pv:.2g})"


def _all_race_combos() -> list[tuple[int, ...]]:
    return [c for k in range(1, 7) for c in itertools.combinations(range(6), k)]


# -- layout ------------------------------------------------------------------------------


def test_shape_dtype_chunks_and_metadata():
    out = synthetic_persons(CPH, 7, seed=3, chunk=3, population=1000)
    a = out.array
    assert a.shape == (7, *CPH.shape)
    assert a.dtype == np.int32
    assert a.chunks == (3, *CPH.shape)
    assert a.attrs["dpdask"]["domain"] == CPH.to_dict()
    assert a.attrs["dpdask"]["seed"] == 3
    assert out.domain == CPH
    assert out.geography.n_units() == 7 and out.geography.levels == ("county",)
    assert out.population.dtype == np.int64 and out.population.shape == (7,)


def test_default_chunk_is_about_64_mib():
    out = synthetic_persons(CPH, 40, population=10)
    assert out.array.chunks[0] == (64 * 2**20) // (CPH.size * 4) == 34


def test_store_on_disk_roundtrip_and_overwrite(tmp_path):
    path = tmp_path / "persons.zarr"
    out = synthetic_persons(SMALL, 5, str(path), seed=1, population=500)
    again = zarr.open_array(str(path), mode="r")
    np.testing.assert_array_equal(again[:], out.array[:])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        synthetic_persons(SMALL, 5, str(path), seed=1)
    other = synthetic_persons(SMALL, 5, str(path), seed=2, population=500, overwrite=True)
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[:], other.array[:])


# -- determinism ---------------------------------------------------------------------------


def test_same_seed_same_bytes_across_schedulers_and_chunkings():
    kw = dict(seed=11, population=[3, 0, 40, 2500, 90, 7, 31, 100, 28])
    ref = synthetic_persons(SMALL, 9, chunk=9, scheduler="sequential", **kw).array[:]
    for chunk, scheduler in [(1, "threads"), (2, "threads"), (4, "sync"), (5, "sequential")]:
        got = synthetic_persons(SMALL, 9, chunk=chunk, scheduler=scheduler, **kw).array[:]
        assert got.tobytes() == ref.tobytes(), (chunk, scheduler)


def test_different_seed_differs():
    a = synthetic_persons(CPH, 3, seed=0, population=5000).array[:]
    b = synthetic_persons(CPH, 3, seed=1, population=5000).array[:]
    assert not np.array_equal(a, b)


def test_chunks_in_any_order_and_prefix():
    full = synthetic_persons(CPH, 12, seed=5, chunk=4, population=2000).array[:]
    slabs = {lo: synthetic_block(CPH, lo, lo + 4, seed=5, population=2000) for lo in (8, 0, 4)}
    np.testing.assert_array_equal(np.concatenate([slabs[0], slabs[4], slabs[8]]), full)
    prefix = synthetic_persons(CPH, 5, seed=5, chunk=2, population=2000).array[:]
    np.testing.assert_array_equal(prefix, full[:5])


# -- totals and non-negativity -----------------------------------------------------------


@pytest.mark.parametrize(
    "domain, pops",
    [
        # CPH: 10**6 persons put the largest group (76 %) above K = 492,660, the multinomial
        (CPH, [0, 1, 17, 5000, 1_000_000]),
        (SMALL, [0, 1, 229, 230, 5000, 10**6]),
        (Domain(votingage=2, hisp=2, race=63), [3, 4000]),
    ],
)
def test_totals_are_exact_and_counts_non_negative(domain, pops):
    out = synthetic_persons(domain, len(pops), population=pops, seed=2)
    a = out.array[:]
    assert a.min() >= 0
    np.testing.assert_array_equal(a.reshape(len(pops), -1).sum(axis=1, dtype=np.int64), pops)
    np.testing.assert_array_equal(out.population, pops)


def test_drawn_populations_are_county_like():
    pops = draw_populations(3000, seed=0)
    assert pops.min() >= 0
    assert 15_000 < np.median(pops) < 40_000  # median 25,000; sd of a median of 3000 ~ 2.3 %
    assert pops.max() <= C.POPULATION_CAP * C.POPULATION_MEDIAN
    assert pops.max() > 1_000_000  # the upper tail of a lognormal with log-sd 1.66
    np.testing.assert_array_equal(draw_populations(10, seed=0), pops[:10])
    big = draw_populations(200, seed=1, population=100)
    assert big.max() <= 40_000


# -- marginal shares against the constants --------------------------------------------------


@pytest.fixture(scope="module")
def big_cph() -> np.ndarray:
    """About 2 million persons on CPH, every geography with the RI mix."""
    pops = [50_000] * 40
    a = synthetic_persons(CPH, 40, population=pops, seed=2026, concentration=None).array[:]
    return a.sum(axis=0, dtype=np.int64)  # (2, 2, 63, 17, 115) pooled counts


def test_hispanic_and_race_group_shares_match_ri(big_cph):
    n = int(big_cph.sum())
    total = sum(C.RI_2010_POP.values())
    _check_binomial(big_cph[:, 1].sum(), n, C.RI_2010_POP["hisp"] / total, "Hispanic")
    for r, name in enumerate(SINGLE_RACES):
        combo = _all_race_combos().index((r,))
        _check_binomial(big_cph[:, 0, combo].sum(), n, C.RI_2010_POP[name] / total, name)
    multi = [i for i, c in enumerate(_all_race_combos()) if len(c) > 1]
    _check_binomial(big_cph[:, 0, multi].sum(), n, C.RI_2010_POP["two"] / total, "two or more")


def test_under_18_shares_match_ri_voting_age(big_cph):
    n = int(big_cph.sum())
    under = big_cph[..., :18]
    pop, vap = sum(C.RI_2010_POP.values()), sum(C.RI_2010_VAP.values())
    _check_binomial(under.sum(), n, 1 - vap / pop, "under 18")
    n_hisp = int(big_cph[:, 1].sum())
    p = 1 - C.RI_2010_VAP["hisp"] / C.RI_2010_POP["hisp"]
    _check_binomial(under[:, 1].sum(), n_hisp, p, "Hispanic under 18")


def test_relation_shares_match_assumed(big_cph):
    n = int(big_cph.sum())
    assert sum(C.RELATION_SHARES) == pytest.approx(1.0, abs=1e-12)
    by_relation = big_cph.sum(axis=(0, 1, 2, 4))
    for r, share in enumerate(C.RELATION_SHARES):
        _check_binomial(by_relation[r], n, share, RELATIONSHIPS[r])


def test_every_marginal_matches_the_model(big_cph):
    """The sampler against the model's own cell probabilities (1-D marginals)."""
    n = int(big_cph.sum())
    p = PersonModel.build(CPH).probabilities().reshape(CPH.shape)
    for axis, name in enumerate(CPH.attrs):
        rest = tuple(i for i in range(5) if i != axis)
        got, expect = big_cph.sum(axis=rest), p.sum(axis=rest)
        for k in range(CPH[name]):
            _check_binomial(got[k], n, expect[k], f"{name}={k}")


def test_geography_variation_has_dirichlet_multinomial_variance():
    """Pooled Hispanic count with a Dirichlet mix per geography: mean and variance in closed form.

    With ``w ~ Dirichlet(a s)`` the Hispanic share ``pi = w_hisp`` has mean ``s_h`` and
    variance ``s_h (1 - s_h) / (a + 1)``; given ``pi`` a geography of ``n`` persons has
    ``Binomial(n, pi)`` Hispanics, so ``Var = n (E[pi(1-pi)]) + n^2 Var(pi)``.
    """
    alpha, n_geo, n = 10.0, 400, 300
    out = synthetic_persons(Domain(hisp=2), n_geo, population=[n] * n_geo, seed=9,
                            concentration=alpha)  # fmt: skip
    hisp = out.array[:, 1].astype(np.int64)
    s = C.RI_2010_POP["hisp"] / sum(C.RI_2010_POP.values())
    var_pi = s * (1 - s) / (alpha + 1)
    var_one = n * (s * (1 - s) - var_pi) + n**2 * var_pi
    z = (hisp.sum() - n_geo * n * s) / np.sqrt(n_geo * var_one)
    assert abs(z) < 5, z
    # the spread between geographies: sample variance against var_one (chi-square, 399 dof)
    ratio = hisp.var(ddof=1) / var_one
    lo, hi = stats.chi2.ppf([1e-7, 1 - 1e-7], n_geo - 1) / (n_geo - 1)
    assert lo < ratio < hi, ratio
    without = synthetic_persons(Domain(hisp=2), n_geo, population=[n] * n_geo, seed=9,
                                concentration=None).array[:, 1]  # fmt: skip
    binom = n * s * (1 - s)
    assert lo < without.var(ddof=1) / binom < hi


@pytest.mark.parametrize("n", [20, 5000])  # groups below, and the largest above, K = 230
def test_each_sampler_is_multinomial(n):
    """Pooled over geographies of equal size, every cell is Binomial(G n, p_cell)."""
    g = 300
    a = synthetic_persons(SMALL, g, population=[n] * g, seed=4, concentration=None).array[:]
    cells = a.reshape(g, -1).sum(axis=0, dtype=np.int64)
    p = PersonModel.build(SMALL).probabilities()
    for k in np.flatnonzero(p > 0):
        _check_binomial(cells[k], g * n, p[k], f"cell {k}")
    assert cells[p == 0].sum() == 0


# -- the model ---------------------------------------------------------------------------


def test_age_pyramid_is_2010_like():
    age = M.age_shape()
    assert age.shape == (115,) and age.sum() == pytest.approx(1.0)
    assert 0.12 < age[65:].sum() < 0.15  # US 2010: 13.0 % aged 65+
    assert 0.015 < age[85:].sum() < 0.025  # US 2010: 1.8 % aged 85+
    assert 0 < age[114] < 1e-8
    assert 45 <= 40 + np.argmax(age[40:70]) <= 60  # the baby-boom bulge: a local maximum


def test_relation_fit_and_zero_patterns():
    rel = M.relation_given_age()
    np.testing.assert_allclose(rel.sum(axis=1), 1.0, atol=1e-12)
    age = M.group_shares() @ M.age_given_group()
    np.testing.assert_allclose(age @ rel, C.RELATION_SHARES, atol=1e-12)
    idx = {name: i for i, name in enumerate(RELATIONSHIPS)}
    assert rel[:15, idx["householder"]].max() == 0
    assert rel[:35, idx["parent"]].max() == 0
    assert rel[21:, idx["foster child"]].max() == 0
    assert rel[:18, idx["biological child"]].min() > 0.5


def test_group_race_maps_ri_groups_onto_census_coding():
    gr = M.group_race()
    np.testing.assert_allclose(gr.sum(axis=(1, 2)), 1.0)
    for k, group in enumerate(GROUPS):
        if group in ("hisp", "two"):
            continue
        assert gr[k, 0, race_index([group])] == 1.0
    assert gr[GROUPS.index("hisp"), 0].sum() == 0
    assert gr[GROUPS.index("two"), 0, :6].sum() == 0 and gr[GROUPS.index("two"), 1].sum() == 0
    assert (gr[GROUPS.index("hisp"), 1] > 0).all()


def test_known_attributes_summed_out_resized_and_unknown_uniform():
    full = PersonModel.build(CPH).probabilities().reshape(CPH.shape)
    # absent attributes are summed out; the order of the domain is respected
    sub = PersonModel.build(Domain(age=115, sex=2)).probabilities().reshape(115, 2)
    np.testing.assert_allclose(sub, full.sum(axis=(1, 2, 3)).T, rtol=1e-10)
    # fewer categories: the last one collects the rest (age top-coded at 9+)
    top = PersonModel.build(Domain(age=10)).probabilities()
    age = full.sum(axis=(0, 1, 2, 3))
    np.testing.assert_allclose(top, np.r_[age[:9], age[9:].sum()], rtol=1e-10)
    # more categories: the extra ones are impossible
    wide = PersonModel.build(Domain(race=70)).probabilities()
    np.testing.assert_allclose(wide[:63], full.sum(axis=(0, 1, 3, 4)), rtol=1e-10)
    assert (wide[63:] == 0).all()
    # unknown attributes are uniform and independent
    odd = PersonModel.build(Domain(sex=2, colour=3)).probabilities().reshape(2, 3)
    np.testing.assert_allclose(odd, np.repeat(full.sum(axis=(1, 2, 3, 4))[:, None] / 3, 3, axis=1))
    # votingage is age >= 18
    va = PersonModel.build(Domain(age=115, votingage=2)).probabilities().reshape(115, 2)
    assert va[:18, 1].max() == 0 and va[18:, 0].max() == 0
    np.testing.assert_allclose(va.sum(axis=1), age, rtol=1e-10)


def test_unknown_only_domain_is_uniform():
    out = synthetic_persons(Domain(x=4, y=5), 3, population=[20, 0, 7], seed=1)
    assert out.array.shape == (3, 4, 5)
    np.testing.assert_allclose(PersonModel.build(Domain(x=4, y=5)).probabilities(), 1 / 20)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_geographies=0), "at least 1"),
        (dict(seed=-1), "seed"),
        (dict(chunk=0), "chunk"),
        (dict(concentration=0.0), "concentration"),
        (dict(population=[1, 2]), "populations"),
        (dict(population=[1, -2, 3]), "0.."),
        (dict(population=0), "median"),
        (dict(scheduler="processes"), "in-memory store"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    args = dict(domain=SMALL, n_geographies=3) | kwargs
    with pytest.raises(ValueError, match=match):
        synthetic_persons(**args)


def test_too_large_domain_is_refused():
    with pytest.raises(ValueError, match="cells"):
        PersonModel.build(Domain(a=4096, b=4096))


# -- memory ------------------------------------------------------------------------------


def _traced_peak(n_geo: int, tmp_path, domain: Domain, chunk: int) -> int:
    tracemalloc.start()
    try:
        synthetic_persons(domain, n_geo, str(tmp_path / f"m{n_geo}.zarr"), chunk=chunk,
                          population=[4000] * n_geo, seed=1)  # fmt: skip
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_geographies(tmp_path):
    domain = Domain(sex=2, hisp=2, race=63, age=115)  # 28,980 cells, 116 kB a geography
    chunk = 4
    chunk_bytes = chunk * domain.size * 4
    small = _traced_peak(16, tmp_path, domain, chunk)
    large = _traced_peak(400, tmp_path, domain, chunk)
    grown = (400 - 16) * domain.size * 4  # 44 MB more data
    assert large - small < 6 * chunk_bytes < grown / 10, (small, large)


# -- the constants against the shared data -------------------------------------------------


@requires_shared_data
def test_ri_constants_recomputed_from_the_block_file():
    groups = list(C.RI_2010_POP)
    pop = dict.fromkeys(groups, 0)
    vap = dict.fromkeys(groups, 0)
    total = 0
    with open(shared_data("ri_2010_blocks", "ri_2010_block.csv"), newline="") as f:
        for row in csv.DictReader(f):
            total += int(row["pop"])
            for g in groups:
                pop[g] += int(row[f"pop_{g}"])
                vap[g] += int(row[f"vap_{g}"])
    assert total == C.RI_2010_TOTAL == 1_052_567
    assert pop == C.RI_2010_POP
    assert vap == C.RI_2010_VAP


@requires_shared_data
def test_providence_constants_recomputed_from_the_pl94_file():
    path = shared_data("pl94_2018e2e_providence", "ri000012018_2020Style.pl")
    geo = shared_data("pl94_2018e2e_providence", "rigeo2018_2020Style.pl")
    county = [line.split("|")[7] for line in geo.read_text().splitlines()
              if line.split("|")[2] == "050"]  # fmt: skip
    assert county == ["2"]
    row = next(r for r in path.read_text().splitlines() if r.split("|")[4] == "2")
    values = [int(v) for v in row.split("|")[5:]]
    p1, p2 = values[:71], values[71:]

    def combos(table: list[int]) -> list[int]:
        # Table layout: total, one race, 6 single races, two or more, then for k = 2..5
        # a subtotal followed by its C(6, k) combinations, then six races (one cell).
        out, i = list(table[2:8]), 9
        for k in range(2, 6):
            n = len(list(itertools.combinations(range(6), k)))
            assert sum(table[i + 1 : i + 1 + n]) == table[i]
            out += table[i + 1 : i + 1 + n]
            i += 1 + n
        return [*out, table[i]]

    total = combos(p1)
    not_hisp = combos(p2[2:])
    assert sum(total) == p1[0] and sum(not_hisp) == p2[2]
    assert tuple(not_hisp) == C.PROVIDENCE_2018_NOT_HISPANIC_RACE
    hisp = tuple(t - n for t, n in zip(total, not_hisp, strict=True))
    assert hisp == C.PROVIDENCE_2018_HISPANIC_RACE and sum(hisp) == p2[1]
