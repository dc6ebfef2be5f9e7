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
from dpdask.graph import release
from dpdask.graph._levels import level_chunks
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


def _published(store, tmp_path, name, *, integer=True, seed=7, run_id="e", **kw):
    st, _ = store
    rel = release(
        make_plan(), st, reconstruct="topdown", integer=integer, release_id="td",
        run_id=run_id, key=SecretKey.for_testing(seed), test_mode=True, chunk_bytes=8 * 6 * 2,
        **kw,
    )  # fmt: skip
    return rel.to_zarr(tmp_path / name)


def test_entries_layout_publishes_the_same_release(store, tmp_path, monkeypatch):
    """A level published as entries is the dense layout's estimate exactly (oracle: the
    same release, same key, published dense), read back through open_release; answers
    are the workload applied to the estimates (an independent dense product) and the
    variances are the level's own, once per query."""
    from dpdask import open_release
    from dpdask.graph import _output_sparse

    dense = zarr.open_group(str(_published(store, tmp_path, "dense.zarr")), mode="r")
    monkeypatch.setattr(_output_sparse, "DENSE_ESTIMATE_CELLS", 0)
    path = _published(store, tmp_path, "entries.zarr")
    sparse_g = zarr.open_group(str(path), mode="r")
    tree = open_release(path)
    plan = make_plan()
    Wd = plan.workload.dense()
    for lv in store[0].geography.levels:
        g = sparse_g[lv]
        assert g.attrs["estimate_layout"] == "entries" and g["estimate"].ndim == 1
        offsets = g["entry_offsets"][:]
        rows = g["entry_geography"][:]
        assert offsets[0] == 0 and offsets[-1] == rows.size and np.all(np.diff(offsets) >= 0)
        assert np.array_equal(np.repeat(np.arange(offsets.size - 1), np.diff(offsets)), rows)
        assert (g["estimate"][:] != 0).all()  # only non-zero cells are entries
        want = dense[lv]["estimate"][:]
        got = tree[lv].dataset["estimate"].data.compute().todense()
        np.testing.assert_array_equal(got, want)
        flat = want.reshape(want.shape[0], -1)
        np.testing.assert_allclose(g["answers"][:], flat @ Wd.T, rtol=1e-12, atol=1e-9)
        np.testing.assert_array_equal(g["answers"][:], dense[lv]["answers"][:])
        assert g["variance"].shape == (Wd.shape[0],)
        np.testing.assert_allclose(g["variance"][:], dense[lv]["variance"][:])
        assert tree[lv].dataset["moe90"].dims == ("workload_query",)


def test_export_broadcasts_the_level_variance(store, tmp_path):
    from dpdask.publish.reader import release_table

    path = _published(store, tmp_path, "t.zarr")
    g = zarr.open_group(str(path), mode="r")["tract"]
    table = release_table(path, "tract")
    n_units, n_q = g["answers"].shape
    assert len(table) == n_units * n_q
    var = np.tile(g["variance"][:], n_units)
    np.testing.assert_array_equal(table["variance"].to_numpy(), var)
    np.testing.assert_allclose(table["moe90"].to_numpy(), 1.645 * np.sqrt(var))


def test_interrupted_run_resumes_bit_for_bit(store, tmp_path, monkeypatch):
    """A run stopped after some chunks (a fit that raises, as a crash would) resumes with
    the same run id: the chunks marked done are loaded, the others measured again with
    the same noise, and the release is the uninterrupted one, byte for byte."""
    from dpdask.graph import _topdown_blocks

    # simulate=0: the simulation of the error re-runs family_block on published output
    whole = zarr.open_group(str(_published(store, tmp_path, "whole.zarr", simulate=0)), mode="r")
    real = _topdown_blocks.family_block
    calls = {"n": 0}

    def crash_late(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    import dpdask.graph._topdown as td

    monkeypatch.setattr(td, "family_block", crash_late)
    with pytest.raises(RuntimeError, match="killed"):
        _published(store, tmp_path, "resumed.zarr", simulate=0)
    work = next(tmp_path.glob(".resumed.zarr.run-*"))
    done = {p.name for p in (work / "done").iterdir()}
    geo = store[0].geography
    rel = release(make_plan(), store[0], reconstruct="topdown", test_mode=True,
                  key=SecretKey.for_testing(7), chunk_bytes=8 * 6 * 2)  # fmt: skip
    chunks = {f"{L.name}-{k}" for L in rel.released for k in range(len(L.chunks))}
    assert 0 < len(done) < len(chunks) and done <= chunks
    redone = {"n": 0}

    def counted(*args, **kwargs):
        redone["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(td, "family_block", counted)
    resumed = zarr.open_group(
        str(_published(store, tmp_path, "resumed.zarr", simulate=0)), mode="r"
    )
    top = {f"{geo.levels[0]}-{k}" for k in range(len(rel.released[0].chunks))}
    assert redone["n"] == len(chunks - done - top)  # only the chunks not done
    for lv in store[0].geography.levels:
        for name in ("estimate", "answers", "variance"):
            np.testing.assert_array_equal(resumed[lv][name][:], whole[lv][name][:])


def test_sparse_store_gives_the_dense_stores_release(store, tmp_path):
    """The same counts stored sparse (format 2, read as sparse.COO blocks and summed up
    the hierarchy without densifying) give the same release, byte for byte."""
    from dpdask.store import write_store

    st, counts = store
    sparse_st = write_store(
        tmp_path / "sparse.zarr", counts, st.domain, st.geography, layout="sparse"
    )
    assert sparse_st.layout == "sparse"
    a = zarr.open_group(str(_published(store, tmp_path, "dense-in.zarr")), mode="r")
    b = zarr.open_group(str(_published((sparse_st, counts), tmp_path, "sparse-in.zarr")), mode="r")
    for lv in st.geography.levels:
        for name in ("estimate", "answers", "variance"):
            np.testing.assert_array_equal(b[lv][name][:], a[lv][name][:])


def test_per_level_strategies_on_a_large_domain_build_without_dense_grams(tmp_path):
    """Top-down with a different strategy per level never forms a level's dense Gram (the
    tree model's unit variances are a bottom-up matter): a 4-million-cell domain, whose
    Gram MemoryError guards, builds its release."""
    from dpdask import Domain
    from dpdask.linalg import Identity, Kron, Total, VStack
    from dpdask.privacy import zCDP
    from dpdask.store import write_sparse_store
    from tests.helpers import DensePlan

    dom = Domain(a=2000, b=2000)
    geo = Geography(levels=("s", "c"), ids=(("s",), ("c0", "c1")), parents=(np.zeros(2, int),))
    st = write_sparse_store(
        tmp_path / "in.zarr", np.array([0, 1]), np.array([5, 7]), np.array([3, 4]), dom, geo
    )
    marg = VStack([Kron([Identity(2000), Total(2000)]), Kron([Total(2000), Identity(2000)])])
    full = VStack([Kron([Identity(2000), Identity(2000)]), marg])
    plans = {
        lv: DensePlan(A, A, dom, "gaussian", zCDP(1).gaussian_sigma(A.sensitivity(2)), zCDP(1))
        for lv, A in (("s", full), ("c", marg))
    }
    rel = release(plans, st, reconstruct="topdown", test_mode=True, key=SecretKey.for_testing(1))
    assert [L.name for L in rel.released] == ["s", "c"]
