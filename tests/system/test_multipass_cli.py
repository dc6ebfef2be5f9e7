"""``reconstruct: {method: topdown, passes: ..., slack: ...}`` through the command line,
with the real key-file path and a real ledger: the plan states each level's passes; a
pass naming a query group the workload lacks, or passes with another method, is refused
before anything is charged or written; a charged run (the shipped Providence multi-pass
spec) keeps the state total and the empty blocks, and its ledger entry and release
attributes state the passes; its run id cannot be run again.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import yaml

from dpdask.cli import main
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence-multipass.yaml"
DATA = ROOT / "examples" / "data" / "pl94_providence"


def _spec(tmp_path: pathlib.Path, *, create: bool = True, **reconstruct) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(DATA)
    raw["levels"] = ["state", "tract", "block"]
    raw["privacy"] = {"zcdp": 1, "split": {"state": 1, "tract": 1, "block": 2}}
    raw["output"] = str(tmp_path / "mp" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite"), "create": create}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    raw["reconstruct"] = {**raw["reconstruct"], **reconstruct}
    path = tmp_path / "mp.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _ledger_bytes(tmp_path: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(tmp_path.glob("ledger.sqlite*"))}


def test_the_shipped_spec_states_its_passes():
    raw = yaml.safe_load(SPEC.read_text())
    assert raw["reconstruct"]["passes"] == "default" and raw["reconstruct"]["slack"] == 0
    assert raw["invariants"] == {"state": ["total"], "block": ["housing_units"]}


def test_plan_states_each_levels_passes(tmp_path, capsys):
    spec = _spec(tmp_path, passes=[["votingage"], ["hisp", "race-single"]], slack=0.5)
    assert main(["plan", str(spec), "--json"]) == 0
    st = _json(capsys)["passes"]
    assert st["passes"] == [["votingage"], ["hisp", "race-single"]] and st["slack"] == 0.5
    # each level: the groups' passes, then every cell from the rest of the strategy
    want = ["votingage", "hisp+race-single", "detail"]
    assert st["levels"] == {"state": want, "tract": want, "block": want}
    assert main(["plan", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "passes (multi-pass top-down, slack 0.5): votingage then hisp+race-single" in text
    assert "  block: votingage -> hisp+race-single -> detail" in text
    assert not (tmp_path / "ledger.sqlite").exists()
    assert main(["validate", str(spec), "--json"]) == 0
    assert _json(capsys)["passes"]["levels"]["tract"] == want
    assert not (tmp_path / "ledger.sqlite").exists() and not (tmp_path / "mp").exists()


@pytest.mark.parametrize("verb", ["validate", "run"])
def test_an_unknown_group_is_refused_before_any_charge(tmp_path, capsys, verb):
    assert main(["ledger", "init", str(tmp_path / "ledger.sqlite")]) == 0
    capsys.readouterr()
    before = _ledger_bytes(tmp_path)
    spec = _spec(tmp_path, create=False, passes=[["votingage"], ["persons"]])
    args = [verb, str(spec), "--json"] + (["--no-progress"] if verb == "run" else [])
    assert main(args) == 2
    refusal = _json(capsys)
    assert refusal["kind"] == "invalid" and refusal["error"] == "SpecError"
    assert refusal["message"].startswith(
        "reconstruct.passes[1]: ['persons'] is not a query group of workload 'pl94'"
    )
    assert "'race-multiple'" in refusal["message"]  # the groups it has
    assert _ledger_bytes(tmp_path) == before
    assert not (tmp_path / "mp").exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"method": "ls", "integer": False}, "reconstruct.passes: only method: topdown"),
        ({"passes": "first"}, "reconstruct.passes: 'default' or a list"),
        ({"passes": [["votingage"], "votingage"]}, "reconstruct.passes: groups ['votingage']"),
        ({"slack": -1}, "reconstruct.slack: a number >= 0"),
    ],
)
def test_bad_passes_are_refused_before_any_charge(tmp_path, capsys, changes, message):
    assert main(["ledger", "init", str(tmp_path / "ledger.sqlite")]) == 0
    capsys.readouterr()
    before = _ledger_bytes(tmp_path)
    spec = _spec(tmp_path, create=False, **changes)
    assert main(["run", str(spec), "--json", "--no-progress"]) == 2
    refusal = _json(capsys)
    assert refusal["error"] == "SpecError" and message in refusal["message"]
    assert _ledger_bytes(tmp_path) == before
    assert not (tmp_path / "mp").exists()


def test_a_charged_run_states_its_passes(tmp_path, capsys):
    """The real path: key file, ledger, the multi-pass fit under the constraints."""
    import zarr

    from dpdask.store import read_pl94_file

    spec = _spec(tmp_path)
    assert main(["run", str(spec), "--json", "--no-progress", "--run-id", "mp-1"]) == 0
    summary = _json(capsys)
    truth = read_pl94_file(DATA)
    g = zarr.open_group(summary["output"], mode="r")
    assert float(np.asarray(g["state/estimate"][:]).sum()) == int(truth.counts.sum())
    blocks = np.asarray(g["block/estimate"][:]).reshape(len(truth.counts), -1)
    hu, gq = truth.unit_attributes["housing_units"], truth.unit_attributes["gq_population"]
    empty = (hu == 0) & (gq[:, 1:].sum(axis=1) == 0)
    assert empty.sum() > 100 and not blocks[empty].any()
    assert (blocks >= 0).all() and np.array_equal(blocks, np.round(blocks))
    tracts = np.asarray(g["tract/estimate"][:])
    assert np.isclose(tracts.sum(), truth.counts.sum())  # the levels add up
    stated = dict(g.attrs)["dpdask"]  # the release says how it was fitted
    # the total, then the detail; the finest level (nothing below it) in one fit
    assert stated["passes"] == {"state": ["total", "detail"], "tract": ["total", "detail"],
                                "block": ["cells"]}  # fmt: skip
    assert stated["slack"] == 0
    assert main(["ledger", "show", summary["ledger"], "--json"]) == 0
    (release,) = _json(capsys)["releases"].values()
    (entry,) = release["runs"]
    assert entry["binding"]["passes"] == {"passes": "default", "slack": 0.0}
    assert main(["ledger", "show", summary["ledger"]]) == 0
    assert "      passes default; slack 0" in capsys.readouterr().out.splitlines()
    assert main(["ledger", "verify", summary["ledger"]]) == 0
    capsys.readouterr()
    before = _ledger_bytes(tmp_path)
    # the same run id again: a published run is never drawn or charged twice
    again = ["run", str(spec), "--json", "--no-progress", "--run-id", "mp-1", "--overwrite"]
    assert main(again) != 0
    refusal = _json(capsys)
    assert refusal["error"] == "RunStateError" and "is published" in refusal["message"]
    assert _ledger_bytes(tmp_path) == before
