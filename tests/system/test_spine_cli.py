"""``reconstruct: {method: topdown, spine: true}`` through the command line, with the real
key-file path and a real ledger (issue 33).

A store of a one-county state whose tracts hold 1, 2 and 3 blocks: ``dpdask plan``
states that the county is not measured and its budget moved to the state; ``dpdask run``
charges three levels whose budgets add up to the spec's, publishes the county equal to
the state and the lone block equal to its tract, exactly; with the state's total as an
invariant (the multi-pass top-down) it does the same and publishes the total exactly.
"""

from __future__ import annotations

import json
import pathlib
from fractions import Fraction

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.privacy import Ledger, zCDP
from dpdask.store import write_store
from tests.unit.test_spine import DOMAIN, GEO


def _spec(tmp_path: pathlib.Path, **changes) -> pathlib.Path:
    store = tmp_path / "store"
    if not store.exists():
        counts = np.random.default_rng(3).integers(0, 30, size=(6, *DOMAIN.shape))
        write_store(store, counts, DOMAIN, GEO)
    raw = {
        "release": "spine",
        "data": {"format": "store", "path": str(store)},
        "domain": {"a": 2, "b": 3},
        "levels": ["state", "county", "tract", "block"],
        "workload": {"name": "marginals", "k": 1},
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1, "tract": 1, "block": 2}},
        "strategy": "identity",
        "reconstruct": {"method": "topdown", "spine": True, "integer": True},
        "output": str(tmp_path / "out" / "spine.zarr"),
        "ledger": {"path": str(tmp_path / "ledger.sqlite"), "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "processes": False},
        **changes,
    }
    path = tmp_path / "spine.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plan_states_the_spine(tmp_path, capsys):
    spec = _spec(tmp_path)
    assert main(["plan", str(spec), "--json"]) == 0
    rows = {row["level"]: row for row in _json(capsys)["levels"]}
    assert rows["county"]["spine"]["measured"] is False
    assert rows["county"]["spine"]["budget_moved_to"] == "state"
    assert rows["county"]["budget"]["rho"] == "0"
    assert rows["state"]["budget"]["rho"] == "2/5"  # (1 + 1) / 5 of the budget
    assert rows["block"]["spine"]["units_reusing_parent"] == 1
    # the GLS column: the county measures nothing and, an only child, is its state
    county, state = rows["county"]["groups"], rows["state"]["groups"]
    assert all(g["sd_measured"] is None for g in county)
    for c, s in zip(county, state, strict=True):
        assert c["sd_reconstructed"] == pytest.approx(s["sd_reconstructed"], rel=1e-6)
    assert main(["plan", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "spine: county: 1 units reuse their parent's estimate (100%); not measured; " in text
    assert "budget moved to state" in text and "budget of county received" in text
    assert not (tmp_path / "ledger.sqlite").exists()


def test_run_charges_the_moved_budget_where_it_is_spent(tmp_path, capsys):
    spec = _spec(tmp_path)
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = _json(capsys)
    g = zarr.open_group(summary["output"], mode="r")
    est = {lv: np.asarray(g[lv]["estimate"][:]).reshape(-1, 6) for lv in GEO.levels}
    np.testing.assert_array_equal(est["county"], est["state"])
    np.testing.assert_array_equal(est["block"][0], est["tract"][0])
    assert np.array_equal(est["block"], np.round(est["block"])) and (est["block"] >= 0).all()
    charges = {c.level: c.privacy for c in Ledger(summary["ledger"]).charges("spine")}
    assert charges == {
        "state": zCDP(Fraction(2, 5)),
        "tract": zCDP(Fraction(1, 5)),
        "block": zCDP(Fraction(2, 5)),
    }
    assert main(["ledger", "show", summary["ledger"], "--json"]) == 0
    (release,) = _json(capsys)["releases"].values()
    assert release["spent"] == zCDP(1).to_dict() and release["runs"][0]["charges"] == 3
    assert release["runs"][0]["state"] == "published"
    assert main(["ledger", "verify", summary["ledger"]]) == 0
    capsys.readouterr()


def test_spine_with_invariants_runs_the_multi_pass_top_down(tmp_path, capsys):
    """The state's total published exactly, by the multi-pass top-down with the spine:
    the same three charges, the county the state and the lone block its tract."""
    spec = _spec(tmp_path, invariants={"state": ["total"]})
    assert main(["plan", str(spec), "--json"]) == 0
    rows = {row["level"]: row for row in _json(capsys)["levels"]}
    assert rows["county"]["spine"]["budget_moved_to"] == "state"
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = _json(capsys)
    g = zarr.open_group(summary["output"], mode="r")
    est = {lv: np.asarray(g[lv]["estimate"][:]).reshape(-1, 6) for lv in GEO.levels}
    truth = np.asarray(zarr.open_group(str(tmp_path / "store"), mode="r")["counts"][:])
    for lv in GEO.levels:
        assert est[lv].sum() == truth.sum()  # the invariant, at every level
    np.testing.assert_array_equal(est["county"], est["state"])
    np.testing.assert_array_equal(est["block"][0], est["tract"][0])
    charges = {c.level for c in Ledger(summary["ledger"]).charges("spine")}
    assert charges == {"state", "tract", "block"}
    assert main(["ledger", "verify", summary["ledger"]]) == 0
