"""Level chunking, lazy aggregation and lazy tree consistency against NumPy oracles."""

from __future__ import annotations

import itertools

import dask.array as da
import numpy as np
import pytest

from dpdask.domain import Geography
from dpdask.graph._levels import (
    aggregate_level,
    bottom_up,
    level_chunks,
    partial_rows,
    partial_sum_block,
    top_down,
)
from dpdask.reconstruct import tree_consistent


def _geography(rng: np.random.Generator, n_county: int = 5) -> Geography:
    tracts_per = rng.integers(1, 7, size=n_county)
    p_county = np.zeros(n_county, dtype=int)
    p_tract = np.repeat(np.arange(n_county), tracts_per)
    return Geography(
        levels=("state", "county", "tract"),
        ids=(
            ("s",),
            tuple(f"c{i}" for i in range(n_county)),
            tuple(f"t{i}" for i in range(p_tract.size)),
        ),
        parents=(p_county, p_tract),
    )


@pytest.mark.parametrize("units_per_chunk", [1, 2, 3, 50])
def test_chunks_are_aligned(units_per_chunk: int, rng: np.random.Generator) -> None:
    geo = _geography(rng)
    lc = level_chunks(geo, geo.levels, cells=4, target_bytes=8 * 4 * units_per_chunk)
    for i, lv in enumerate(geo.levels):
        assert sum(lc.chunks[i]) == geo.n_units(lv)
    for i in (1, 2):
        # every chunk's parents lie inside a single chunk of the parent level
        bounds = np.cumsum((0, *lc.chunks[i]))
        pb = np.cumsum((0, *lc.chunks[i - 1]))
        p = lc.parents[i - 1]
        for a, b in itertools.pairwise(bounds):
            assert np.searchsorted(pb, p[a], "right") == np.searchsorted(pb, p[b - 1], "right")


@pytest.mark.parametrize("units_per_chunk", [1, 2, 4, 50])
def test_aggregate_sums_children(units_per_chunk: int, rng: np.random.Generator) -> None:
    geo = _geography(rng)
    lc = level_chunks(geo, geo.levels, cells=6, target_bytes=8 * 6 * units_per_chunk)
    x = rng.integers(0, 9, size=(geo.n_units(), 2, 3))
    county = aggregate_level(da.from_array(x, chunks=(2, 2, 3)), lc, 2, "aggregate-county")
    state = aggregate_level(county, lc, 1, "aggregate-state")
    p = geo.parents[1]
    want = np.stack([x[p == k].sum(0) for k in range(geo.n_units("county"))])
    np.testing.assert_array_equal(county.compute(), want)
    np.testing.assert_array_equal(state.compute(), x.sum(0)[None])
    assert county.chunks[0] == lc.chunks[1]
    assert county.dtype == x.dtype


@pytest.mark.parametrize("units_per_chunk", [1, 3, 50])
def test_lazy_consistency_matches_numpy(units_per_chunk: int, rng: np.random.Generator) -> None:
    geo = _geography(rng)
    lc = level_chunks(geo, geo.levels, cells=6, target_bytes=8 * 6 * units_per_chunk)
    est = [rng.normal(size=(geo.n_units(lv), 2, 3)) for lv in geo.levels]
    var = [
        np.array([0.7]),
        rng.uniform(1, 2, geo.n_units("county")),
        rng.uniform(1, 2, geo.n_units()),
    ]
    want, want_var = tree_consistent(est, var, geo.parents)
    lazy = [da.from_array(e, chunks=(c, 2, 3)) for e, c in zip(est, lc.chunks, strict=True)]
    final, fvar = top_down(*bottom_up(lazy, var, lc, "consistent-up"), lc, "consistent")
    for f, w in zip(final, want, strict=True):
        np.testing.assert_allclose(f.compute(), w, atol=1e-12)
    for f, w in zip(fvar, want_var, strict=True):
        np.testing.assert_allclose(f, w, atol=1e-12)


def test_unsorted_children_are_refused() -> None:
    geo = Geography(
        levels=("county", "tract"),
        ids=(("a", "b"), ("t0", "t1", "t2")),
        parents=(np.array([0, 1, 0]),),
    )
    with pytest.raises(ValueError, match="not sorted"):
        level_chunks(geo, geo.levels, cells=1)


def test_finest_level_must_be_released(rng: np.random.Generator) -> None:
    geo = _geography(rng)
    with pytest.raises(ValueError, match="finest released level"):
        level_chunks(geo, ("state", "county"), cells=1)


@pytest.mark.parametrize("units_per_chunk", [1, 2, 4, 50])
def test_stored_partial_sums_give_the_parent_sums(units_per_chunk, rng) -> None:
    """Per-chunk sums by parent (what a release checkpoints) combine to the parents' sums."""
    from dpdask.store._aggregate import aggregate_rows

    geo = _geography(rng)
    lc = level_chunks(geo, geo.levels, cells=6, target_bytes=8 * 6 * units_per_chunk)
    x = rng.normal(size=(geo.n_units(), 2, 3))
    bounds = np.cumsum((0, *lc.chunks[2]))
    parts = [
        partial_sum_block(x[a:b], lc, 2, k) for k, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    assert [len(p) for p in parts] == list(lc.parent_ranges(2))
    stacked = da.from_array(np.concatenate(parts), chunks=(lc.parent_ranges(2), 2, 3))
    got = aggregate_rows(stacked, partial_rows(lc, 2), lc.chunks[1], "sums")
    p = geo.parents[1]
    want = np.stack([x[p == k].sum(0) for k in range(geo.n_units("county"))])
    np.testing.assert_allclose(got.compute(), want, atol=1e-12)
    assert got.dtype == np.float64 and got.chunks[0] == lc.chunks[1]
