"""The shipped Providence spec: its store carries the file's H1 and P5 as block attributes.

Oracles are the file's own published rows above the block, read here with the csv
module: persons (POP100) of the geographic header, and the H1 and P5 lines of the tract
and block group records. (The header's HU100 is not H1's total in this 2018 test file:
HU100 exceeds H1 line 1 by 0 to 11 units per tract, at every level alike; the store
keeps the table, H1.) The county record cannot be one:
the file holds only 7 of the county's tracts (its README), so the store's county is
their sum, and is checked as such and against the county record as a bound.
"""

from __future__ import annotations

import csv
import json
import pathlib

import numpy as np
import pytest
import yaml

from dpdask.cli import main
from dpdask.pipeline import load_spec
from dpdask.pipeline.run import load_data
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence.yaml"
EXAMPLE = ROOT / "examples" / "data" / "pl94_providence"
GEO, SEG2, SEG3 = (
    "rigeo2018_2020Style.pl",
    "ri000022018_2020Style.pl",
    "ri000032018_2020Style.pl",
)
SUMLEVS = {"county": "050", "tract": "140", "block_group": "150"}


def _rows(name: str) -> list[list[str]]:
    with open(EXAMPLE / name, encoding="latin-1", newline="") as f:
        return list(csv.reader(f, delimiter="|"))


def published(sumlev: str) -> dict[str, dict[str, np.ndarray]]:
    """{GEOCODE: {"HU100", "POP100", "H1", "P5"}} of the records of one summary level."""
    geo = {r[7]: r for r in _rows(GEO) if r[2] == sumlev and r[4] == "00"}
    out = {r[9]: {"POP100": np.int64(r[90]), "HU100": np.int64(r[91])} for r in geo.values()}
    for name, table, first, n in ((SEG2, "H1", 5 + 71 + 73, 3), (SEG3, "P5", 5, 10)):
        for r in _rows(name):
            if r[4] in geo:
                out[geo[r[4]][9]][table] = np.array([0, *map(int, r[first : first + n])])
    return out


@pytest.fixture
def spec(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    assert raw["domain"] == "pl94" and raw["data"]["format"] == "pl94"
    raw["data"]["path"] = str(EXAMPLE)
    raw["output"] = str(tmp_path / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_validate_names_the_attributes(spec, tmp_path, capsys):
    assert main(["validate", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert report["unit_attributes"] == ["gq_population", "housing_units", "occupied_units"]
    assert not (tmp_path / "out").exists()


def test_store_attributes_match_the_files_own_rows(spec, tmp_path):
    store = load_data(load_spec(spec), tmp_path / "work")
    geo = store.geography
    for level in ("tract", "block_group"):
        rows = published(SUMLEVS[level])
        ids = geo.ids[geo.level_index(level)]
        assert sorted(rows) == list(ids)
        units = store.unit_attribute("housing_units", level)
        occupied = store.unit_attribute("occupied_units", level)
        gq = store.unit_attribute("gq_population", level)
        for i, u in enumerate(ids):
            pub = rows[u]
            assert units[i] == pub["H1"][1] <= pub["HU100"], (level, u)
            assert occupied[i] == pub["H1"][2], (level, u)
            assert gq[i].sum() == pub["POP100"], (level, u)
            assert gq[i, 0] == pub["POP100"] - pub["P5"][1], (level, u)
            np.testing.assert_array_equal(gq[i, 1:], pub["P5"][[3, 4, 5, 6, 8, 9, 10]])
    # the county: the sum of the file's tracts, within the county's published record
    tracts, county = published("140"), published("050")["44007"]
    hu = store.unit_attribute("housing_units", "county")
    gq = store.unit_attribute("gq_population", "county")
    assert hu.tolist() == [sum(r["H1"][1] for r in tracts.values())]
    assert gq[0, 1:].sum() == sum(r["P5"][1] for r in tracts.values())
    assert hu[0] < county["H1"][1] and gq[0, 1:].sum() <= county["P5"][1]
    assert gq[0, 1:].sum() > 0  # the tracts hold group quarters: the checks can fail


def test_tda2020_pipeline_plans_the_bureaus_level_budgets(tmp_path, capsys):
    """The shipped tda-2020 Providence spec: each level at the Bureau's share of the
    persons budget (closed form rho l), noise variance 1 / (2 rho l) per measured row."""
    from fractions import Fraction

    from dpdask.strategy.tda2020 import LEVEL_SHARES, PERSONS_RHO_ADD_REMOVE

    raw = yaml.safe_load((ROOT / "pipelines" / "pl94-providence-tda2020.yaml").read_text())
    raw["data"]["path"] = str(EXAMPLE)
    raw["output"] = str(tmp_path / "out" / "tda.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    path = tmp_path / "tda.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["validate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["units"]["block"] == 569
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for lv in plan["levels"]:
        rho = Fraction(lv["budget"]["rho"])
        bureau = PERSONS_RHO_ADD_REMOVE * LEVEL_SHARES[lv["level"]]
        assert abs(rho / bureau - 1) < 1e-6, lv["level"]
        assert lv["strategy"] == "tda-2020"
        assert lv["nominal_noise_scale"] ** 2 == pytest.approx(1 / (2 * float(rho)), rel=1e-9)
    assert not (tmp_path / "out").exists()
