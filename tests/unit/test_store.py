"""The zarr data store: layout, round trips, adoption, fail-closed writes, level aggregation."""

from __future__ import annotations

import os
import pathlib

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr

from dpdask import Domain, Geography
from dpdask.errors import ArgumentError, DataError, ShapeError
from dpdask.publish import publishing
from dpdask.store import (
    StoreExistsError,
    adopt_array,
    aggregate,
    default_geo_chunk,
    open_store,
    read_store,
    write_store,
)
from dpdask.store._aggregate import level_key

LEVELS = {"state": 1, "county": 3, "tract": 6}


@pytest.fixture
def geography(rng) -> Geography:
    digits = zip(
        rng.integers(1, 4, 80), rng.integers(0, 4, 80), rng.integers(0, 30, 80), strict=True
    )
    ids = {f"{s}{c:02d}{t:03d}" for s, c, t in digits}
    return Geography.from_geoids(ids, LEVELS)


@pytest.fixture
def counts(rng, geography, small_domain) -> np.ndarray:
    return rng.integers(0, 7, size=(geography.n_units(), *small_domain.shape))


def _tree_bytes(path: pathlib.Path) -> dict[str, bytes]:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): p.read_bytes() for p in files}


def _no_leftovers(parent: pathlib.Path) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(".")]


# -- layout and round trip ---------------------------------------------------


@pytest.mark.parametrize("lazy_input", [False, True])
def test_round_trip_and_layout(tmp_path, counts, small_domain, geography, lazy_input):
    src = da.from_array(counts, chunks=(5, 1, 3, 2)) if lazy_input else counts
    store = write_store(tmp_path / "s", src, small_domain, geography, geo_chunk=7, source="test")
    x, domain, geo = read_store(tmp_path / "s")
    assert isinstance(x, da.Array) and x.name.startswith("ingest-counts-")
    np.testing.assert_array_equal(x.compute(), counts)
    assert domain == small_domain and geo == geography
    # the layout as other tools see it, read with zarr directly
    group = zarr.open_group(str(tmp_path / "s"), mode="r")
    arr = group["counts"]
    assert arr.chunks == (7, *small_domain.shape)
    assert arr.metadata.dimension_names == ("geography", "a", "b", "c")
    meta = group.attrs["dpdask"]
    assert meta["domain"] == [["a", 2], ["b", 3], ["c", 4]]
    assert meta["geography_levels"] == list(LEVELS)
    assert meta["source"] == "test"
    assert list(group["geography/tract/ids"][:]) == list(geography.ids[-1])
    np.testing.assert_array_equal(group["geography/county/parent"][:], geography.parents[0])
    assert "parent" not in group["geography/state"]
    assert x.chunks[0][0] == 7 and store.counts.dtype == counts.dtype


def test_read_store_eager_and_default_chunk(tmp_path, counts, small_domain, geography):
    write_store(tmp_path / "s", counts.astype(np.int32), small_domain, geography)
    z, _, _ = read_store(tmp_path / "s", lazy=False)
    assert isinstance(z, zarr.Array) and z.dtype == np.int32
    expected = min(64 * 2**20 // (small_domain.size * 4), geography.n_units())
    assert z.chunks[0] == expected == min(default_geo_chunk(small_domain, "int32"), z.shape[0])


# -- fail closed -----------------------------------------------------------------


def test_existing_store_is_untouched(tmp_path, counts, small_domain, geography):
    write_store(tmp_path / "s", counts, small_domain, geography)
    before = _tree_bytes(tmp_path / "s")
    with pytest.raises(StoreExistsError, match="already exists"):
        write_store(tmp_path / "s", counts * 2, small_domain, geography)
    assert _tree_bytes(tmp_path / "s") == before
    write_store(tmp_path / "s", counts * 2, small_domain, geography, overwrite=True)
    np.testing.assert_array_equal(read_store(tmp_path / "s")[0].compute(), counts * 2)
    _no_leftovers(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.astype(float), "counts must be integers"),
        (lambda c: c[:-1], "need"),
        (
            lambda c: np.where(np.arange(len(c))[:, None, None, None] == len(c) - 1, -1, c),
            "negative",
        ),
    ],
)
@pytest.mark.parametrize("lazy_input", [False, True])
def test_bad_counts_write_nothing(
    tmp_path, counts, small_domain, geography, change, message, lazy_input
):
    bad = change(counts)
    if lazy_input:
        bad = da.from_array(bad, chunks=(4, 2, 3, 4))
    write_store(tmp_path / "old", counts, small_domain, geography)
    before = _tree_bytes(tmp_path / "old")
    for target, overwrite in ((tmp_path / "new", False), (tmp_path / "old", True)):
        with pytest.raises(DataError, match=message):
            write_store(target, bad, small_domain, geography, geo_chunk=4, overwrite=overwrite)
    assert not (tmp_path / "new").exists()
    assert _tree_bytes(tmp_path / "old") == before
    _no_leftovers(tmp_path)


def test_negative_count_is_located(tmp_path, counts, small_domain, geography):
    bad = counts.copy()
    bad[23, 1, 2, 3] = -4
    with pytest.raises(DataError, match="negative value at geography row 23"):
        write_store(
            tmp_path / "s", da.from_array(bad, chunks=(5, 2, 3, 4)), small_domain, geography
        )


def test_publishing_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), publishing(tmp_path / "out") as tmp:
        tmp.mkdir()
        (tmp / "part").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_open_store_rejects_other_things(tmp_path, counts, small_domain, geography):
    with pytest.raises(FileNotFoundError, match="no data store"):
        open_store(tmp_path / "absent")
    zarr.open_group(str(tmp_path / "plain"), mode="w")
    with pytest.raises(DataError, match="not a dpdask data store"):
        open_store(tmp_path / "plain")
    write_store(tmp_path / "s", counts, small_domain, geography)
    group = zarr.open_group(str(tmp_path / "s"), mode="r+")
    meta = dict(group.attrs["dpdask"])
    group.attrs["dpdask"] = {**meta, "domain": [["a", 2], ["b", 3], ["c", 5]]}
    with pytest.raises(DataError, match="has shape"):
        open_store(tmp_path / "s")
    group.attrs["dpdask"] = {**meta, "format_version": 99}
    with pytest.raises(DataError, match="version 99 is not supported"):
        open_store(tmp_path / "s")
    group.attrs["dpdask"] = meta
    del group["counts"]
    group.require_group("counts")  # a group where the counts array belongs
    with pytest.raises(DataError, match=r"/s: counts is a group, not an array"):
        open_store(tmp_path / "s")


# -- adopting an existing array ------------------------------------------------


def test_adopt_array_copies_into_layout(tmp_path, counts, small_domain, geography):
    src = zarr.create_array(
        str(tmp_path / "raw"), shape=counts.shape, chunks=(6, 1, 3, 2), dtype=np.int16
    )
    src[:] = counts
    store = adopt_array(tmp_path / "raw", small_domain, geography, tmp_path / "s")
    assert store.counts.chunks == (6, *small_domain.shape) and store.counts.dtype == np.int16
    np.testing.assert_array_equal(store.counts[:], counts)
    assert store.geography == geography and store.domain == small_domain
    assert "adopted from" in store.attrs["source"]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "raw"))[:], counts)


@pytest.mark.parametrize(
    ("dtype", "shape_cut", "poke", "message"),
    [
        (np.float64, 0, None, "counts must be integers"),
        (np.int64, 1, None, "the source array has shape"),
        (np.int64, 0, -1, "negative value at geography row"),
    ],
)
def test_adopt_array_fails_closed(
    tmp_path, counts, small_domain, geography, dtype, shape_cut, poke, message
):
    data = counts[: len(counts) - shape_cut].astype(dtype)
    if poke is not None:
        data[-1, 0, 0, 0] = poke
    src = zarr.create_array(
        str(tmp_path / "raw"), shape=data.shape, chunks=(6, 2, 3, 4), dtype=dtype
    )
    src[:] = data
    with pytest.raises(DataError, match=message):
        adopt_array(src, small_domain, geography, tmp_path / "s")
    assert not (tmp_path / "s").exists()
    _no_leftovers(tmp_path)
    with pytest.raises(DataError, match="not a zarr array"):
        adopt_array(tmp_path / "nothing", small_domain, geography, tmp_path / "s")


# -- aggregation -------------------------------------------------------------------


def _groupby_oracle(counts: np.ndarray, geography: Geography, level: str) -> np.ndarray:
    """Rows summed by their GEOID prefix, with pandas (independent of the hierarchy code)."""
    width = LEVELS[level]
    flat = pd.DataFrame(counts.reshape(len(counts), -1))
    sums = flat.groupby([u[:width] for u in geography.ids[-1]]).sum()
    assert list(sums.index) == list(geography.ids[geography.level_index(level)])
    return sums.to_numpy().reshape((-1, *counts.shape[1:]))


@pytest.mark.parametrize("level", ["state", "county", "tract"])
@pytest.mark.parametrize("in_chunk", [1, 4, 11, 1000])
@pytest.mark.parametrize(("out_chunk", "split_every"), [(None, 8), (1, 2), (3, 3)])
def test_aggregate_matches_groupby(counts, geography, level, in_chunk, out_chunk, split_every):
    x = da.from_array(counts, chunks=(in_chunk, 1, 3, 4))
    y = aggregate(x, geography, level, chunks=out_chunk, split_every=split_every)
    np.testing.assert_array_equal(y.compute(), _groupby_oracle(counts, geography, level))
    if level == "tract":
        assert y is x
        return
    step = out_chunk or in_chunk
    assert y.chunks[0] == tuple(
        np.diff(np.r_[0 : geography.n_units(level) : step, geography.n_units(level)])
    )
    assert y.name.startswith(f"aggregate-{level}-") and y.dtype == np.int64


def test_aggregate_graph_is_bounded(counts, geography):
    """One final task per output chunk; no task reads more than split_every partial sums."""
    x = da.from_array(counts, chunks=(1, 2, 3, 4))
    y = aggregate(x, geography, "state", chunks=3, split_every=3)
    graph = dict(y.__dask_graph__())
    finals = [k for k in graph if isinstance(k, tuple) and k[0] == y.name]
    assert len(finals) == y.numblocks[0] == 1
    for key in graph:
        deps = y.__dask_graph__().get_all_dependencies()[key]
        assert len(deps) <= 3
        name = key[0] if isinstance(key, tuple) else key
        assert name.rsplit("-", 1)[0] in (
            "aggregate-state",
            "aggregate-state-partial",
            "aggregate-state-combine",
        ) or name.startswith("array-")


def test_aggregate_from_intermediate_level_and_unsorted_units(rng, small_domain):
    # a hand-made hierarchy whose finest units are NOT ordered by parent
    g = Geography(
        levels=("region", "site"),
        ids=(("r0", "r1", "r2"), tuple(f"s{i}" for i in range(9))),
        parents=(np.array([2, 0, 1, 0, 2, 2, 1, 0, 1]),),
    )
    x = rng.integers(0, 9, size=(9, *small_domain.shape))
    expected = np.stack([x[g.parents[0] == r].sum(axis=0) for r in range(3)])
    for chunk in (1, 2, 9):
        got = aggregate(da.from_array(x, chunks=chunk), g, "region", split_every=2).compute()
        np.testing.assert_array_equal(got, expected)


def test_aggregate_of_coarser_level(counts, geography):
    county = aggregate(da.from_array(counts, chunks=5), geography, "county")
    state = aggregate(county, geography, "state", of="county")
    np.testing.assert_array_equal(state.compute(), _groupby_oracle(counts, geography, "state"))


def test_aggregate_reads_store_lazily(tmp_path, counts, small_domain, geography):
    write_store(tmp_path / "s", counts, small_domain, geography, geo_chunk=8)
    x, _, geo = read_store(tmp_path / "s")
    y = aggregate(x, geo, "county")
    assert dask.compute(y.sum())[0] == counts.sum()


def test_aggregate_errors(counts, geography):
    with pytest.raises(ShapeError, match="rows but level 'tract'"):
        aggregate(counts[:-1], geography, "county")
    with pytest.raises(ValueError, match="finer than"):
        aggregate(counts, geography, "tract", of="county")
    with pytest.raises(ArgumentError, match="split_every"):
        aggregate(counts, geography, "county", split_every=1)


@pytest.mark.parametrize(
    ("level", "word"), [("block_group", "block-group"), ("cd116", "cd"), ("County", "county")]
)
def test_level_key(level, word):
    assert level_key(level) == word


def test_write_store_accepts_pathlike_strings(tmp_path, counts, small_domain, geography):
    write_store(os.fspath(tmp_path / "s"), counts, small_domain, geography)
    assert repr(open_store(tmp_path / "s")).startswith("DataStore(")


@pytest.mark.parametrize("lazy_input", [False, True])
def test_counts_too_large_for_dtype(tmp_path, counts, small_domain, geography, lazy_input):
    big = counts.copy()
    big[40, 0, 0, 0] = 128
    src = da.from_array(big, chunks=7) if lazy_input else big
    with pytest.raises(DataError, match=r"above 127 \(int8\) at geography row 40"):
        write_store(tmp_path / "s", src, small_domain, geography, dtype=np.int8, geo_chunk=7)
    assert list(tmp_path.iterdir()) == []


def test_adopt_synthetic_persons(tmp_path):
    from dpdask.datasets import synthetic_persons

    domain = Domain(sex=2, age=10)
    out = synthetic_persons(domain, 7, tmp_path / "raw", seed=3, chunk=3, population=50)
    county = Geography.from_table({"state": ["1"] * 4 + ["2"] * 3, "county": out.geography.ids[0]})
    store = adopt_array(out, geography=county, store=tmp_path / "s")
    assert store.domain == domain and store.counts.chunks == (3, 2, 10)
    np.testing.assert_array_equal(store.counts[:], out.array[:])
    state = aggregate(read_store(tmp_path / "s")[0], county, "state").compute()
    expected = [out.population[:4].sum(), out.population[4:].sum()]
    np.testing.assert_array_equal(state.sum(axis=(1, 2)), expected)
    adopt_array(
        tmp_path / "raw", geography=out.geography, store=tmp_path / "t"
    )  # domain from attrs
    assert open_store(tmp_path / "t").domain == domain
    with pytest.raises(ArgumentError, match="pass geography="):
        adopt_array(tmp_path / "raw", store=tmp_path / "u")


@pytest.mark.parametrize("chunk", [7, 200])
def test_aggregate_many_parents_per_chunk(rng, small_domain, chunk):
    """More than 32 parents in one chunk (the reduceat path), in random order."""
    parents = np.concatenate([np.arange(40), rng.integers(0, 40, 160)])
    rng.shuffle(parents)
    g = Geography(
        ("region", "site"), (tuple(map(str, range(40))), tuple(map(str, range(200)))), (parents,)
    )
    x = rng.integers(0, 9, size=(200, *small_domain.shape)).astype(np.int32)
    expected = np.zeros((40, *small_domain.shape), dtype=np.int64)
    np.add.at(expected, parents, x)
    got = aggregate(da.from_array(x, chunks=chunk), g, "region", chunks=9).compute()
    np.testing.assert_array_equal(got, expected)
