"""Ingestion of person records: counts against pandas groupby, and a table of bad inputs."""

from __future__ import annotations

import pathlib

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from dpdask import Domain, Geography
from dpdask.errors import DataError, GeographyUniverseError, SpecError
from dpdask.store import StoreExistsError, ingest_records, read_store, write_store

LEVELS = {"state": 2, "county": 5, "tract": 11}
DOMAIN = Domain(sex=2, hisp=2, age=7)
SEXES = ["M", "F"]
BLOCKSIZE = 4000  # bytes of CSV per partition: the test files span several partitions


TRACTS = [f"{s}{c}{t}" for s in ("01", "44") for c in ("001", "007") for t in ("000100", "020300")]


def make_records(rng: np.random.Generator, n: int = 3000) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "geoid": rng.choice(TRACTS[:-1], n),  # the last tract has nobody
            "sex": rng.choice(SEXES, n),
            "hispanic": rng.integers(0, 2, n),
            "age": rng.integers(0, 7, n),
        }
    )


def oracle(records: pd.DataFrame, units: list[str]) -> np.ndarray:
    """Counts by (tract, sex, hisp, age) with pandas groupby, as a dense array."""
    out = np.zeros((len(units), *DOMAIN.shape), dtype=np.int64)
    grouped = records.groupby(["geoid", "sex", "hispanic", "age"]).size()
    for (g, s, h, a), n in grouped.items():
        out[units.index(g), SEXES.index(s), int(h), int(a)] = n
    return out


def write(records: pd.DataFrame, path: pathlib.Path, fmt: str) -> pathlib.Path:
    if fmt == "csv":
        records.to_csv(path.with_suffix(".csv"), index=False)
        return path.with_suffix(".csv")
    records.to_parquet(path.with_suffix(".parquet"), row_group_size=700)
    return path.with_suffix(".parquet")


def ingest(source, store, **kw):
    kw.setdefault("levels", LEVELS)
    if kw["levels"] is LEVELS:
        kw.setdefault("geographies", TRACTS)  # the public universe
    return ingest_records(
        source,
        DOMAIN,
        "geoid",
        {"sex": "sex", "hisp": "hispanic", "age": "age"},
        store=store,
        categories={"sex": SEXES},
        blocksize=BLOCKSIZE,
        **kw,
    )


@pytest.fixture
def records(rng) -> pd.DataFrame:
    return make_records(rng)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "pandas", "dask"])
def test_counts_match_groupby(tmp_path, records, fmt):
    if fmt == "pandas":
        source = records
    elif fmt == "dask":
        source = dd.from_pandas(records, npartitions=4)
    else:
        source = write(records, tmp_path / "persons", fmt)
    store = ingest(source, tmp_path / "store")
    counts, domain, geo = read_store(tmp_path / "store")
    units = sorted(TRACTS)  # the universe, with its tract where nobody lives
    assert list(geo.ids[-1]) == units and geo.levels == tuple(LEVELS)
    assert [list(geo.ids[i]) for i in range(2)] == [sorted({u[:w] for u in units}) for w in (2, 5)]
    np.testing.assert_array_equal(counts.compute(), oracle(records, units))
    assert domain == DOMAIN and store.counts.chunks[1:] == DOMAIN.shape


def test_csv_keeps_leading_zeros_and_reads_several_partitions(tmp_path, records):
    path = write(records, tmp_path / "persons", "csv")
    assert dd.read_csv(path, blocksize=BLOCKSIZE).npartitions > 3
    ingest(path, tmp_path / "store")
    _, _, geo = read_store(tmp_path / "store")
    assert geo.ids[0] == ("01", "44")


def test_parent_table_and_geography_include_empty_units(tmp_path, records):
    units = [*sorted(records.geoid.unique()), "44007020300"]
    table = pd.DataFrame({lv: [u[:w] for u in units] for lv, w in LEVELS.items()})
    for i, levels in enumerate([table, Geography.from_table(table), table.to_dict("list")]):
        ingest(records, tmp_path / f"s{i}", levels=levels)
        counts, _, geo = read_store(tmp_path / f"s{i}")
        assert list(geo.ids[-1]) == units
        np.testing.assert_array_equal(counts.compute(), oracle(records, units))
        assert counts[-1].sum().compute() == 0


def test_flat_geography_and_default_columns(tmp_path, records):
    renamed = records.rename(columns={"hispanic": "hisp"})
    renamed["sex"] = renamed["sex"].map({"M": 0, "F": 1})
    ingest_records(renamed, DOMAIN, "geoid", store=tmp_path / "s", geographies=TRACTS)
    counts, _, geo = read_store(tmp_path / "s")
    units = sorted(TRACTS)
    assert geo.levels == ("geoid",) and list(geo.ids[0]) == units
    np.testing.assert_array_equal(counts.compute(), oracle(records, units))


def test_attribute_columns_as_sequence(tmp_path, records):
    ingest_records(
        records,
        DOMAIN,
        "geoid",
        ["sex", "hispanic", "age"],
        LEVELS,
        store=tmp_path / "s",
        geographies=TRACTS,
        categories={"sex": SEXES},
        dtype="int32",
    )
    counts, _, _ = read_store(tmp_path / "s")
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts.compute(), oracle(records, sorted(TRACTS)))


def test_parquet_numeric_columns_with_missing_value(tmp_path, records):
    bad = records.astype({"age": float})
    bad.loc[2222, "age"] = np.nan
    path = write(bad, tmp_path / "persons", "parquet")
    with pytest.raises(DataError, match=r"column 'age', row 2222: missing value"):
        ingest(path, tmp_path / "s")
    bad.loc[2222, "age"] = 2.5
    path = write(bad, tmp_path / "persons2", "parquet")
    with pytest.raises(DataError, match=r"column 'age', row 2222: value 2.5 is not an integer"):
        ingest(path, tmp_path / "s")
    assert not (tmp_path / "s").exists()


# -- bad input: each kind of error names the column, the value and the row -------

BAD = [
    ("sex", "X", "unknown category 'X'; attribute 'sex' has categories ['M', 'F']"),
    ("sex", "", "missing value"),
    ("hispanic", "2", "value 2 is outside 0..1 (attribute 'hisp' has 2 values)"),
    ("age", "-1", "value -1 is outside 0..6"),
    ("age", "7", "value 7 is outside 0..6"),
    ("age", "1.5", "value '1.5' is not an integer code of attribute 'age'"),
    ("age", "old", "value 'old' is not an integer code"),
    ("age", " ", "missing value"),
]


@pytest.mark.parametrize(
    ("column", "value", "message", "row"),
    [(*case, (0, 2345)[i % 2]) for i, case in enumerate(BAD)],  # first row, or a later partition
)
def test_bad_value_is_named_and_nothing_is_written(tmp_path, records, column, value, message, row):
    bad = records.astype(str)
    bad.loc[row, column] = value
    bad.loc[row + 7, column] = value  # a second bad row is counted, the first one shown
    path = write(bad, tmp_path / "persons", "csv")
    expected = f"column '{column}', row {row}: {message}"
    with pytest.raises(DataError, match="2 rows have problems") as err:
        ingest(path, tmp_path / "new")
    assert str(err.value).startswith(expected), str(err.value)
    assert not (tmp_path / "new").exists()
    # an existing store is left untouched even when replacing it was asked for
    old = write_store(
        tmp_path / "old", np.zeros((1, *DOMAIN.shape), np.int64), DOMAIN, Geography.flat(["x"])
    )
    before = old.counts[:]
    with pytest.raises(DataError, match=f"row {row}"):
        ingest(path, tmp_path / "old", overwrite=True)
    np.testing.assert_array_equal(read_store(tmp_path / "old", lazy=False)[0][:], before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "persons.csv"]


@pytest.mark.parametrize("value", ["", "4400701", "01001000100 ", "99001000100"])
def test_geography_outside_the_universe_is_counted_never_shown(tmp_path, records, value):
    bad = records.astype(str)
    bad.loc[[5, 2345], "geoid"] = value  # in two partitions
    path = write(bad, tmp_path / "persons", "csv")
    with pytest.raises(GeographyUniverseError, match=r"^2 record\(s\) have a geography outside"):
        ingest(path, tmp_path / "s")
    for levels in (Geography.from_geoids(TRACTS, LEVELS), pd.DataFrame({"tract": TRACTS})):
        with pytest.raises(GeographyUniverseError, match="2 whose 'tract' id is not") as err:
            ingest(path, tmp_path / "s", levels=levels)
        assert value.strip() == "" or value not in str(err.value)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"attribute_columns": {"sex": "sex"}}, SpecError, r"no column for attribute\(s\)"),
        (
            {"attribute_columns": {"sex": "sex", "hisp": "hispanic", "age": "nope"}},
            DataError,
            r"the records have no column \['nope'\]",
        ),
        (
            {"attribute_columns": {"sex": "sex", "hisp": "hispanic", "age": "age", "x": "age"}},
            ValueError,
            "unknown attribute 'x'",
        ),
        ({"attribute_columns": ["sex", "age"]}, SpecError, "2 attribute columns"),
        ({"categories": {"sex": ["M"]}}, SpecError, "1 labels but the attribute has 2 values"),
        ({"categories": {"sex": ["M", "M"]}}, SpecError, "repeat a label"),
        ({"categories": {"sex": SEXES, "zip": ["1"]}}, ValueError, "unknown attribute 'zip'"),
        ({"levels": {"state": 2, "county": "5"}}, SpecError, "levels must be"),
        ({"dtype": "float64"}, DataError, "counts must be integers"),
        ({"source": "nowhere.csv"}, FileNotFoundError, "nowhere.csv does not exist"),
        ({"source": "persons.json"}, DataError, "cannot tell the format"),
    ],
)
def test_bad_arguments(tmp_path, records, kwargs, error, message):
    kwargs = {
        "source": records,
        "attribute_columns": {"sex": "sex", "hisp": "hispanic", "age": "age"},
        "levels": LEVELS,
        "geographies": TRACTS,
        "categories": {"sex": SEXES},
        **kwargs,
    }
    if isinstance(kwargs["source"], str):
        if kwargs["source"] == "persons.json":
            (tmp_path / "persons.json").write_text("{}")
        kwargs["source"] = tmp_path / kwargs["source"]
    with pytest.raises(error, match=message):
        ingest_records(kwargs.pop("source"), DOMAIN, "geoid", store=tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_existing_store_refused_before_reading(tmp_path, records):
    write_store(
        tmp_path / "s", np.zeros((1, *DOMAIN.shape), np.int64), DOMAIN, Geography.flat(["x"])
    )
    with pytest.raises(StoreExistsError, match="already exists"):
        ingest(tmp_path / "does-not-exist.csv", tmp_path / "s")


def test_empty_records(tmp_path, records):
    with pytest.raises(DataError, match="the records are empty"):
        ingest(records.iloc[:0], tmp_path / "s")


def test_validation_happens_before_any_write(tmp_path, records, monkeypatch):
    import dpdask.store._ingest as ingest_module

    def no_writes(*args, **kwargs):
        raise AssertionError("the store was opened for writing before validation ended")

    monkeypatch.setattr(ingest_module, "_publish_store", no_writes)
    bad = records.astype(str)
    bad.loc[2999, "age"] = "99"
    with pytest.raises(DataError, match="row 2999: value 99 is outside"):
        ingest(bad, tmp_path / "s")
    with pytest.raises(AssertionError, match="before validation ended"):
        ingest(records, tmp_path / "s")
