"""Scheduled releases: one release per period, under the dataset's lifetime budget."""

from __future__ import annotations

import datetime
import json
import pathlib

import pytest
import yaml

from dpdask.cli import main
from dpdask.pipeline.spec import SpecError, load_spec
from dpdask.privacy import Ledger
from tests import ROOT

MONTHLY = ROOT / "pipelines" / "pl94-monthly.yaml"


@pytest.fixture
def monthly(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load(MONTHLY.read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["output"] = str(tmp_path / "out" / "pl94-{period}.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw["strategy"] = "identity"  # the schedule is under test, not the strategy
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    path = tmp_path / "monthly.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_period_names_the_release_and_the_output(monthly, tmp_path) -> None:
    spec = load_spec(monthly, period="2026-11")
    assert spec.release == "pl94-providence-2026-11"
    assert spec.output == tmp_path / "out" / "pl94-2026-11.zarr"
    assert spec.period == "2026-11"
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    assert load_spec(monthly).release == f"pl94-providence-{today}"


@pytest.mark.parametrize("period", ["", "../x", "a b", "x" * 65])
def test_a_bad_period_is_refused(monthly, period) -> None:
    with pytest.raises(SpecError, match="period"):
        load_spec(monthly, period=period)


def test_a_period_needs_a_placeholder(tmp_path) -> None:
    raw = yaml.safe_load(MONTHLY.read_text())
    raw["release"] = "fixed"
    path = tmp_path / "fixed.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match="no \\{period\\} placeholder"):
        load_spec(path, period="2026-11")
    with pytest.raises(SpecError, match="output: names \\{period\\}"):
        load_spec(path)
    raw["release"], raw["output"] = "r-{period}", "out/fixed.zarr"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match="needs \\{period\\} in its output"):
        load_spec(path, period="2026-11")


def test_two_periods_publish_and_a_third_is_refused_before_reading(
    monthly, tmp_path, capsys, monkeypatch
) -> None:
    for period in ("2026-10", "2026-11"):
        args = ["run", str(monthly), "--period", period, "--json", "--no-progress"]
        assert main(args) == 0
        assert (tmp_path / "out" / f"pl94-{period}.zarr").is_dir()
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    assert [r.state for r in ledger.runs()] == ["published", "published"]
    assert {c.release for c in ledger.charges()} == {
        "pl94-providence-2026-10",
        "pl94-providence-2026-11",
    }
    # the third period: refused from the ledger alone, before the data is read
    from dpdask.pipeline import run as run_module

    def no_read(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(run_module, "data_geography", no_read)
    monkeypatch.setattr(run_module, "load_data", no_read)
    monkeypatch.setattr(run_module, "source_print", no_read)
    capsys.readouterr()
    assert main(["run", str(monthly), "--period", "2026-12", "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "lifetime" in err and "rho=0" in err
    assert not (tmp_path / "out" / "pl94-2026-12.zarr").exists()
    assert len(Ledger(tmp_path / "out" / "ledger.sqlite").runs()) == 2
    # a period that was published is not published again when the timer fires twice
    monkeypatch.undo()
    assert main(["run", str(monthly), "--period", "2026-11", "--no-progress"]) == 4
    assert main(["ledger", "show", str(tmp_path / "out" / "ledger.sqlite"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["datasets"]["ri-2018-e2e-providence"]["remaining"]["rho"] == "0"
