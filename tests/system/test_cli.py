"""The command line on the shipped PL94 Providence spec (run, plan, validate, failures)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence.yaml"


@pytest.fixture
def spec(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["output"] = str(tmp_path / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_validate_and_plan_spend_nothing(spec, tmp_path, capsys) -> None:
    assert main(["validate", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["units"]["block"] == 569
    assert main(["plan", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [lv["level"] for lv in plan["levels"]][-1] == "block"
    assert plan["queries"] == 319
    assert not (tmp_path / "out" / "ledger.sqlite").exists()
    assert not (tmp_path / "out" / "pl94.zarr").exists()


def test_run_publishes_and_refuses_to_overspend(spec, tmp_path, capsys) -> None:
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = pathlib.Path(summary["output"])
    g = zarr.open_group(str(out), mode="r")
    blocks, groups = g["block/estimate"][:], g["block_group/estimate"][:]
    sums = np.zeros_like(groups)
    np.add.at(sums, g["block/parent"][:], blocks)
    np.testing.assert_allclose(sums, groups, atol=1e-8)
    before = sorted(p.name for p in out.rglob("*"))
    # the whole budget is spent: a second run (even with --overwrite) is refused
    # before anything is read or written, and the published release is untouched
    assert main(["run", str(spec), "--json", "--no-progress", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "left" in err or "budget" in err
    assert sorted(p.name for p in out.rglob("*")) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workload": "nonsense"}, "workload"),
        ({"levels": ["state", "parish", "block"], "privacy": {"zcdp": 1}}, "parish"),
        ({"privacy": {"zcdp": -1}}, "privacy"),
        ({"domain": {"votingage": 2, "hisp": 2, "race": 62}}, "race"),
    ],
)
def test_bad_specs_fail_before_spending(spec, tmp_path, capsys, change, message) -> None:
    raw = yaml.safe_load(spec.read_text())
    raw.update(change)
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["validate", str(spec)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "ledger.sqlite").exists()
