"""The public geography universe of person records: its forms, records outside it
(refused with counts only, or dropped), parent consistency, and a property over random
geography strings: the store's units are exactly the declared universe."""

from __future__ import annotations

import collections
import pathlib
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpdask import Domain, Geography
from dpdask.errors import DataError, GeographyUniverseError, SpecError
from dpdask.pipeline.spec import load_spec, parse_spec
from dpdask.store import geography_universe, ingest_records, read_store

DOMAIN = Domain(sex=2)
PREFIXES = {"state": 2, "county": 4}
# the universe, by hand: county 0301 is put in state 02 although its id says 03, and
# county 0209 has no record in any test below
TABLE = {
    "state": ["01", "01", "02", "02", "02"],
    "county": ["0101", "0102", "0201", "0209", "0301"],
}
STATES, COUNTIES = ("01", "02"), ("0101", "0102", "0201", "0209", "0301")


def _records(geo: list, sex: list | None = None) -> pd.DataFrame:
    return pd.DataFrame({"geo": geo, "sex": sex if sex is not None else [0] * len(geo)})


def _ingest(records, store, **kw):
    kw.setdefault("levels", PREFIXES)
    kw.setdefault("geographies", TABLE)
    return ingest_records(records, DOMAIN, "geo", store=store, **kw)


# -- the forms of a universe -------------------------------------------------------------------
def test_every_form_names_the_same_universe(tmp_path) -> None:
    csv = tmp_path / "geographies.csv"
    csv.write_text("state,county\n01,0101\n01,0102\n02,0201\n")
    finest = tmp_path / "finest.csv"
    finest.write_text("county\n0101\n0102\n0201\n")
    expected = Geography(
        ("state", "county"), (("01", "02"), ("0101", "0102", "0201")), ([0, 0, 1],)
    )
    table = {"state": ["01", "01", "02"], "county": ["0101", "0102", "0201"]}
    for given_ in (csv, str(csv), finest, table, pd.DataFrame(table), ["0201", "0101", "0102"]):
        assert geography_universe(given_, PREFIXES) == expected
    for given_ in (csv, table, expected):
        assert geography_universe(given_) == expected
    # prefix lengths order the levels, whatever the mapping's order (YAML sorted keys)
    assert geography_universe(csv, {"county": 4, "state": 2}) == expected
    flat = geography_universe(["b", "a"], level="tract")
    assert flat.levels == ("tract",) and flat.ids == (("a", "b"),)


@pytest.mark.parametrize(
    ("universe", "levels", "message"),
    [
        ([101, "0102"], PREFIXES, "unit id 101 is not text; quote ids"),
        (["0101", " "], PREFIXES, "a unit id is empty"),
        (["0101", "0101"], PREFIXES, "a unit id is repeated"),
        ([], None, "lists no units"),
        ({"county": ["0101"], "state": ["01"]}, PREFIXES, r"columns \['county', 'state'\]"),
        ({"state": ["01", "02"], "county": ["0101", "0101"]}, None, "more than one row"),
        ({"state": ["01"], "tract": ["0101"]}, PREFIXES, "are not the levels"),
        (["0101", "011"], PREFIXES, "'011' has 3 characters"),
        (3, None, "expected a list of ids"),
    ],
)
def test_a_bad_universe_is_refused_naming_it(universe, levels, message) -> None:
    with pytest.raises(ValueError, match=message):
        geography_universe(universe, levels)


def test_a_missing_or_empty_universe_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no geography universe file"):
        geography_universe(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("state,county\n")
    with pytest.raises(DataError, match="lists no units"):
        geography_universe(tmp_path / "empty.csv")


# -- ingestion into the universe ----------------------------------------------------------------
def test_units_come_from_the_universe_not_the_records(tmp_path) -> None:
    records = _records(["0101", "0101", "0201"], [0, 1, 1])
    store = _ingest(records, tmp_path / "s")
    assert store.geography.ids == (STATES, COUNTIES)
    counts = read_store(tmp_path / "s", lazy=False)[0][:]
    expected = np.zeros((5, 2), np.int64)
    expected[0] = [1, 1]
    expected[2, 1] = 1
    np.testing.assert_array_equal(counts, expected)  # units without records: zeros


@pytest.mark.parametrize(
    ("geo", "message"),
    [
        ("01é01", "1 whose 'county' id is not a unit of it"),
        ("", "1 whose 'county' id is not a unit of it"),
        (None, "1 whose 'county' id is not a unit of it"),
        ("0101 ", "1 whose 'county' id is not a unit of it"),
        # the record's id says state 03; the universe puts 0301 in state 02
        ("0301", "1 whose 'state' .* is not their unit's parent"),
    ],
)
def test_a_record_outside_is_refused_with_counts_only(tmp_path, geo, message) -> None:
    records = _records(["0101", geo, "0102"])
    with pytest.raises(
        GeographyUniverseError, match=r"^1 record\(s\) have a geography outside"
    ) as e:
        _ingest(records, tmp_path / "s")
    assert re.search(message, str(e.value)) and "\n" not in str(e.value)
    if geo:
        assert geo.strip() not in str(e.value)  # never the confidential id
    assert not (tmp_path / "s").exists()
    store = _ingest(records, tmp_path / "s", unknown_geography="drop")
    assert store.geography.ids == (STATES, COUNTIES)
    counts = read_store(tmp_path / "s", lazy=False)[0][:]
    assert counts.sum() == 2 and counts[0, 0] == counts[1, 0] == 1


def test_the_universe_must_be_declared(tmp_path) -> None:
    records = _records(["0101"])
    for levels in (PREFIXES, None):
        with pytest.raises(GeographyUniverseError, match="need a public geography universe"):
            ingest_records(records, DOMAIN, "geo", levels=levels, store=tmp_path / "s")
    with pytest.raises(SpecError, match="give the universe once"):
        ingest_records(
            records, DOMAIN, "geo", levels=TABLE, geographies=TABLE, store=tmp_path / "s"
        )
    with pytest.raises(SpecError, match="unknown_geography: 'keep'"):
        _ingest(records, tmp_path / "s", unknown_geography="keep")
    assert not (tmp_path / "s").exists()


def test_dropping_every_record_still_publishes_the_universe(tmp_path) -> None:
    store = _ingest(_records(["99", "x"]), tmp_path / "s", unknown_geography="drop")
    assert store.geography.ids == (STATES, COUNTIES)
    assert read_store(tmp_path / "s", lazy=False)[0][:].sum() == 0


def test_outside_records_are_refused_before_their_attributes(tmp_path) -> None:
    records = _records(["0101", "nowhere", "0102"], [0, 0, 7])
    with pytest.raises(GeographyUniverseError):
        _ingest(records, tmp_path / "s")
    # dropped records' values are never read; a kept record's bad value names its row
    records = _records(["nowhere", "0101", "0102"], [9, 0, 7])
    with pytest.raises(
        ValueError,
        match=r"row 2: value 7 is outside 0..1 \(attribute 'sex' has 2 values\); nothing",
    ):
        _ingest(records, tmp_path / "s", unknown_geography="drop")


# -- the property: whatever the records hold, the units are the universe ----------------------
_REAL = st.sampled_from(COUNTIES)
_NEAR = _REAL.flatmap(
    lambda g: st.sampled_from(
        [g + " ", " " + g, g[:-1], g + "0", "０" + g[1:], g.replace("0", "O"), g + "\u200b",
         g[::-1], g.lower() + "\t", "\n" + g]
    )
)  # fmt: skip
_GEO = st.one_of(_REAL, _NEAR, st.text(max_size=6), st.just(""), st.none())


def _inside(geo: object) -> str | None:
    """The oracle: the record's county if its id and prefix are the universe's."""
    if not isinstance(geo, str) or geo not in COUNTIES:
        return None
    state = TABLE["state"][TABLE["county"].index(geo)]
    return geo if geo[:2] == state else None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    geos=st.lists(_GEO, min_size=1, max_size=40),
    sexes=st.data(),
    drop=st.booleans(),
    universe=st.sampled_from(["table", "csv"]),
)
def test_published_units_are_exactly_the_universe(tmp_path_factory, geos, sexes, drop, universe):
    tmp = tmp_path_factory.mktemp("u")
    sex = sexes.draw(st.lists(st.integers(0, 1), min_size=len(geos), max_size=len(geos)))
    given_: object = TABLE
    if universe == "csv":
        given_ = tmp / "geographies.csv"
        pd.DataFrame(TABLE).to_csv(given_, index=False)
    kept = collections.Counter((_inside(g), s) for g, s in zip(geos, sex, strict=True))
    n_outside = sum(n for (c, _), n in kept.items() if c is None)
    records = _records(geos, sex)
    mode = "drop" if drop else "refuse"
    if n_outside and not drop:
        with pytest.raises(GeographyUniverseError, match=rf"^{n_outside} record\(s\)"):
            _ingest(records, tmp / "s", geographies=given_, unknown_geography=mode)
        assert not (tmp / "s").exists()
        return
    store = _ingest(records, tmp / "s", geographies=given_, unknown_geography=mode)
    assert store.geography.levels == ("state", "county")
    assert store.geography.ids == (STATES, COUNTIES)
    expected = np.zeros((len(COUNTIES), 2), np.int64)
    for (county, s), n in kept.items():
        if county is not None:
            expected[COUNTIES.index(county), s] += n
    np.testing.assert_array_equal(read_store(tmp / "s", lazy=False)[0][:], expected)


# -- the spec ---------------------------------------------------------------------------------
def _spec(**data) -> dict:
    return {
        "release": "tiny",
        "data": {"format": "records", "path": "people.csv", "geography_column": "geo", **data},
        "domain": {"sex": 2},
        "workload": "identity",
        "privacy": {"zcdp": 1},
        "output": "out.zarr",
    }


def test_a_records_spec_must_declare_its_universe() -> None:
    with pytest.raises(SpecError, match=r"^data.geographies: required for format 'records'") as e:
        parse_spec(_spec(levels=PREFIXES))
    assert "geographies: geographies.csv" in str(e.value)  # the migration hint
    assert "unknown_geography: drop" in str(e.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"geographies": [101, 102]}, r"data.geographies: unit id 101 is not text"),
        ({"geographies": "nope.csv"}, r"data.geographies: no geography universe file at .*nope"),
        ({"geographies": 3}, "data.geographies: expected a CSV file"),
        ({"geographies": ["0101"], "levels": TABLE}, "data.levels: expected {level: GEOID"),
        ({"geographies": ["0101"], "unknown_geography": "keep"}, "data.unknown_geography"),
        ({"geographies": ["0101", "0101"]}, "data.geographies: a unit id is repeated"),
        ({"geographies": {"state": ["01"], "county": ["0101"]}, "levels": {"county": 4}},
         "data.geographies: the universe's columns"),
    ],
)  # fmt: skip
def test_a_bad_universe_in_a_spec_names_the_field(data, message) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_spec(**data))


def test_the_universe_file_is_relative_to_the_spec(tmp_path: pathlib.Path) -> None:
    (tmp_path / "geo").mkdir()
    (tmp_path / "geo" / "units.csv").write_text("state,county\n01,0101\n")
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(_spec(geographies="geo/units.csv", levels=PREFIXES), sort_keys=False)
    )
    spec = load_spec(path)
    assert spec.data.options["geographies"] == str(tmp_path / "geo" / "units.csv")
    assert spec.data.options["levels"] == PREFIXES


def test_a_run_is_bound_to_what_its_universe_file_says(tmp_path: pathlib.Path) -> None:
    """The spec hash a run is bound to in the ledger changes with the universe file's
    content (the same path), so a resume cannot publish another set of units."""
    from dpdask.pipeline._resume import spec_print

    units = tmp_path / "units.csv"
    units.write_text("state,county\n01,0101\n")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(geographies="units.csv", levels=PREFIXES)))
    before = spec_print(load_spec(path))
    assert spec_print(load_spec(path)) == before
    units.write_text("state,county\n01,0101\n01,0102\n")
    assert spec_print(load_spec(path)) != before


def test_sum_records_outside_their_geographies_are_counted_never_shown(tmp_path) -> None:
    from dpdask.sums._records import read_records
    from dpdask.sums.bins import NumericBins

    (tmp_path / "p.csv").write_text("county,wage\nc01,5\nc9é9,3\nc9é9,4\nc02,1\n")
    spec = {"geography_column": "county", "value_column": "wage", "data": tmp_path / "p.csv"}
    with pytest.raises(SpecError, match=r"2 record\(s\) with a county not in geographies") as e:
        read_records({**spec, "geographies": ["c01", "c02"]}, NumericBins.uniform(0, 10, 5))
    assert "c9é9" not in str(e.value)
