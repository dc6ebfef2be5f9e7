"""Synthetic stores: the sparse writer gives exactly the dense generator's counts."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import dpdask.store._entries as entries_module
from dpdask import Domain, Geography
from dpdask.datasets import SyntheticGenerator, synthetic_block, synthetic_persons
from dpdask.errors import ArgumentError
from dpdask.store import StoreExistsError, synthetic_store

DOMAIN = Domain(sex=2, hisp=2, age=30)


@pytest.fixture
def geography() -> Geography:
    """Three levels, 41 finest units (rows), parents contiguous."""
    ids = [f"{s}{c}{t:02d}" for s in "12" for c in "012" for t in range(7)][:41]
    return Geography.from_geoids(ids, {"state": 1, "county": 2, "tract": 4})


@pytest.mark.parametrize("chunk", [None, 1, 6, 1000])
def test_sparse_store_equals_the_dense_generator(tmp_path, monkeypatch, geography, chunk):
    monkeypatch.setattr(entries_module, "ENTRY_CHUNK", 50)  # parts straddle entry chunks
    n = geography.n_units()
    store = synthetic_store(
        tmp_path / "s", DOMAIN, geography, population=150.0, seed=11, chunk=chunk
    )
    reference = synthetic_persons(DOMAIN, n, seed=11, population=150.0).array[:]
    assert store.layout == "sparse" and store.dtype == np.int32 and store.geography == geography
    assert store.nnz == np.count_nonzero(reference)
    np.testing.assert_array_equal(store.to_dask().compute(), reference)
    np.testing.assert_array_equal(
        store.to_sparse((5, 30, 6)).compute().todense(), reference.reshape(n, -1)
    )
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not (tmp_path / "s" / ".parts").exists()


def test_dense_and_sparse_synthetic_stores_agree(tmp_path, geography):
    pops = np.arange(geography.n_units()) * 17 % 90  # zeros included
    pops[[3, 4]] = 0
    kw = {"population": pops, "seed": 5, "concentration": None}
    sparse_ = synthetic_store(tmp_path / "s", DOMAIN, geography, **kw)
    dense = synthetic_store(tmp_path / "d", DOMAIN, geography, layout="dense", chunk=4, **kw)
    assert dense.layout == "dense" and dense.counts.chunks[0] == 4
    got = sparse_.to_dask().compute()
    np.testing.assert_array_equal(got, dense.counts[:])
    np.testing.assert_array_equal(got.sum(axis=(1, 2, 3)), pops)
    np.testing.assert_array_equal(
        got,
        synthetic_block(
            DOMAIN, 0, geography.n_units(), seed=5, population=pops, concentration=None
        ),
    )
    assert "seed 5" in sparse_.attrs["source"]


def test_generator_entries_are_the_non_zero_counts_of_its_blocks():
    domain = Domain(sex=2, age=115, race=63)  # 14,490 cells: several rows per dense slab
    gen = SyntheticGenerator(domain, 30, seed=2, population=400.0)
    block = gen.block(4, 27)
    np.testing.assert_array_equal(block, synthetic_block(domain, 4, 27, seed=2, population=400.0))
    geos, cells, counts = gen.entries(4, 27)
    flat = block.reshape(23, -1)
    rows, cols = np.nonzero(flat)
    np.testing.assert_array_equal(geos, rows + 4)
    np.testing.assert_array_equal(cells, cols)
    np.testing.assert_array_equal(counts, flat[rows, cols])
    assert geos.dtype == cells.dtype == np.int64 and counts.dtype == np.int32
    assert gen.entries(9, 9)[0].size == 0
    with pytest.raises(ValueError, match="need 0 <= start <= stop <= 30"):
        gen.entries(3, 31)


def test_generator_pickles_without_its_model_tables():
    domain = Domain(sex=2, age=115, race=63)
    gen = SyntheticGenerator(domain, 12, seed=5, population=300.0)
    payload = pickle.dumps(gen)
    # the model's tables are 8 groups x 2 x 14,490 float64 cells (1.8 MB); the pickle
    # carries the domain, seed and 12 populations only
    assert len(payload) < 8 * 2 * domain.size * 8 // 100
    back = pickle.loads(payload)
    np.testing.assert_array_equal(back.population, gen.population)
    np.testing.assert_array_equal(
        back.block(0, 12), synthetic_block(domain, 0, 12, seed=5, population=300.0)
    )


def test_synthetic_store_arguments(tmp_path, geography):
    with pytest.raises(ArgumentError, match="layout must be 'sparse' or 'dense'"):
        synthetic_store(tmp_path / "s", DOMAIN, geography, layout="auto")
    with pytest.raises(ArgumentError, match="chunk must be a positive integer"):
        synthetic_store(tmp_path / "s", DOMAIN, geography, chunk=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        synthetic_store(tmp_path / "s", DOMAIN, geography, seed=-1)
    with pytest.raises(ValueError, match="41 geographies but"):
        synthetic_store(tmp_path / "s", DOMAIN, geography, population=[1, 2])
    assert list(tmp_path.iterdir()) == []
    synthetic_store(tmp_path / "s", DOMAIN, geography, population=10.0)
    with pytest.raises(StoreExistsError, match="already exists"):
        synthetic_store(tmp_path / "s", DOMAIN, geography)


def test_block_level_pl94_scale_slice(tmp_path):
    # a slice of the national P.L. 94 case: 252 cells, about 40 persons per block
    domain = Domain(votingage=2, hisp=2, race=63)
    n = 20_000
    geo = Geography.from_geoids([f"{i // 1000:02d}{i:06d}" for i in range(n)], {"c": 2, "b": 8})
    store = synthetic_store(tmp_path / "s", domain, geo, population=40.0, seed=1, chunk=3000)
    gen = SyntheticGenerator(domain, n, seed=1, population=40.0)
    assert store.nnz < int(gen.population.sum())  # entries grow with persons, not cells
    assert store.nnz * (8 + 8 + 4) < n * domain.size * 4
    rows = [0, 777, 12_345, n - 1]
    for r in rows:
        np.testing.assert_array_equal(store.counts[r], gen.block(r, r + 1)[0])
    assert int(store.counts.count[:].sum(dtype=np.int64)) == int(gen.population.sum())
