"""``dpdask bench census --part compare`` (issue 33) on a tiny synthetic state.

Oracles: the state and its empty blocks drawn again in memory
(:func:`dpdask.datasets.synthetic_pl94_blocks`, :func:`dpdask.store.block_geography`);
the Bureau's noise per level from its closed form ``1 / (2 rho l q)`` and the facts
sheet's shares; the invariants and constraints (the state total exact, nobody in a block
with no housing unit and no facility) in the multi-pass releases. No timing is asserted,
nor which estimator wins.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpdask.cli import main
from dpdask.datasets import synthetic_pl94_blocks
from dpdask.store import block_geography
from dpdask.strategy.tda2020 import LEVEL_SHARES, PERSONS_RHO_ADD_REMOVE, QUERY_SHARES

BLOCKS, PERSONS = 40, 1500
METHODS = ["ls", "topdown", "multipass", "multipass-int"]
LEVELS = ["state", "tract", "block"]  # three of the data's five: a quicker test


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    work = tmp_path_factory.mktemp("census-compare")
    argv = [
        "bench", "census", "--json", "--part", "compare", "--blocks", str(BLOCKS),
        "--persons", str(PERSONS), "--keys", "1", "--plans", "tda-2020",
        "--methods", ",".join(reversed(METHODS)), "--workers", "1", "--workdir", str(work),
        "--levels", *LEVELS,
    ]  # fmt: skip
    return argv, work


def test_compare_json_structure_and_invariants(compare, capsys) -> None:
    argv, work = compare
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    geo = block_geography(BLOCKS)
    levels = LEVELS
    assert result["part"] == "compare" and result["levels"] == levels
    assert result["units"] == {lv: geo.n_units(lv) for lv in levels}
    blocks = synthetic_pl94_blocks(BLOCKS, PERSONS, seed=0)
    empty = (blocks.housing_units == 0) & (blocks.facilities.sum(axis=1) == 0)
    assert result["persons"] == int(blocks.counts.sum()) == PERSONS
    assert result["empty_blocks"] == int(empty.sum()) > 0  # the test has empty blocks
    assert result["invariants"]["invariants"] == {
        "state": ["total"], "block": ["housing_units", "gq_facilities"],
    }  # fmt: skip
    # one row per method (in the benchmark's order), key and plan
    runs = result["runs"]
    assert [(r["plan"], r["method"], r["key"]) for r in runs] == [
        ("tda-2020", m, 0) for m in METHODS
    ]
    for r in runs:
        assert r["wall_s"] > 0
        for lv in levels:
            assert math.isfinite(r[f"mae_{lv}"]) and 0 <= r[f"mae_{lv}"] <= r[f"rmse_{lv}"] + 1e-9
        if r["method"].startswith("multipass"):  # the invariants and the constraint hold
            assert abs(r["state_total_error"]) < 1e-6
            assert r["mae_state"] < 1e-6
            assert abs(r["empty_block_persons"]) < 1e-6 and r["empty_blocks_filled"] == 0
    by = {r["method"]: r for r in runs}
    assert by["multipass-int"]["state_total_error"] == 0
    assert by["multipass-int"]["empty_block_persons"] == 0
    gap = by["multipass-int"]["block_vs_fractional"]
    assert 0 <= gap <= 1 + 1e-9  # the rounder keeps every block total within 1 of its fit
    assert "block_vs_fractional" not in by["multipass"]
    # per level: the Bureau's noise beside the medians (one key: the run's own figure)
    rho = PERSONS_RHO_ADD_REMOVE
    assert [(a["plan"], a["level"]) for a in result["accuracy"]] == [
        ("tda-2020", lv) for lv in levels
    ]
    for a in result["accuracy"]:
        lv = a["level"]
        var = 1 / (2 * float(rho * LEVEL_SHARES[lv] * QUERY_SHARES[lv]["total"]))
        assert a["sd_total_tda"] == pytest.approx(math.sqrt(var), rel=1e-9)
        # the plan's noise as the release draws it: the discrete Gaussian of a scale
        # rounded up to the sampler's grid, within 0.5% of the closed form
        assert a["sd_total_plan"] == pytest.approx(a["sd_total_tda"], rel=5e-3)
        for m in METHODS:
            assert a[f"mae_{m}"] == by[m][f"mae_{lv}"]
        best = min(a["mae_ls"], a["mae_topdown"])
        assert a["multipass_ok"] is (max(a["mae_multipass"], a["mae_multipass-int"]) <= best)
    assert result["verdict"] is all(a["multipass_ok"] for a in result["accuracy"])
    assert [(s["plan"], s["method"]) for s in result["methods"]] == [
        ("tda-2020", m) for m in METHODS
    ]
    assert np.isfinite([s["wall_s_median"] for s in result["methods"]]).all()
    for r in runs:  # sampled resident memory: a worker's and this process's, both non-zero
        assert 0 < r["peak_worker_rss_gib"] < 64 and 0 < r["peak_client_rss_gib"] < 64
    # the state is kept in --workdir for the next run, the releases are not
    assert not (work / "out.zarr").exists()
    assert any((work / "work").iterdir())


def test_compare_refuses_unknown_methods_before_any_work(tmp_path, capsys) -> None:
    argv = ["bench", "census", "--part", "compare", "--methods", "ls,nope",
            "--workdir", str(tmp_path)]  # fmt: skip
    assert main(argv) != 0
    assert "--methods: ['nope'] not among" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_linear_part_models_the_same_state(compare, capsys) -> None:
    """``--part linear`` on the compare's state (its data reused or drawn again): the
    tree and empty blocks of the data, the Bureau's closed-form noise, the invariant's
    exact top level (the models themselves: ``tests/unit/test_census_linear.py``)."""
    _argv, work = compare
    argv = [
        "bench", "census", "--json", "--part", "linear", "--blocks", str(BLOCKS),
        "--persons", str(PERSONS), "--plans", "tda-2020", "--trials", "200",
        "--workdir", str(work), "--levels", *LEVELS,
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    geo = block_geography(BLOCKS)
    blocks = synthetic_pl94_blocks(BLOCKS, PERSONS, seed=0)
    empty = (blocks.housing_units == 0) & (blocks.facilities.sum(axis=1) == 0)
    assert result["units"] == {lv: geo.n_units(lv) for lv in LEVELS}
    assert result["empty_blocks"] == int(empty.sum()) and result["max_total"] == PERSONS
    rows = result["accuracy"]
    assert [r["level"] for r in rows] == LEVELS
    rho = PERSONS_RHO_ADD_REMOVE
    for r in rows:
        var = 1 / (2 * float(rho * LEVEL_SHARES[r["level"]] * QUERY_SHARES[r["level"]]["total"]))
        assert r["sd_total_plan"] == pytest.approx(math.sqrt(var), rel=5e-3)  # as drawn
        assert r["sd_total_rows"] == pytest.approx(r["sd_total_plan"], rel=1e-9)
        assert r["sd_total_ls"] <= r["sd_total_rows"] * (1 + 1e-9)  # all rows, at most
        for m in ("ls", "multipass"):
            assert 0 <= r[f"mae_{m}"] <= r[f"rmse_{m}"] + 1e-12
        assert r["model_holds"] is (r["level"] != LEVELS[-1])
    assert rows[0]["mae_multipass"] == 0 and rows[0]["mae_ls"] > 0  # the state invariant
