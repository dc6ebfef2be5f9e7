"""``invariants:`` and ``constraints:`` through the command line, with the real key-file
path and a real ledger: the plan states which counts are published without noise; a
spec no estimator can honour, or whose invariants the public input makes infeasible, is
refused before anything is charged or written; a charged run's ledger entry states them.

Only ``reconstruct: topdown`` honours them (:data:`dpdask.pipeline.invariants.HONOURED_BY`):
the charged run is the shipped Providence spec itself, its output checked against the
file (the state total exact, the empty blocks empty).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from dpdask.cli import main
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence-invariants.yaml"
DATA = ROOT / "examples" / "data" / "pl94_providence"


def _spec(
    tmp_path: pathlib.Path, name: str = "inv", *, create: bool = True, **changes
) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(DATA)
    raw["levels"] = ["state", "tract", "block"]
    raw["privacy"] = {"zcdp": 1, "split": {"state": 1, "tract": 1, "block": 2}}
    raw["output"] = str(tmp_path / name / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite"), "create": create}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    raw.update(changes)
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _ledger_bytes(tmp_path: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(tmp_path.glob("ledger.sqlite*"))}


def test_the_shipped_spec_validates(tmp_path, capsys):
    """The Providence file's state total, block housing units and empty blocks agree."""
    shipped = yaml.safe_load(SPEC.read_text())
    spec = _spec(tmp_path, levels=shipped["levels"], privacy=shipped["privacy"])
    assert main(["validate", str(spec), "--json"]) == 0
    report = _json(capsys)
    assert report["ok"] and report["units"]["block"] > 0
    assert report["invariants"]["invariants"] == {"state": ["total"], "block": ["housing_units"]}
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "inv").exists()


def test_plan_moves_the_one_countys_budget_from_the_files_header(tmp_path, capsys):
    """The shipped spec's spine: ``dpdask plan`` reads the file's geographic header
    (public) and states the budgets the run charges, the county's moved to the state."""
    from dpdask.store import read_pl94_file

    shipped = yaml.safe_load(SPEC.read_text())
    assert shipped["reconstruct"]["spine"] is True
    spec = _spec(tmp_path, levels=shipped["levels"], privacy=shipped["privacy"])
    assert main(["plan", str(spec), "--json"]) == 0
    report = _json(capsys)
    rows = {row["level"]: row for row in report["levels"]}
    assert read_pl94_file(DATA).geography.n_units("county") == 1  # the oracle: one county
    assert rows["county"]["spine"]["budget_moved_to"] == "state"
    assert rows["county"]["budget"]["rho"] == "0"
    assert rows["state"]["budget"]["rho"] == "1/3"  # its 1/6 and the county's
    assert rows["block"]["budget"]["rho"] == "1/3" and "spine" not in report
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "inv").exists()


def test_plan_lists_the_invariants(tmp_path, capsys):
    spec = _spec(tmp_path)
    assert main(["plan", str(spec), "--json"]) == 0
    st = _json(capsys)["invariants"]
    assert st["invariants"] == {"state": ["total"], "block": ["housing_units"]}
    assert st["constraints"] == {"empty_units": {"facilities": "gq_population"}}
    assert main(["plan", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "published exactly (invariants, no noise" in text
    assert "state: total; block: housing_units" in text
    assert "constraints: empty_units (facilities gq_population)" in text
    assert "lattice: the run sizes it for the published state total" in text
    assert not (tmp_path / "ledger.sqlite").exists()


@pytest.mark.parametrize("verb", ["validate", "run"])
def test_an_estimator_that_does_not_honour_them_is_refused(tmp_path, capsys, verb):
    assert main(["ledger", "init", str(tmp_path / "ledger.sqlite")]) == 0
    capsys.readouterr()
    before = _ledger_bytes(tmp_path)
    spec = _spec(tmp_path, create=False, reconstruct="nnls")
    args = [verb, str(spec), "--json"] + (["--no-progress"] if verb == "run" else [])
    assert main(args) == 2
    refusal = _json(capsys)
    assert refusal["kind"] == "invalid" and refusal["error"] == "SpecError"
    assert refusal["message"].startswith("reconstruct: 'nnls' does not honour invariants")
    assert _ledger_bytes(tmp_path) == before
    assert not (tmp_path / "inv").exists()


def test_infeasible_invariants_are_refused_before_any_charge(tmp_path, capsys):
    """Nobody may be counted anywhere, yet the state's total is published exactly."""
    assert main(["ledger", "init", str(tmp_path / "ledger.sqlite")]) == 0
    capsys.readouterr()
    before = _ledger_bytes(tmp_path)
    nobody = [{"level": "block", "mask": {"votingage": [0, 1]}, "upper": 0}]
    spec = _spec(tmp_path, create=False, constraints={"cells": nobody})
    for args in (["validate", str(spec)], ["run", str(spec), "--no-progress"]):
        assert main([*args, "--json"]) == 2
        refusal = _json(capsys)
        assert refusal["error"] == "DataError" and refusal["kind"] == "invalid"
        assert refusal["message"].startswith("state 44: total must be in [")
        assert "every cell bounded to 0" in refusal["message"]
        assert _ledger_bytes(tmp_path) == before
        assert not (tmp_path / "inv").exists()
    assert main(["ledger", "show", str(tmp_path / "ledger.sqlite"), "--json"]) == 0
    assert _json(capsys)["releases"] == {}


def test_an_attribute_the_data_does_not_carry_is_refused(tmp_path, capsys):
    import numpy as np

    from dpdask.census import pl94_domain
    from dpdask.domain import Geography
    from dpdask.store import write_store

    geo = Geography.from_geoids(["4401", "4402"], {"state": 2, "tract": 3, "block": 4})
    dom = pl94_domain()
    write_store(tmp_path / "store", np.zeros((2, *dom.shape), dtype=np.int64), dom, geo)
    spec = _spec(tmp_path, data={"format": "store", "path": str(tmp_path / "store")},
                 constraints=None)  # fmt: skip
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "invariants.block: the data carries no unit attribute 'housing_units'" in err
    spec = _spec(tmp_path, data={"format": "store", "path": str(tmp_path / "store")},
                 invariants={"state": ["total"]})  # fmt: skip
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "constraints.empty_units: the data carries no unit attribute 'gq_population'" in err
    spec = _spec(tmp_path, invariants={"block": ["occupied_units"]})
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "invariants.block" in err and "'occupied_units' is not one of" in err
    assert not (tmp_path / "ledger.sqlite").exists()


def test_ledger_show_states_the_invariants_of_a_charged_run(tmp_path, capsys):
    """The real path: key file, ledger, top-down fit under the constraints."""
    import numpy as np
    import zarr

    from dpdask.store import read_pl94_file

    spec = _spec(tmp_path)
    assert main(["plan", str(spec), "--json"]) == 0
    planned = _json(capsys)["levels"]
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = _json(capsys)
    truth = read_pl94_file(DATA)
    # the lattice is sized for the published state total, so no level draws more noise
    # than the plan (sized for the default bound) said
    assert summary["max_total"] == int(truth.counts.sum())
    for ran, plan in zip(summary["levels"], planned, strict=True):
        assert ran["nominal_noise_scale"] == plan["nominal_noise_scale"]
        assert plan["nominal_noise_scale"] <= ran["noise_scale"] <= plan["noise_scale"]
    g = zarr.open_group(summary["output"], mode="r")
    assert float(np.asarray(g["state/estimate"][:]).sum()) == int(truth.counts.sum())
    blocks = np.asarray(g["block/estimate"][:]).reshape(len(truth.counts), -1)
    hu, gq = truth.unit_attributes["housing_units"], truth.unit_attributes["gq_population"]
    empty = (hu == 0) & (gq[:, 1:].sum(axis=1) == 0)
    assert empty.sum() > 100 and not blocks[empty].any()  # the file's 211 empty blocks
    assert (blocks >= 0).all() and np.array_equal(blocks, np.round(blocks))
    stated = dict(g.attrs)["invariants"]  # the release says what was published exactly
    assert stated["invariants"] == {"state": ["total"], "block": ["housing_units"]}
    assert stated["constraints"] == {"empty_units": {"facilities": "gq_population"}}
    assert main(["ledger", "show", summary["ledger"], "--json"]) == 0
    (release,) = _json(capsys)["releases"].values()
    (entry,) = release["runs"]
    st = entry["binding"]["invariants"]
    assert st["invariants"] == {"state": ["total"], "block": ["housing_units"]}
    assert st["constraints"] == {"empty_units": {"facilities": "gq_population"}}
    assert main(["ledger", "show", summary["ledger"]]) == 0
    out = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in out if ln.lstrip().startswith("invariants ")]
    assert "state: total" in line and "block: housing_units" in line  # as the entry sorts
    assert line.endswith("; constraints empty_units")
    assert main(["ledger", "verify", summary["ledger"]]) == 0
    capsys.readouterr()
