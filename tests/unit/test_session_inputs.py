"""The pure parts of ``dpdask.Session``: budgets in a spec's form, the universe as a
table, the records file it writes and the dataset id of in-memory counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpdask import Domain, Geography
from dpdask.errors import DataError, SpecError
from dpdask.privacy import ApproxDP, PureDP, zCDP
from dpdask.session._inputs import counts_dataset_id, prepare_input, universe_table
from dpdask.session._session import budget_mapping
from dpdask.specs import parse_budget

UNIVERSE = ["0101", "0102", "0201", "0202"]


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (zCDP("1/3"), zCDP("1/3")),
        (zCDP(2), zCDP(2)),
        (PureDP("0.7"), PureDP("7/10")),
        (ApproxDP(1, "1e-9"), ApproxDP(1, "1/1000000000")),
        (ApproxDP("1/2", 0), PureDP("1/2")),  # delta 0 is pure DP in a spec
    ],
)
def test_a_budget_reads_back_exactly_through_the_spec_parser(budget, expected) -> None:
    assert parse_budget(budget_mapping(budget), "privacy") == expected


def test_the_universe_table_gives_back_the_geography() -> None:
    geo = Geography.from_geoids(UNIVERSE, {"state": 2, "county": 4})
    table = universe_table(geo)
    assert list(table.columns) == ["state", "county"]
    assert Geography.from_table(table) == geo
    # independent oracle: each county's state is its first two characters
    assert all(s == c[:2] for s, c in zip(table.state, table.county, strict=True))


def test_the_records_file_holds_only_the_named_columns_as_text(tmp_path) -> None:
    frame = pd.DataFrame(
        {
            "geoid": ["0101", "0201", "0202"],
            "sex": pd.Categorical.from_codes([1, 0, 1], ["female", "male"]),
            "age": [0, 2, 1],
            "name": ["secret", "also", "private"],  # not an attribute: never written
        }
    )
    got = prepare_input(
        frame, tmp_path, geography_column="geoid", geographies=UNIVERSE,
        levels={"state": 2, "county": 4}, domain={"age": 3}, attributes=["sex", "age"],
    )  # fmt: skip
    assert got.domain == Domain(sex=2, age=3)
    assert got.data["categories"] == {"sex": ["female", "male"]}
    back = pd.read_csv(tmp_path / got.data["path"], dtype=str)
    assert list(back.columns) == ["geoid", "sex", "age"]
    assert back.geoid.tolist() == ["0101", "0201", "0202"]  # leading zeros kept
    assert back.sex.tolist() == ["male", "female", "male"]
    assert "secret" not in (tmp_path / got.data["path"]).read_text()
    assert (tmp_path / got.data["path"]).stat().st_mode & 0o077 == 0
    assert got.geography.n_units("county") == 4  # the universe, not the records' 3


def test_columns_of_the_wrong_kind_are_refused(tmp_path) -> None:
    base = dict(geography_column="geoid", geographies=UNIVERSE, levels={"state": 2, "county": 4})
    with pytest.raises(DataError, match="'sex'"):
        prepare_input(pd.DataFrame({"geoid": ["0101"], "sex": [0.5]}), tmp_path, **base)
    with pytest.raises(SpecError, match="categorical dtype has 2"):
        frame = pd.DataFrame({"geoid": ["0101"], "sex": pd.Categorical(["a"], ["a", "b"])})
        prepare_input(frame, tmp_path, domain={"sex": 3}, **base)
    with pytest.raises(SpecError, match="data"):
        prepare_input([1, 2, 3], tmp_path, **base)
    assert not any(tmp_path.iterdir())


def test_the_dataset_id_of_counts_names_their_content() -> None:
    geo, dom = Geography.from_geoids(UNIVERSE, {"state": 2, "county": 4}), Domain(sex=2)
    x = np.arange(8).reshape(4, 2)
    same = counts_dataset_id(x, dom, geo)
    assert counts_dataset_id(x.astype(np.int16), dom, geo) == same
    y = x.copy()
    y[3, 1] += 1  # one person more
    assert counts_dataset_id(y, dom, geo) != same
    other = Geography.from_geoids(UNIVERSE, {"state": 1, "county": 4})
    assert counts_dataset_id(x, dom, other) != same
    assert counts_dataset_id(x, Domain(age=2), geo) != same


def test_a_store_path_is_read_in_place(tmp_path) -> None:
    from dpdask.store import write_store

    geo, dom = Geography.from_geoids(UNIVERSE, {"state": 2, "county": 4}), Domain(sex=2)
    write_store(tmp_path / "in.zarr", np.ones((4, 2), dtype=np.int32), dom, geo)
    private = tmp_path / "private"
    private.mkdir()
    got = prepare_input(tmp_path / "in.zarr", private, dataset="counted")
    assert got.data == {"format": "store", "path": str(tmp_path / "in.zarr"), "id": "counted"}
    assert got.domain == dom and got.geography == geo
    assert not any(private.iterdir())  # nothing copied


def test_counts_must_match_their_geography_and_domain(tmp_path) -> None:
    geo = Geography.from_geoids(UNIVERSE, {"state": 2, "county": 4})
    with pytest.raises(SpecError, match="shape"):
        prepare_input(np.ones((3, 2), dtype=int), tmp_path, geographies=geo, domain={"sex": 2})
    with pytest.raises(SpecError, match="domain"):
        prepare_input(np.ones((4, 2), dtype=int), tmp_path, geographies=geo)
    assert not any(tmp_path.iterdir())


def test_a_missing_geography_is_left_to_the_universe_rule(tmp_path) -> None:
    frame = pd.DataFrame({"geoid": ["0101", None, "0202"], "sex": [0, 1, 1]})
    got = prepare_input(
        frame, tmp_path, geography_column="geoid", geographies=UNIVERSE,
        levels={"state": 2, "county": 4}, domain={"sex": 2}, unknown_geography="drop",
    )  # fmt: skip
    assert got.data["unknown_geography"] == "drop"
    back = pd.read_csv(tmp_path / got.data["path"], dtype=str, keep_default_na=False)
    assert back.geoid.tolist() == ["0101", "", "0202"]  # outside the universe: dropped
