"""Sparse data stores (format 2): layout, dense oracles, row reads, fail-closed writes."""

from __future__ import annotations

import re

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import sparse
import zarr

import dpdask.store._entries as entries_module
from dpdask import Domain, Geography
from dpdask.errors import ArgumentError, ArgumentTypeError, DataError
from dpdask.store import (
    SparseCounts,
    StoreExistsError,
    adopt_array,
    aggregate,
    aggregate_sparse,
    ingest_records,
    open_store,
    read_store,
    write_sparse_store,
    write_store,
)

LEVELS = {"state": 1, "county": 3, "tract": 6}
KEY = re.compile(r"^[a-z]+(-[a-z]+)*-[0-9a-f]{32}$")  # letters and dashes, then the token


@pytest.fixture
def geography(rng) -> Geography:
    digits = zip(
        rng.integers(1, 4, 60), rng.integers(0, 4, 60), rng.integers(0, 30, 60), strict=True
    )
    return Geography.from_geoids({f"{s}{c:02d}{t:03d}" for s, c, t in digits}, LEVELS)


@pytest.fixture
def counts(rng, geography, small_domain) -> np.ndarray:
    """Mostly zero counts; some units have no entry at all."""
    shape = (geography.n_units(), *small_domain.shape)
    x = rng.integers(1, 9, size=shape) * (rng.random(shape) < 0.15)
    x[[0, 3, 4, -1]] = 0
    return x


@pytest.fixture(params=[7, 1000])
def entry_chunk(request, monkeypatch) -> int:
    """Entries per zarr chunk: tiny (parts straddle chunks) and the usual."""
    monkeypatch.setattr(entries_module, "ENTRY_CHUNK", request.param)
    return request.param


def _triples(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = x.reshape(x.shape[0], -1)
    u, c = np.nonzero(flat)
    return u, c, flat[u, c]


def _random_chunks(rng, n: int) -> tuple[int, ...]:
    cuts = np.sort(rng.integers(0, n + 1, size=4))
    return tuple(np.diff(np.concatenate([[0], cuts, [n]])).tolist())  # zeros included


def _no_leftovers(parent) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(".")]


# -- layout on disk ----------------------------------------------------------


@pytest.mark.parametrize("how", ["ndarray", "dask", "triples"])
def test_sparse_layout_on_disk(tmp_path, counts, small_domain, geography, entry_chunk, how):
    if how == "triples":
        store = write_sparse_store(tmp_path / "s", *_triples(counts), small_domain, geography)
    else:
        src = counts if how == "ndarray" else da.from_array(counts, chunks=(9, 1, 3, 2))
        store = write_store(tmp_path / "s", src, small_domain, geography, layout="sparse")
    _no_leftovers(tmp_path)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "entries",
        "geography",
        "zarr.json",
    ]
    group = zarr.open_group(str(tmp_path / "s"), mode="r")
    assert "counts" not in group
    unit, cell, count, offsets = (
        group[f"entries/{k}"] for k in ("unit", "cell", "count", "offsets")
    )
    nnz = int(np.count_nonzero(counts))
    meta = group.attrs["dpdask"]
    assert meta["format_version"] == 2 and meta["layout"] == "sparse" and meta["nnz"] == nnz
    assert meta["format"] == "dpdask-counts" and meta["domain"] == [["a", 2], ["b", 3], ["c", 4]]
    assert meta["geography_levels"] == list(LEVELS) and "created" in meta
    assert meta["n_units"]["tract"] == geography.n_units()
    for arr in (unit, cell, count):
        assert arr.shape == (nnz,) and arr.metadata.dimension_names == ("entry",)
        assert arr.chunks == (min(entry_chunk, nnz),)
    assert unit.dtype == cell.dtype == offsets.dtype == np.int64 and count.dtype == counts.dtype
    assert offsets.shape == (geography.n_units() + 1,)
    assert offsets.metadata.dimension_names == ("geography_edge",)
    # the arrays, read with zarr alone, are the non-zero counts in row-major order
    u, c, k = _triples(counts)
    np.testing.assert_array_equal(unit[:], u)
    np.testing.assert_array_equal(cell[:], c)
    np.testing.assert_array_equal(count[:], k)
    np.testing.assert_array_equal(offsets[:], np.searchsorted(u, np.arange(len(counts) + 1)))
    assert store.layout == "sparse" and store.nnz == nnz and isinstance(store.counts, SparseCounts)
    assert list(group["geography/tract/ids"][:]) == list(geography.ids[-1])


def test_dense_and_sparse_give_the_same_arrays(tmp_path, rng, counts, small_domain, geography):
    dense = write_store(
        tmp_path / "d", counts, small_domain, geography, layout="dense", geo_chunk=7
    )
    sparse_ = write_store(
        tmp_path / "s", counts, small_domain, geography, layout="sparse", geo_chunk=7
    )
    assert (dense.layout, dense.nnz, dense.attrs["format_version"]) == ("dense", None, 1)
    assert "layout" not in dense.attrs  # format 1 is unchanged
    a, b = dense.to_dask(), sparse_.to_dask()
    assert a.chunks == b.chunks and a.dtype == b.dtype == counts.dtype
    assert a.name.startswith("ingest-counts-") and b.name.startswith("ingest-counts-")
    np.testing.assert_array_equal(b.compute(), counts)
    np.testing.assert_array_equal(a.compute(), counts)
    n = geography.n_units()
    for chunks in (None, (n,), (1,) * n, _random_chunks(rng, n)):
        for store in (dense, sparse_):
            x = store.to_sparse(chunks)
            assert x.shape == (n, small_domain.size) and x.dtype == np.int64
            assert (
                isinstance(x._meta, sparse.COO) and KEY.match(x.name) and "ingest-sparse" in x.name
            )
            if chunks is not None:
                assert x.chunks[0] == tuple(chunks)
            np.testing.assert_array_equal(x.compute().todense(), counts.reshape(n, -1))
            for block in x.to_delayed().ravel():
                coo = block.compute()
                assert isinstance(coo, sparse.COO) and coo.ndim == 2 and coo.dtype == np.int64
                linear = coo.coords[0] * coo.shape[1] + coo.coords[1]
                assert (np.diff(linear) > 0).all() and (coo.data != 0).all()
    _, _, geo = read_store(tmp_path / "s")
    np.testing.assert_array_equal(
        aggregate(b, geo, "county").compute(), aggregate(a, geo, "county").compute()
    )


def test_to_sparse_reads_only_the_entries_of_its_rows(tmp_path, counts, small_domain, geography):
    store = write_store(tmp_path / "s", counts, small_domain, geography, layout="sparse")
    offsets = store.counts.offsets[:]
    seen: list[tuple[str, int, int]] = []

    class Recording:
        def __init__(self, name, arr):
            self.name, self.arr = name, arr

        def __getitem__(self, key):
            seen.append((self.name, key.start, key.stop))
            return self.arr[key]

        def __getattr__(self, attr):
            return getattr(self.arr, attr)

    arrays = store.counts.arrays
    for name in ("unit", "cell", "count"):
        arrays[name] = Recording(name, arrays[name])
    n = geography.n_units()
    x = store.to_sparse((10, n - 25, 15))
    block = x.blocks[2].compute()
    np.testing.assert_array_equal(block.todense(), counts[n - 15 :].reshape(15, -1))
    assert {s[0] for s in seen} == {"unit", "cell", "count"}
    assert all((a, b) == (offsets[n - 15], offsets[n]) for _, a, b in seen)
    seen.clear()
    np.testing.assert_array_equal(store.rows(5, 9), counts[5:9])
    assert all((a, b) == (offsets[5], offsets[9]) for _, a, b in seen)


def test_rows_and_indexing_of_sparse_counts(tmp_path, counts, small_domain, geography):
    dense = write_store(tmp_path / "d", counts, small_domain, geography, layout="dense")
    store = write_store(tmp_path / "s", counts, small_domain, geography, layout="sparse")
    view = store.counts
    assert view.shape == counts.shape and view.dtype == counts.dtype and view.ndim == 4
    assert view.chunks[1:] == small_domain.shape and "nnz=" in repr(view)
    keys = [3, -1, np.int64(7), np.s_[2:9], np.s_[::3], np.s_[::-2, 1], np.s_[40:3:-3, :, 2]]
    keys += [np.s_[...], np.s_[..., 1], np.s_[7:7], np.s_[-3:], (slice(None), 0, 1, 2)]
    for key in keys:
        got = view[key]
        assert got.shape == counts[key].shape, key
        np.testing.assert_array_equal(got, counts[key])
    np.testing.assert_array_equal(np.asarray(view), counts)
    for s in (store, dense):
        np.testing.assert_array_equal(s.rows(4, 11), counts[4:11])
        assert s.rows(6, 6).shape == (0, *small_domain.shape)
        with pytest.raises(IndexError, match="outside"):
            s.rows(3, len(counts) + 1)
    with pytest.raises(IndexError, match="outside"):
        view[len(counts)]
    with pytest.raises(ArgumentTypeError, match="int or a slice"):
        view[[1, 2]]
    counts_eager, _, _ = read_store(tmp_path / "s", lazy=False)
    assert isinstance(counts_eager, SparseCounts)
    np.testing.assert_array_equal(view.coo(2, 8).todense(), counts[2:8].reshape(6, -1))


# -- choosing the layout -----------------------------------------------------


@pytest.mark.parametrize("lazy_input", [False, True])
def test_auto_layout_is_the_smaller(tmp_path, rng, small_domain, geography, lazy_input):
    n, size = geography.n_units(), small_domain.size
    for density in (0.05, 0.9):
        x = rng.integers(1, 5, size=(n, *small_domain.shape)) * (
            rng.random((n, size)) < density
        ).reshape(n, *small_domain.shape)
        x = x.astype(np.int32)
        nnz = np.count_nonzero(x)
        expected = "sparse" if nnz * (8 + 8 + 4) < n * size * 4 else "dense"
        src = da.from_array(x, chunks=11) if lazy_input else x
        path = tmp_path / f"{density}"
        store = write_store(path, src, small_domain, geography)
        assert store.layout == expected, (density, nnz)
        np.testing.assert_array_equal(store.to_dask().compute(), x)
    assert {open_store(tmp_path / "0.05").layout, open_store(tmp_path / "0.9").layout} == {
        "sparse",
        "dense",
    }


def test_adopt_array_sparse(tmp_path, counts, small_domain, geography):
    src = zarr.create_array(
        str(tmp_path / "raw"), shape=counts.shape, chunks=(8, *small_domain.shape), dtype=np.int32
    )
    src[:] = counts
    store = adopt_array(src, small_domain, geography, tmp_path / "s", layout="sparse")
    assert store.layout == "sparse" and store.dtype == np.int32
    np.testing.assert_array_equal(store.to_dask().compute(), counts)
    with pytest.raises(ArgumentError, match="layout must be one of"):
        adopt_array(src, small_domain, geography, tmp_path / "t", layout="coo")


def test_ingest_records_sparse_equals_dense(tmp_path, rng):
    domain = Domain(sex=2, age=115, race=63)
    tracts = [f"44{c:03d}{t:06d}" for c in (1, 7) for t in range(40)]
    records = pd.DataFrame(
        {
            "geoid": rng.choice(tracts, 2000),
            "sex": rng.integers(0, 2, 2000),
            "age": rng.integers(0, 115, 2000),
            "race": rng.integers(0, 63, 2000),
        }
    )
    levels = {"state": 2, "county": 5, "tract": 11}
    kw = {"levels": levels, "geographies": tracts}
    auto = ingest_records(records, domain, "geoid", **kw, store=tmp_path / "a")
    dense = ingest_records(records, domain, "geoid", **kw, store=tmp_path / "d", layout="dense")
    assert auto.layout == "sparse" and dense.layout == "dense" and auto.dtype == np.int32
    assert auto.geography == dense.geography and auto.nnz == np.count_nonzero(dense.counts[:])
    np.testing.assert_array_equal(auto.to_dask().compute(), dense.counts[:])
    with pytest.raises(ArgumentError, match="layout must be one of"):
        ingest_records(records, domain, "geoid", store=tmp_path / "x", layout="csr")
    assert not (tmp_path / "x").exists()


# -- write_sparse_store: triples in any order --------------------------------


def test_triples_in_any_order_with_repeats_and_zeros(tmp_path, rng, small_domain, geography):
    n, size = geography.n_units(), small_domain.size
    units = rng.integers(0, n, 400)
    cells = rng.integers(0, size, 400)
    values = rng.integers(0, 4, 400)  # zeros among them, (unit, cell) pairs repeated
    oracle = np.zeros((n, size), dtype=np.int64)
    np.add.at(oracle, (units, cells), values)
    store = write_sparse_store(
        tmp_path / "s", units, cells, values, small_domain, geography, dtype="int16", source="t"
    )
    assert store.nnz == np.count_nonzero(oracle) and store.dtype == np.int16
    assert store.attrs["source"] == "t"
    np.testing.assert_array_equal(store.to_dask().compute().reshape(n, size), oracle)
    np.testing.assert_array_equal(store.counts.count[:], oracle[oracle > 0])
    # lists work too, and empty input gives an empty store
    empty = write_sparse_store(tmp_path / "e", [], [], [], small_domain, geography)
    assert empty.nnz == 0 and empty.to_sparse().compute().nnz == 0
    assert not empty.to_dask().compute().any()


BAD_TRIPLES = [
    ({"counts": [1, -2, 3]}, "counts hold a negative value -2 at position 1"),
    ({"cells": [0, 24, 3]}, r"cells hold 24 at position 1, outside the cells of"),
    ({"cells": [0, 1, -1]}, "cells hold -1 at position 2"),
    ({"units": [0, 1, 99]}, r"units hold 99 at position 2, outside the \d+ finest units"),
    ({"counts": [1.0, 2.0, 3.0]}, "counts have dtype float64; they must be integers"),
    ({"counts": [1.0, np.nan, 3.0]}, "counts hold NaN at position 1"),
    ({"units": [0.0, 1.5, 2.0]}, "units have dtype float64"),
    ({"cells": ["a", "b", "c"]}, "cells have dtype <U1"),
    ({"counts": [1, 2]}, "one length, got 3, 3, 2"),
    ({"units": [[0, 1, 2]]}, r"units must be 1-D, got shape \(1, 3\)"),
    ({"counts": [100, 100, 1], "units": [5, 5, 2], "cells": [3, 3, 1], "dtype": "int8"},
     r"the counts of unit 5 \('\d+'\), cell 3 add up to 200, above 127 \(int8\)"),
    ({"dtype": "float32"}, "dtype has dtype float32"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD_TRIPLES)
def test_bad_triples_are_named_and_nothing_is_written(
    tmp_path, small_domain, geography, change, message
):
    args = {"units": [0, 1, 2], "cells": [0, 1, 2], "counts": [1, 2, 3], **change}
    dtype = args.pop("dtype", None)
    with pytest.raises(DataError, match=message):
        write_sparse_store(
            tmp_path / "s", **args, domain=small_domain, geography=geography, dtype=dtype
        )
    assert list(tmp_path.iterdir()) == []
    # an existing store survives a failed replacement
    old = write_sparse_store(tmp_path / "old", [1], [2], [3], small_domain, geography)
    with pytest.raises(DataError, match=message):
        write_sparse_store(
            tmp_path / "old",
            **args,
            domain=small_domain,
            geography=geography,
            dtype=dtype,
            overwrite=True,
        )
    np.testing.assert_array_equal(
        open_store(tmp_path / "old").to_dask().compute(), old.to_dask().compute()
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_existing_store_is_refused(tmp_path, small_domain, geography):
    write_sparse_store(tmp_path / "s", [0], [0], [1], small_domain, geography)
    with pytest.raises(StoreExistsError, match="already exists"):
        write_sparse_store(tmp_path / "s", [0], [0], [1], small_domain, geography)
    store = write_sparse_store(
        tmp_path / "s", [1], [1], [5], small_domain, geography, overwrite=True
    )
    assert store.rows(1, 2).sum() == 5


@pytest.mark.parametrize("lazy_input", [False, True])
def test_bad_dense_counts_leave_nothing(
    tmp_path, counts, small_domain, geography, entry_chunk, lazy_input
):
    bad = counts.copy()
    bad[23, 1, 2, 3] = -1
    bad[41, 0, 0, 0] = -4
    src = da.from_array(bad, chunks=(6, 2, 3, 4)) if lazy_input else bad
    with pytest.raises(DataError, match="negative value at geography row 23"):
        write_store(tmp_path / "s", src, small_domain, geography, layout="sparse")
    assert list(tmp_path.iterdir()) == []


# -- a domain of a billion cells: nothing may be densified -------------------


def test_billion_cell_domain_stays_sparse(tmp_path, rng):
    domain = Domain(a=1000, b=1000, c=1000)
    geo = Geography.from_geoids(["10", "11", "12", "20", "21"], {"s": 1, "t": 2})
    units = np.array([0, 0, 2, 2, 2, 3, 4, 4])
    cells = np.array([5, 999_999_999, 0, 123_456_789, 123_456_789, 7, 1, 2])
    values = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    store = write_sparse_store(tmp_path / "s", units, cells, values, domain, geo)
    assert store.nnz == 7 and store.counts.shape == (5, 1000, 1000, 1000)
    x = store.to_sparse((2, 0, 3)).compute()
    assert x.shape == (5, 10**9) and x.nnz == 7
    got = {(int(u), int(c)): int(v) for (u, c), v in zip(x.coords.T, x.data, strict=True)}
    assert got == {
        (0, 5): 1,
        (0, 999_999_999): 2,
        (2, 0): 3,
        (2, 123_456_789): 9,
        (3, 7): 6,
        (4, 1): 7,
        (4, 2): 8,
    }
    state = aggregate_sparse(store.to_sparse(), geo.ancestor_index("s"), (1, 1), "agg").compute()
    assert state.shape == (2, 10**9) and state[0, 999_999_999] == 2 and state[1, 1] == 7
    assert int(state.sum()) == int(values.sum())
    assert store.counts.coo(2, 3).nnz == 2


# -- opening ---------------------------------------------------------------


def test_open_refuses_broken_sparse_stores(tmp_path, counts, small_domain, geography):
    write_store(tmp_path / "s", counts, small_domain, geography, layout="sparse")
    group = zarr.open_group(str(tmp_path / "s"), mode="r+")
    meta = dict(group.attrs["dpdask"])
    group.attrs["dpdask"] = {**meta, "nnz": meta["nnz"] + 1}
    with pytest.raises(DataError, match="entries/unit has shape"):
        open_store(tmp_path / "s")
    group.attrs["dpdask"] = {**meta, "format_version": 3}
    with pytest.raises(DataError, match="version 3 is not supported"):
        open_store(tmp_path / "s")
    group.attrs["dpdask"] = meta
    group["entries/offsets"][-1] = 0
    with pytest.raises(DataError, match=r"entries/offsets run 0\.\.0"):
        open_store(tmp_path / "s")
    del group["entries/cell"]
    with pytest.raises(DataError, match="missing entries/cell"):
        open_store(tmp_path / "s")
