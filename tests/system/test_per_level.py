"""Per-level workloads: ``workload: {levels: {level: workload, ...}}`` in a spec.

Each level's plan is selected for that level's workload with that level's share of
the budget; the ledger charges each level its share; the published answers of each
level are that level's workload (checked against the workload applied to the
published estimates, an independent product).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from dpdask.cli import main
from dpdask.pipeline.run import plan_spec
from dpdask.pipeline.spec import SpecError, parse_spec
from dpdask.privacy import Ledger, zCDP
from dpdask.workloads.named import build_workload


def _raw(tmp_path, **over):
    raw = {
        "release": "pl",
        "data": {"format": "synthetic", "geographies": 6, "states": 2, "seed": 3,
                 "population": 800},
        "domain": "pl94",
        "levels": ["state", "county"],
        "workload": {"levels": {"state": "pl94", "county": {"name": "marginals", "k": 1}}},
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 3}},
        "output": str(tmp_path / "out.zarr"),
        "ledger": {"path": str(tmp_path / "ledger.sqlite"), "create": True},
    }  # fmt: skip
    raw.update(over)
    return raw


def test_each_level_is_planned_for_its_workload_and_share(tmp_path):
    spec = parse_spec(_raw(tmp_path), tmp_path)
    plans, report = plan_spec(spec)
    assert set(plans) == {"state", "county"}
    for lv, share in (("state", zCDP("1/4")), ("county", zCDP("3/4"))):
        W = build_workload(spec.level_workload(lv), spec.domain)
        assert plans[lv].workload.shape == W.shape
        assert plans[lv].privacy == share
    assert [r["workload"] for r in report["levels"]] == ["pl94", "marginals"]


@pytest.mark.parametrize(
    "workload, match",
    [
        ({"levels": {"state": "pl94"}}, "one workload per released level"),
        ({"levels": {"state": "pl94", "county": "nope"}}, "workload.name"),
        ({"levels": {}}, "mapping of level"),
    ],
)
def test_bad_per_level_workloads_are_refused(tmp_path, workload, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_raw(tmp_path, workload=workload), tmp_path)


def test_order_of_the_per_level_mapping_does_not_matter(tmp_path):
    swapped = {"levels": {"county": {"name": "marginals", "k": 1}, "state": "pl94"}}
    spec = parse_spec(_raw(tmp_path, workload=swapped), tmp_path)
    assert list(spec.workload["levels"]) == ["state", "county"]
    assert spec.level_workload("county")["name"] == "marginals"


def test_per_level_workloads_need_levels(tmp_path):
    raw = _raw(tmp_path)
    del raw["levels"]
    raw["privacy"] = {"zcdp": 1}
    with pytest.raises(SpecError, match="need the spec's levels"):
        parse_spec(raw, tmp_path)


def test_run_charges_each_level_and_publishes_its_workload(tmp_path, capsys):
    import yaml

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_raw(tmp_path)))  # keys sorted: order is free
    assert main(["run", str(spec_path), "--json", "--run-id", "r1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"].endswith("out.zarr")
    charges = {c.level: c.privacy for c in Ledger(tmp_path / "ledger.sqlite").charges("pl")}
    assert charges == {"state": zCDP("1/4"), "county": zCDP("3/4")}
    g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    spec = parse_spec(_raw(tmp_path), tmp_path)
    for lv in ("state", "county"):
        W = build_workload(spec.level_workload(lv), spec.domain)
        est = g[lv]["estimate"][:]
        np.testing.assert_allclose(
            g[lv]["answers"][:], W.apply(est.reshape(est.shape[0], -1)), rtol=1e-9, atol=1e-6
        )


def test_each_level_gets_its_own_strategy(tmp_path):
    """``strategy: {levels: ...}``: every level is selected with its own strategy and
    options (oracle: dpdask.select called directly with that level's workload, budget
    share and strategy gives the same strategy operator)."""
    from dpdask.strategy import select

    raw = _raw(tmp_path, workload="pl94", strategy={"levels": {
        "state": {"name": "hdmm", "restarts": 2}, "county": "identity"}})  # fmt: skip
    spec = parse_spec(raw, tmp_path)
    assert spec.per_level and spec.level_strategy("county") == ("identity", {})
    plans, report = plan_spec(spec)
    assert [r["strategy"] for r in report["levels"]] == ["hdmm", "identity"]
    W = build_workload({"name": "pl94"}, spec.domain)
    direct = select(W, zCDP("3/4"), strategy="identity", domain=spec.domain)
    np.testing.assert_array_equal(plans["county"].strategy.dense(), direct.strategy.dense())
    assert plans["county"].privacy == zCDP("3/4")
    assert plans["state"].strategy.shape != plans["county"].strategy.shape


@pytest.mark.parametrize(
    "strategy, match",
    [
        ({"levels": {"state": "hdmm"}}, "one strategy per released level"),
        ({"levels": {"state": "hdmm", "county": "nope"}}, "strategy.levels.county"),
        ({"levels": {"state": "hdmm", "county": {"name": "hdmm", "bogus": 1}}},
         "strategy.levels.county"),
        ({"levels": {}}, "mapping of level"),
        ({"levels": {"state": "hdmm", "county": "hdmm"}, "name": "hdmm"}, "unknown key"),
    ],
)  # fmt: skip
def test_bad_per_level_strategies_are_refused(tmp_path, strategy, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_raw(tmp_path, strategy=strategy), tmp_path)


def test_a_changed_level_strategy_changes_the_spec_print(tmp_path):
    from dpdask.pipeline._resume import spec_print

    one = parse_spec(_raw(tmp_path, strategy={"levels": {"state": "hdmm", "county": "hdmm"}}),
                     tmp_path)  # fmt: skip
    two = parse_spec(
        _raw(tmp_path, strategy={"levels": {"state": "hdmm", "county": "identity"}}), tmp_path
    )
    assert spec_print(one) != spec_print(two)


@pytest.mark.parametrize("layout", ["dense", "sparse", "auto"])
def test_synthetic_data_layout(tmp_path, layout):
    """``data.layout`` chooses how converted data is stored; the counts are the same
    (oracle: the dense store of the same spec, read row by row)."""
    from dpdask.pipeline.run import load_data

    def store_of(lay, where):
        raw = _raw(tmp_path)
        raw["data"] = {**raw["data"], "layout": lay}
        return load_data(parse_spec(raw, tmp_path), tmp_path / where)

    got, dense = store_of(layout, "w1"), store_of("dense", "w2")
    assert dense.layout == "dense"
    if layout != "auto":
        assert got.layout == layout
    n = got.geography.n_units()
    np.testing.assert_array_equal(got.rows(0, n), dense.rows(0, n))


def test_bad_data_layout_is_refused(tmp_path):
    raw = _raw(tmp_path)
    raw["data"] = {**raw["data"], "layout": "columnar"}
    with pytest.raises(SpecError, match=r"data\.layout"):
        parse_spec(raw, tmp_path)
