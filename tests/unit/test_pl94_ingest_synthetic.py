"""Synthetic P.L. 94 blocks in a sparse store, with their block attributes.

Oracles: the blocks drawn at once in memory (``synthetic_pl94_blocks``) against the
store written a few chunks per task; persons, units and facilities checked against
each other; every level's sums against sums grouped by GEOID prefix.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import census
from dpdask.datasets import BLOCKS_PER_STREAM, SyntheticBlocksGenerator, synthetic_pl94_blocks
from dpdask.errors import ArgumentError, SpecError
from dpdask.pipeline import parse_spec
from dpdask.pipeline._data import check_input, data_geography, load_data
from dpdask.store import block_geography, open_store, synthetic_blocks_store

N_BLOCKS, PERSONS = 2 * BLOCKS_PER_STREAM + 700, 60_000
WIDTHS = {"state": 2, "county": 5, "tract": 11, "block_group": 12}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("blocks") / "s.zarr"
    synthetic_blocks_store(path, N_BLOCKS, PERSONS, seed=4, chunk=BLOCKS_PER_STREAM)
    return open_store(path), synthetic_pl94_blocks(N_BLOCKS, PERSONS, seed=4)


def test_store_holds_the_blocks_drawn_at_once(written):
    store, truth = written
    assert store.layout == "sparse" and store.domain == census.pl94_full_domain()
    assert store.unit_attribute_names == ("gq_facilities", "gq_population", "housing_units")
    dense = store.rows(0, N_BLOCKS).reshape(truth.counts.shape)
    np.testing.assert_array_equal(dense, truth.counts)
    np.testing.assert_array_equal(store.unit_attribute("housing_units"), truth.housing_units)
    np.testing.assert_array_equal(store.unit_attribute("gq_facilities"), truth.facilities)


def test_persons_units_and_facilities_are_consistent(written):
    store, _ = written
    counts = store.rows(0, N_BLOCKS).reshape(N_BLOCKS, len(census.HHGQ), -1)
    by_type = counts.sum(axis=2)
    units = store.unit_attribute("housing_units")
    facilities = store.unit_attribute("gq_facilities")
    np.testing.assert_array_equal(store.unit_attribute("gq_population"), by_type)
    assert int(by_type.sum()) == PERSONS
    assert np.all(units[by_type[:, 0] > 0] > 0)  # household persons only where units are
    assert np.all(facilities[:, 0] == 0)
    gq, fac = by_type[:, 1:], facilities[:, 1:]
    assert np.all(fac[gq > 0] > 0) and np.all(gq[fac > 0] > 0)  # GQ type t only with facility
    assert gq.sum() > 0 and (units == 0).any()  # the checks above can fail


def test_every_level_sums_like_its_geoid_prefixes(written):
    store, _ = written
    ids = np.asarray(store.geography.ids[-1])
    gq = store.unit_attribute("gq_population")
    persons = np.asarray(store.to_dask().sum(axis=(2, 3, 4)).compute())
    for level, width in WIDTHS.items():
        prefixes = np.array([u[:width] for u in ids])
        level_ids = store.geography.ids[store.geography.level_index(level)]
        assert list(level_ids) == sorted(set(prefixes.tolist()))
        oracle = np.stack([gq[prefixes == p].sum(axis=0) for p in level_ids])
        np.testing.assert_array_equal(store.unit_attribute("gq_population", level), oracle)
        np.testing.assert_array_equal(
            oracle.sum(axis=1), [persons[prefixes == p].sum() for p in level_ids]
        )


def test_chunked_draws_equal_the_whole():
    gen = SyntheticBlocksGenerator(N_BLOCKS, 20_000, seed=9)
    whole = gen.draw(0, N_BLOCKS)
    tail = gen.draw(BLOCKS_PER_STREAM, N_BLOCKS)
    np.testing.assert_array_equal(tail.counts, whole.counts[BLOCKS_PER_STREAM:])
    np.testing.assert_array_equal(tail.facilities, whole.facilities[BLOCKS_PER_STREAM:])
    with pytest.raises(ArgumentError, match="whole chunks"):
        gen.draw(1, 10)


def test_block_geography_shape():
    g = block_geography(100_000)
    assert g.levels == ("state", "county", "tract", "block_group", "block")
    sizes = [g.n_units(lv) for lv in g.levels]
    assert sizes[0] == 1 and sizes[-1] == 100_000
    assert 25 <= sizes[4] / sizes[3] <= 35 and 2 <= sizes[3] / sizes[2] <= 4
    for i, lv in enumerate(g.levels[1:], start=1):
        parent_ids = np.asarray(g.ids[i - 1])[g.parents[i - 1]]
        assert all(c.startswith(p) for c, p in zip(g.ids[i], parent_ids, strict=True)), lv
        assert list(g.ids[i]) == sorted(g.ids[i])


def _spec(tmp_path, domain="pl94-full", **data):
    raw = {
        "release": "blocks",
        "data": {"format": "synthetic-blocks", "id": "blocks-test", **data},
        "domain": domain,
        "workload": "identity",
        "privacy": {"zcdp": 1},
        "output": str(tmp_path / "out.zarr"),
    }
    return parse_spec(raw, tmp_path)


def test_spec_format_writes_the_store_with_attributes(tmp_path):
    spec = _spec(tmp_path, blocks=300, persons=5000, seed=2)
    geo, names = data_geography(spec, tmp_path / "work")
    assert geo == block_geography(300)
    store = load_data(spec, tmp_path / "work")
    assert store.unit_attribute_names == names
    assert store.geography == geo
    truth = synthetic_pl94_blocks(300, 5000, seed=2)
    np.testing.assert_array_equal(store.unit_attribute("housing_units"), truth.housing_units)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"blocks": 0}, "data.blocks"),
        ({"persons": -1}, "data.persons"),
        ({"seed": 1.5}, "data.seed"),
    ],
)
def test_spec_refuses_bad_sizes(tmp_path, data, field):
    with pytest.raises(SpecError, match=field):
        _spec(tmp_path, **data)
    with pytest.raises(SpecError, match="data: unknown"):
        _spec(tmp_path, geographies=3)


def test_spec_refuses_another_domain(tmp_path):
    with pytest.raises(SpecError, match="domain: data of format 'synthetic-blocks'"):
        check_input(_spec(tmp_path, domain="pl94"))
