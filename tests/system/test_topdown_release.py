"""Top-down releases (``reconstruct="topdown"``) through the release graph.

Oracles: without noise every level is the truth; with noise, every estimate is
non-negative, each parent equals the sum of its children cell by cell, and with
``integer=True`` every estimate is an integer that adds up exactly; the children of a
parent are zero wherever the parent is zero (support inherited).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import zarr

from dpdask import Geography
from dpdask.dataflow._levels import level_chunks
from dpdask.dataflow.release import release
from dpdask.noise import SecretKey
from dpdask.pipeline.spec import SpecError, parse_spec
from tests.helpers import make_plan


def _truth(counts, store):
    geo = store.geography
    out = {}
    for lv in geo.levels:
        idx = geo.ancestor_index(lv) if lv != geo.levels[-1] else np.arange(counts.shape[0])
        t = np.zeros((geo.n_units(lv), *counts.shape[1:]))
        np.add.at(t, idx, counts)
        out[lv] = t
    return out


def _run(store, tmp_path, *, noise, integer, seed=3, chunk_bytes=8 * 6 * 2):
    st, counts = store
    rel = release(
        make_plan(), st, reconstruct="topdown", integer=integer, release_id="td",
        run_id=f"r{seed}", key=SecretKey.for_testing(seed), noise=noise, test_mode=True,
        chunk_bytes=chunk_bytes,
    )  # fmt: skip
    out = rel.to_zarr(tmp_path / f"td-{noise}-{integer}-{seed}.zarr")
    g = zarr.open_group(str(out), mode="r")
    return {lv: g[lv]["estimate"][:] for lv in st.geography.levels}, _truth(counts, st), st


@pytest.mark.parametrize("integer", [False, True])
def test_without_noise_every_level_is_the_truth(store, tmp_path, integer):
    """The fits stop at a hundredth of the noise (in noise units), so the fractional
    estimates are the truth to a small fraction of the noise scale; rounded, exactly."""
    est, truth, _ = _run(store, tmp_path, noise=False, integer=integer)
    tol = 0.0 if integer else 0.1 * make_plan().noise_scale
    for lv, t in truth.items():
        np.testing.assert_allclose(est[lv], t, rtol=0, atol=tol)


@pytest.mark.parametrize("seed", [1, 2])
def test_integer_estimates_add_up_exactly(store, tmp_path, seed):
    est, _, st = _run(store, tmp_path, noise=True, integer=True, seed=seed)
    geo = st.geography
    for lv in geo.levels:
        assert (est[lv] >= 0).all()
        np.testing.assert_array_equal(est[lv], np.rint(est[lv]))
    for i in range(1, len(geo.levels)):
        child, parent = geo.levels[i], geo.levels[i - 1]
        sums = np.zeros_like(est[parent])
        np.add.at(sums, geo.parents[i - 1], est[child])
        np.testing.assert_array_equal(sums, est[parent])  # exact, integers


def test_fractional_estimates_add_up_and_inherit_support(store, tmp_path):
    est, _, st = _run(store, tmp_path, noise=True, integer=False, seed=5)
    geo = st.geography
    for i in range(1, len(geo.levels)):
        child, parent = est[geo.levels[i]], est[geo.levels[i - 1]]
        assert (child >= 0).all()
        sums = np.zeros_like(parent)
        np.add.at(sums, geo.parents[i - 1], child)
        np.testing.assert_allclose(sums, parent, rtol=1e-9, atol=1e-9)
        zero = parent[geo.parents[i - 1]] == 0
        assert (child[zero] == 0).all()


@pytest.mark.parametrize("per_chunk", [1, 2, 3, 5])
def test_whole_family_chunks_never_split_a_parent(per_chunk):
    parents = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3, 3])
    geo = Geography(
        levels=("county", "tract"),
        ids=(tuple("abcd"), tuple(f"t{i}" for i in range(parents.size))),
        parents=(parents,),
    )
    lc = level_chunks(geo, geo.levels, 1, 8 * per_chunk, whole_families=True)
    bounds = np.cumsum((0, *lc.chunks[1]))
    assert bounds[-1] == parents.size
    for b in bounds[1:-1]:
        assert parents[b] != parents[b - 1]  # a family is never cut
    sizes = np.bincount(parents)
    for size, (a, b) in zip(lc.chunks[1], itertools.pairwise(bounds), strict=True):
        # a chunk is over the size only when it is one family that does not fit
        assert size <= per_chunk or np.unique(parents[a:b]).size == 1
    assert max(lc.chunks[1]) <= max(per_chunk, sizes.max())


def test_spec_reconstruct_topdown_integer(tmp_path):
    base = {
        "release": "r", "data": {"format": "synthetic", "geographies": 4, "states": 1},
        "domain": "pl94", "workload": "pl94", "privacy": {"zcdp": 1},
        "output": str(tmp_path / "o.zarr"),
    }  # fmt: skip
    spec = parse_spec({**base, "reconstruct": {"method": "topdown", "integer": True}}, tmp_path)
    assert (spec.reconstruct, spec.integer) == ("topdown", True)
    assert parse_spec({**base, "reconstruct": "topdown"}, tmp_path).integer is False
    with pytest.raises(SpecError, match="need method: topdown"):
        parse_spec({**base, "reconstruct": {"method": "ls", "integer": True}}, tmp_path)
    with pytest.raises(SpecError, match="unknown key"):
        parse_spec({**base, "reconstruct": {"method": "topdown", "round": 1}}, tmp_path)
