"""``privacy.neighbours`` through the command line, with the real key-file path: a
change-one spec charges the add/remove budget of the same noise, and the plan, the
ledger and the published release say which relation the budget was stated in."""

from __future__ import annotations

import json
import pathlib
from fractions import Fraction

import pytest
import yaml
import zarr

from dpdask.cli import main
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence.yaml"


def _spec(tmp_path: pathlib.Path, name: str, **privacy) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["levels"] = ["county", "tract", "block"]
    raw["privacy"] = {"split": {"county": 1, "tract": 1, "block": 2}, **privacy}
    raw["output"] = str(tmp_path / name / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / name / "ledger.sqlite"), "create": True}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _rho(budget: dict) -> Fraction:
    return Fraction(budget["rho"])


def test_plan_prints_the_budget_in_both_relations(tmp_path, capsys) -> None:
    change = _spec(tmp_path, "co", zcdp="2.5562", neighbours="change-one")
    assert main(["plan", str(change), "--json"]) == 0
    plan = _json(capsys)
    assert plan["neighbours"] == "change-one"
    assert _rho(plan["budget"]) == Fraction("1.2781")  # what is charged
    assert _rho(plan["budgets"]["change-one"]) == Fraction("2.5562")
    assert _rho(plan["budgets"]["add-remove"]) == Fraction("1.2781")
    assert main(["plan", str(change)]) == 0
    text = capsys.readouterr().out
    assert "budget (add-remove, charged): rho=12781/10000 (1.2781)" in text
    assert "budget (change-one): rho=12781/5000 (2.5562)  <- the spec's relation" in text
    same = _spec(tmp_path, "ar", zcdp="1.2781")
    assert main(["plan", str(same), "--json"]) == 0
    ar = _json(capsys)
    assert ar["neighbours"] == "add-remove" and ar["budgets"] == plan["budgets"]
    assert [lv["noise_scale"] for lv in ar["levels"]] == [
        lv["noise_scale"] for lv in plan["levels"]
    ]
    assert not (tmp_path / "co" / "ledger.sqlite").exists()


def test_change_one_charges_half_and_publishes_the_same_noise(tmp_path, capsys) -> None:
    change = _spec(tmp_path, "co", zcdp=1, neighbours="change-one")
    half = _spec(tmp_path, "ar", zcdp="1/2")  # add/remove at half the rho
    published = {}
    for name, spec in (("co", change), ("ar", half)):
        assert main(["run", str(spec), "--json", "--no-progress"]) == 0
        summary = _json(capsys)
        assert main(["ledger", "show", summary["ledger"], "--json"]) == 0
        shown = _json(capsys)
        (release,) = shown["releases"].values()
        # half the rho of the same spec in add/remove (which would charge 1)
        assert _rho(release["spent"]) == Fraction(1, 2)
        assert _rho(release["budget"]) == Fraction(1, 2)
        (run,) = release["runs"]
        assert run["binding"].get("neighbours", "add-remove") == (
            "change-one" if name == "co" else "add-remove"
        )
        assert main(["ledger", "show", summary["ledger"]]) == 0
        assert f"budget stated {'change-one' if name == 'co' else 'add-remove'}" in (
            capsys.readouterr().out
        )
        assert main(["ledger", "verify", summary["ledger"]]) == 0
        capsys.readouterr()
        published[name] = dict(zarr.open_group(summary["output"], mode="r").attrs)
    co, ar = published["co"], published["ar"]
    assert co["neighbours"] == co["dpdask"]["neighbours"] == "change-one"
    assert ar["neighbours"] == ar["dpdask"]["neighbours"] == "add-remove"
    assert _rho(co["budget"]) == _rho(ar["budget"]) == Fraction(1, 2)
    assert _rho(co["dpdask"]["budgets"]["change-one"]) == 1
    scales = {k: [c["noise_scale"] for c in v["dpdask"]["charges"]] for k, v in published.items()}
    assert len(scales["co"]) == 3 and scales["co"] == pytest.approx(scales["ar"], rel=1e-12)


@pytest.mark.parametrize(
    "privacy",
    [
        {"zcdp": 1, "neighbours": "change-two"},
        {"zcdp": 1, "neighbours": ["change-one"]},
        {"epsilon": 1, "delta": "1e-9", "neighbours": "change-one"},
    ],
)
def test_bad_relations_fail_before_anything_is_charged(tmp_path, capsys, privacy) -> None:
    spec = _spec(tmp_path, "bad", **privacy)
    for verb in ("validate", "plan", "run"):
        assert main([verb, str(spec), "--no-progress"] if verb == "run" else [verb, str(spec)]) == 2
        assert "privacy" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "ledger.sqlite").exists()
    assert not (tmp_path / "bad" / "pl94.zarr").exists()
