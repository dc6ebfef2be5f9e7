"""``dpdask bench topdown``: synthetic hierarchies, populations, streaming errors, the JSON.

Oracles: the streaming per-level errors (:func:`level_errors`, chunk by chunk) equal a
dense computation on a tiny store (densified, summed with ``np.add.at``, answered with
``W.dense()``), sparse or dense store, one chunk or many; a release without noise has
no error; the command's JSON has the keys issue 24 names. No timing is asserted.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import zarr
from dpdask_benchmarks import _topdown_data as data
from dpdask_benchmarks._topdown_data import (
    hierarchy,
    level_errors,
    parse_fanout,
    parse_workload,
    spread_populations,
)

from dpdask.census import pl94_domain
from dpdask.cli import main
from dpdask.graph import release
from dpdask.noise import SecretKey
from dpdask.privacy import split_levels, zCDP
from dpdask.store import synthetic_store
from dpdask.strategy import select
from dpdask.workloads.named import build_workload

LEVELS = ("state", "county", "tract", "block")


# -- the hierarchy and the populations --------------------------------------------------
@pytest.mark.parametrize(
    ("fanout", "n", "units"),
    [
        (None, 25, (1, 3, 25)),
        ("*,10", 600, (1, 60, 600)),
        ("2,3", 40, (7, 13, 40)),
        ("61.63,23.26", 73_117, (51, 3143, 73_117)),
    ],
)
def test_hierarchy_counts_ids_and_contiguous_children(fanout, n, units) -> None:
    levels = ["state", "county", "tract"]
    geo = hierarchy(levels, parse_fanout(fanout, 3), n)
    assert tuple(geo.n_units(lv) for lv in levels) == units
    for i, ids in enumerate(geo.ids):
        assert list(ids) == sorted(ids)  # GEOID-like: zero-padded, sorted
        assert len({len(u) for u in ids}) == 1
        if i:
            parent = geo.parents[i - 1]
            assert (np.diff(parent) >= 0).all()  # children contiguous under their parent
            above = geo.ids[i - 1]
            assert all(u.startswith(above[p]) for u, p in zip(ids, parent, strict=True))
            sizes = np.bincount(parent)
            assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1  # shared out evenly


def test_fanout_and_workload_parsing() -> None:
    assert parse_fanout(None, 1) == [] and parse_fanout(None, 4) == [None, 10.0, 10.0]
    assert parse_fanout("*,2.5", 3) == [None, 2.5]
    for bad in ("3", "1,0.5", "2,*", "a,2"):
        with pytest.raises(ValueError, match="--fanout"):
            parse_fanout(bad, 3)
    assert parse_workload("marginals:k=2") == {"name": "marginals", "k": 2}
    assert parse_workload('{"name": "marginals", "k": 1}') == {"name": "marginals", "k": 1}
    assert parse_workload("sf1-persons") == {"name": "sf1-persons"}
    with pytest.raises(ValueError, match="key=value"):
        parse_workload("marginals:k")


@pytest.mark.parametrize(("sigma", "empty"), [(0.5, 0.0), (1.0, 0.3), (0.0, 0.9)])
def test_spread_populations_add_up(sigma, empty) -> None:
    p = spread_populations(2000, 81_234, sigma=sigma, empty=empty, seed=4)
    assert p.dtype == np.int64 and int(p.sum()) == 81_234 and (p >= 0).all()
    assert abs((p == 0).mean() - empty) < 0.05
    again = spread_populations(2000, 81_234, sigma=sigma, empty=empty, seed=4)
    np.testing.assert_array_equal(p, again)
    assert int(spread_populations(5, 0).sum()) == 0


# -- the streaming errors against a dense oracle ------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A tiny PL94 store (4 levels, 48 blocks, a quarter empty) released with per-level
    plans (P.L. 94 above, one-way marginals at the blocks), with noise and without."""
    root = tmp_path_factory.mktemp("topdown-bench")
    domain = pl94_domain()
    geo = hierarchy(LEVELS, parse_fanout("*,3,4", 4), 48)
    pops = spread_populations(48, 3000, sigma=1.0, empty=0.25, seed=3)
    stores = {
        layout: synthetic_store(
            root / f"{layout}.zarr", domain, geo, population=pops, seed=3, layout=layout
        )
        for layout in ("sparse", "dense")
    }
    specs = {lv: {"name": "pl94"} for lv in LEVELS} | {"block": {"name": "marginals", "k": 1}}
    budgets = split_levels(zCDP(1), LEVELS, [1, 1, 1, 2])
    plans = {
        lv: select(build_workload(specs[lv], domain), budgets[lv], domain=domain) for lv in LEVELS
    }
    workloads = {lv: p.workload for lv, p in plans.items()}
    outputs = {}
    for method in ("ls", "topdown"):
        rel = release(
            plans, stores["sparse"], reconstruct=method, release_id="t", run_id="r1",
            test_mode=True, key=SecretKey.for_testing(1),
        )  # fmt: skip
        outputs[method] = rel.to_zarr(root / f"out-{method}.zarr")
    one = select(build_workload({"name": "pl94"}, domain), zCDP(1), domain=domain)
    exact = release(
        one, stores["sparse"], release_id="t", run_id="r0", test_mode=True, noise=False,
        key=SecretKey.for_testing(1),
    ).to_zarr(root / "out-exact.zarr")  # fmt: skip
    return stores, workloads, outputs, exact, one.workload


def _dense_errors(store, workloads, outputs):
    geo = store.geography
    counts = np.asarray(store.to_dask().compute(), dtype=np.float64).reshape(geo.n_units(), -1)
    out = {}
    for lv in geo.levels:
        t = np.zeros((geo.n_units(lv), counts.shape[1]))
        np.add.at(t, geo.ancestor_index(lv), counts)
        truth = t @ workloads[lv].dense().T
        out[lv] = {
            k: float(((zarr.open_group(str(p), mode="r")[lv]["answers"][:] - truth) ** 2).sum())
            for k, p in outputs.items()
        }
    return out


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("entries", [None, 40])
def test_streaming_errors_equal_a_dense_computation(small, layout, entries, monkeypatch):
    stores, workloads, outputs, _, _ = small
    store = stores[layout]
    if entries is not None:  # many small truth chunks, at every level
        monkeypatch.setattr(data, "TRUTH_ENTRIES", entries)
    got = level_errors(store, workloads, outputs)
    want = _dense_errors(store, workloads, outputs)
    geo = store.geography
    counts = np.asarray(store.to_dask().compute()).reshape(geo.n_units(), -1)
    for lv in LEVELS:
        for method in outputs:
            assert got[lv]["sse"][method] > 0
            assert got[lv]["sse"][method] == pytest.approx(want[lv][method], rel=1e-9)
        assert got[lv]["values"] == geo.n_units(lv) * workloads[lv].shape[0]
        t = np.zeros((geo.n_units(lv), counts.shape[1]), dtype=np.int64)
        np.add.at(t, geo.ancestor_index(lv), counts)
        assert got[lv]["entries"] == np.count_nonzero(t)
    if layout == "sparse":
        assert got["block"]["entries"] == store.nnz


def test_streaming_errors_of_an_exact_release_are_zero(small):
    stores, _, _, exact, W = small
    got = level_errors(stores["sparse"], dict.fromkeys(LEVELS, W), {"exact": exact})
    for lv in LEVELS:
        rmse = math.sqrt(got[lv]["sse"]["exact"] / got[lv]["values"])
        assert rmse < 1e-6, (lv, rmse)


def test_streaming_errors_refuse_answers_of_another_shape(small):
    stores, workloads, outputs, _, _ = small
    other = dict(workloads, block=workloads["state"])
    with pytest.raises(ValueError, match="block/answers: shape"):
        level_errors(stores["sparse"], other, outputs)


# -- the command -------------------------------------------------------------------------
def test_bench_topdown_json(tmp_path, capsys) -> None:
    argv = [
        "bench", "topdown", "--json", "--geographies", "60",
        "--levels", "state,county,tract,block_group,block", "--fanout", "*,2,3,5",
        "--persons", "3000", "--spread", "1", "--empty", "0.3",
        "--level-workload", "block=marginals:k=1", "--methods", "ls,nnls,topdown",
        "--workers", "1", "--workdir", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    levels = ["state", "county", "tract", "block_group", "block"]
    assert result["levels"] == levels
    assert result["units"] == {"state": 1, "county": 2, "tract": 4, "block_group": 12,
                               "block": 60}  # fmt: skip
    assert result["persons"] == 3000 and result["cells"] == 60 * 252
    assert 0 < result["entries"] <= 3000 and result["layout"] == "sparse"
    assert result["plans"] == "per level"
    assert result["budget_shares"] == {"state": 1, "county": 1, "tract": 1, "block_group": 1,
                                       "block": 2}  # fmt: skip
    assert result["workloads"]["block"] == {"name": "marginals", "k": 1}
    assert list(result["strategies"]) == levels and result["queries"]["block"] == 67
    assert result["data_generation_s"] >= 0 and result["data_reused"] is False
    assert result["ratio_topdown_over_ls"] > 0 and result["ratio_nnls_over_ls"] > 0
    assert [r["reconstruct"] for r in result["runs"]] == ["ls", "nnls", "topdown"]
    for run in result["runs"]:
        assert {"wall_s", "peak_worker_rss_gib", "task_seconds", "truth_s"} <= set(run)
    assert [row["level"] for row in result["accuracy"]] == levels
    for row in result["accuracy"]:
        for key in ("rmse_topdown", "rmse_bottomup_nnls", "rmse_ls"):
            assert math.isfinite(row[key]) and row[key] >= 0, (row, key)
    # the store is kept in --workdir and reused, the releases are not kept
    assert [p.name.startswith("store-") for p in tmp_path.iterdir()] == [True]


def test_bench_topdown_refuses_an_unknown_level(capsys) -> None:
    assert main(["bench", "topdown", "--level-workload", "block=marginals"]) != 0
    assert "--level-workload: no level 'block'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "topdown", "--level-workload", "marginals"])
    assert "LEVEL=NAME" in capsys.readouterr().err


def test_a_store_in_workdir_is_reused(tmp_path) -> None:
    import argparse

    from dpdask_benchmarks import topdown

    parser = argparse.ArgumentParser()
    topdown.add_arguments(parser)
    args = parser.parse_args(["--geographies", "30", "--persons", "900", "--seed", "2"])
    domain, geo, specs, shares = topdown._setup(args)
    assert shares == [1, 1, 2] and specs["tract"] == {"name": "pl94"}
    store, pops, t_data = topdown._data(tmp_path, args, domain, geo)
    assert t_data is not None and int(pops.sum()) == 900 == int(store.to_dask().sum().compute())
    again, _, t_again = topdown._data(tmp_path, args, domain, geo)
    assert t_again is None and again.path == store.path
    other = parser.parse_args(["--geographies", "30", "--persons", "900", "--seed", "3"])
    assert topdown._data(tmp_path, other, domain, geo)[0].path != store.path
