"""Reading published releases: xarray, dpdask.open_release, labels and dpdask export."""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
import zarr

import dpdask
from dpdask import Domain, Geography, census
from dpdask.cli import main
from dpdask.errors import ArgumentError
from dpdask.graph import release
from dpdask.linalg import Identity, Kron, Prefix, Total, VStack
from dpdask.noise import SecretKey
from dpdask.privacy import Ledger, zCDP
from dpdask.publish import (
    category_labels,
    pl94_tables,
    query_descriptions,
    query_labels,
)
from dpdask.publish.reader import COLUMNS, open_release, release_table
from dpdask.store import write_store
from dpdask.workloads import pl94, sf1_persons
from tests import ROOT
from tests.helpers import DensePlan

DOMAIN = Domain(a=2, b=3)
LEVELS = ("state", "county", "tract")


def make_plan() -> DensePlan:
    A = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])])
    W = VStack(
        [Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)]), Identity(6)],
        names=["a", "b-prefix", "cells"],
    )
    budget = zCDP(1)
    return DensePlan(A, W, DOMAIN, "gaussian", budget.gaussian_sigma(A.sensitivity(2)), budget)


EXPECTED_LABELS = [
    "a_001", "a_002", "b-prefix_001", "b-prefix_002", "b-prefix_003",
    *(f"cells_{j:03d}" for j in range(1, 7)),
]  # fmt: skip


@pytest.fixture
def published(tmp_path: pathlib.Path, rng: np.random.Generator) -> pathlib.Path:
    geo = Geography(
        levels=LEVELS,
        ids=(("s",), ("c0", "c1", "c2"), tuple(f"t{i}" for i in range(7))),
        parents=(np.zeros(3, dtype=int), np.array([0, 0, 1, 2, 2, 2, 2])),
    )
    counts = rng.integers(0, 50, size=(7, 2, 3))
    st = write_store(tmp_path / "in.zarr", counts, DOMAIN, geo, geo_chunk=2)
    r = release(
        make_plan(), st, release_id="small", ledger=Ledger.init(tmp_path / "ledger.sqlite"),
        key=SecretKey.for_testing(5), test_mode=True, chunk_bytes=8 * 6 * 2,
    )  # fmt: skip
    return r.to_zarr(tmp_path / "out.zarr")


def _arrays(group: zarr.Group, prefix: str = ""):
    for name, arr in group.arrays():
        yield f"{prefix}{name}", arr
    for name, sub in group.groups():
        yield from _arrays(sub, f"{prefix}{name}/")


def test_every_array_names_its_dimensions_and_metadata_is_consolidated(published) -> None:
    root = zarr.open_group(str(published), mode="r")
    arrays = dict(_arrays(root))
    assert {"tract/estimate", "tract/answers", "tract/variance", "tract/geography"} <= set(arrays)
    for name, arr in arrays.items():
        dims = arr.metadata.dimension_names
        assert dims is not None and len(dims) == arr.ndim, name
    assert arrays["tract/estimate"].metadata.dimension_names == ("geography", "a", "b")
    assert arrays["tract/answers"].metadata.dimension_names == ("geography", "workload_query")
    meta = json.loads((published / "zarr.json").read_text())
    assert meta.get("consolidated_metadata") is not None
    assert "tract/answers" in meta["consolidated_metadata"]["metadata"]
    # the release is still recognised as one (dpdask ledger verify --release, overwrite)
    assert meta["attributes"]["dpdask"]["format"] == "dpdask-release"


def test_xarray_opens_the_release_with_coordinates(published) -> None:
    tree = xr.open_datatree(str(published), engine="zarr")
    assert set(tree.children) == set(LEVELS)
    root = zarr.open_group(str(published), mode="r")
    attrs = tree.attrs
    assert attrs["release"] == "small" and attrs["run_id"] == attrs["dpdask"]["run_id"]
    assert attrs["levels"] == list(LEVELS)
    assert attrs["budget"] == zCDP(1).to_dict()
    assert attrs["workload"]["queries"] == 11
    assert attrs["workload"]["parts"] == [
        {"name": "a", "rows": 2}, {"name": "b-prefix", "rows": 3}, {"name": "cells", "rows": 6},
    ]  # fmt: skip
    assert attrs["strategy"]["rows"] == 9 and attrs["strategy"]["mechanism"] == "gaussian"
    for i, lv in enumerate(LEVELS):
        ds = tree[lv].dataset
        g = root[lv]
        assert ds.answers.dims == ("geography", "workload_query")
        assert ds.estimate.dims == ("geography", "a", "b")
        assert list(ds.geography.values) == list(g["ids"][:])
        assert list(ds.ids.values) == list(ds.geography.values)
        assert list(ds.workload_query.values) == EXPECTED_LABELS
        assert list(ds.a.values) == [0, 1] and list(ds.b.values) == [0, 1, 2]
        assert list(ds.query_description.values[:5]) == ["a=0", "a=1", "b=0", "b=0..1", "total"]
        assert ds.query_description.values[5] == ""  # not a product on the domain
        for name in ("estimate", "answers", "variance"):
            np.testing.assert_array_equal(ds[name].values, g[name][:])
            assert ds[name].attrs["long_name"]
        assert ds.answers.attrs["units"] == "persons"
        assert "table_answers" not in ds  # not the PL94 workload
        if i:
            upper = root[LEVELS[i - 1]]["ids"][:]
            assert list(ds.parent_id.values) == list(upper[g["parent"][:]])
            assert "parent_id" in ds.answers.coords
        else:
            assert "parent_id" not in ds
        one = xr.open_zarr(str(published), group=lv)
        np.testing.assert_array_equal(one.answers.values, g["answers"][:])
    tract = tree["tract"].dataset
    t3 = tract.answers.sel(geography="t3", workload_query="cells_004")
    assert float(t3) == root["tract/answers"][3, 5 + 3]
    assert str(t3.parent_id.values) == "c2"


def test_open_release_adds_margins_and_refuses_other_stores(published, tmp_path) -> None:
    tree = dpdask.open_release(published)
    assert tuple(tree.children) == LEVELS
    assert tree.attrs["release"] == "small"
    for lv in LEVELS:
        ds = tree[lv].dataset
        np.testing.assert_allclose(ds.moe90.values, 1.645 * np.sqrt(ds.variance.values))
        assert ds.moe90.dims == ("geography", "workload_query")
    lazy = open_release(published, chunks={})
    assert lazy["tract"].dataset.answers.chunks is not None
    with pytest.raises(FileNotFoundError):
        open_release(tmp_path / "nowhere.zarr")
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w", zarr_format=3)
    with pytest.raises(ArgumentError, match="not a dpdask release"):
        open_release(tmp_path / "other.zarr")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_writes_every_answer_with_its_margin(published, tmp_path, capsys, fmt) -> None:
    out = tmp_path / f"tract.{fmt}"
    assert main(["export", str(published), "--level", "tract", "--format", fmt,
                 "--out", str(out)]) == 0  # fmt: skip
    assert "wrote 77 rows" in capsys.readouterr().out
    df = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)  # no options
    assert list(df.columns) == list(COLUMNS)
    if fmt == "csv":  # ids are "<level>:<id>"
        assert df["geography"].str.startswith("tract:").all()
        assert df["parent"].str.startswith("county:").all()
        df["geography"] = df["geography"].str.split(":", n=1).str[1]
        df["parent"] = df["parent"].str.split(":", n=1).str[1]
    g = zarr.open_group(str(published), mode="r")["tract"]
    ids = list(g["ids"][:])
    assert len(df) == len(ids) * len(EXPECTED_LABELS)
    assert list(df["geography"]) == [i for i in ids for _ in EXPECTED_LABELS]
    assert list(df["query"]) == EXPECTED_LABELS * len(ids)
    assert list(df["label"][:5]) == ["a=0", "a=1", "b=0", "b=0..1", "total"]
    np.testing.assert_array_equal(df["answer"].to_numpy(), g["answers"][:].ravel())
    np.testing.assert_array_equal(df["variance"].to_numpy(), g["variance"][:].ravel())
    np.testing.assert_allclose(df["moe90"], 1.645 * np.sqrt(df["variance"]))
    parents = list(g["parent_id"][:])
    assert list(df["parent"]) == [p for p in parents for _ in EXPECTED_LABELS]
    # the same as the Python table
    py = release_table(published, "tract")
    pd.testing.assert_frame_equal(
        py.reset_index(drop=True), df.fillna({"label": ""}), check_dtype=False
    )
    # an existing output is never replaced without --overwrite
    assert main(["export", str(published), "--level", "tract", "--format", fmt,
                 "--out", str(out)]) == 4  # fmt: skip
    assert "exists" in capsys.readouterr().err


def test_export_selects_queries_and_units(published, tmp_path, capsys) -> None:
    assert main(["export", str(published), "--level", "tract", "--format", "csv", "--out", "-",
                 "--query", "cells_002", "a_001", "--geography", "t5", "t1",
                 "--ids", "plain"]) == 0  # fmt: skip
    df = pd.read_csv(io.StringIO(capsys.readouterr().out), dtype=str)
    g = zarr.open_group(str(published), mode="r")["tract"]
    assert list(df["geography"]) == ["t5", "t5", "t1", "t1"]
    assert list(df["query"]) == ["cells_002", "a_001"] * 2
    expected = [g["answers"][5, 6], g["answers"][5, 0], g["answers"][1, 6], g["answers"][1, 0]]
    np.testing.assert_array_equal(df["answer"].astype(float), expected)
    top = release_table(published, "state", queries=["a_002"])
    assert len(top) == 1 and top["parent"].isna().all()
    for bad, message in (
        (["--query", "P1_001"], "unknown query"),
        (["--geography", "t99"], "unknown tract id"),
        (["--format", "csv", "--level", "parish"], "its levels are ['state', 'county', 'tract']"),
    ):
        args = ["export", str(published), "--level", "tract", "--out", "-", *bad]
        assert main([*args, "--format", "csv"] if "--format" not in bad else args) == 2
        assert message in capsys.readouterr().err


# -- categories by name, names no Dataset method shadows, levels coarsest first ----------
LABELLED = Domain(votingage=2, hisp=2, b=3)
# county and tract ids with leading zeros, and levels not in alphabetical order
ZERO_IDS = (("01",), ("01001", "01003"), ("01001000100", "01001000200", "01003000100"))


@pytest.fixture
def labelled(tmp_path: pathlib.Path, rng: np.random.Generator) -> pathlib.Path:
    geo = Geography(
        levels=("state", "county", "tract"), ids=ZERO_IDS,
        parents=(np.zeros(2, dtype=int), np.array([0, 0, 1])),
    )  # fmt: skip
    A = Kron([Identity(2), Identity(2), Identity(3)])
    W = VStack(
        [Kron([Identity(2), Total(2), Total(3)]), Kron([Identity(2), Identity(2), Identity(3)])],
        names=["votingage", "cells"],
    )
    budget = zCDP(1)
    plan = DensePlan(A, W, LABELLED, "gaussian", budget.gaussian_sigma(A.sensitivity(2)), budget)
    counts = rng.integers(0, 50, size=(3, 2, 2, 3))
    st = write_store(tmp_path / "in.zarr", counts, LABELLED, geo, geo_chunk=2)
    r = release(
        plan, st, release_id="labelled", ledger=Ledger.init(tmp_path / "ledger.sqlite"),
        key=SecretKey.for_testing(7), test_mode=True,
    )  # fmt: skip
    return r.to_zarr(tmp_path / "labelled.zarr")


def _names(ds: xr.Dataset) -> set[str]:
    return {str(n) for n in (*ds.dims, *ds.coords)}


def test_categories_are_selectable_by_name(labelled) -> None:
    tree = dpdask.open_release(labelled)
    g = zarr.open_group(str(labelled), mode="r")["tract"]
    stored = np.asarray(g["estimate"][:])  # (geography, votingage, hisp, b)
    tract = tree["tract"].ds
    adults = tract.sel(votingage="18 years and over")
    np.testing.assert_array_equal(adults.estimate.values, stored[:, 1])
    one = tract.estimate.sel(votingage="Under 18 years", hisp="Hispanic or Latino", b=2)
    np.testing.assert_array_equal(one.values, stored[:, 0, 1, 2])
    assert list(tract.votingage.values) == ["Under 18 years", "18 years and over"]
    assert list(tract.votingage_code.values) == [0, 1] and tract.votingage_code.dims == (
        "votingage",
    )
    assert list(tract.hisp_code.values) == [0, 1]
    # an attribute of unknown coding keeps its values as the index, and no _code
    assert list(tract.b.values) == [0, 1, 2] and "b_code" not in tract.coords
    # the code selects too, through the second coordinate
    by_code = tract.estimate.swap_dims(votingage="votingage_code").sel(votingage_code=1)
    np.testing.assert_array_equal(by_code.values, stored[:, 1])
    # plain xarray shows the same coordinates
    plain = xr.open_datatree(str(labelled), engine="zarr")["tract"].ds
    np.testing.assert_array_equal(
        plain.estimate.sel(votingage="18 years and over").values, stored[:, 1]
    )
    assert "votingage_code" in plain.estimate.coords


def test_no_name_is_a_dataset_attribute_and_levels_are_coarsest_first(labelled) -> None:
    tree = dpdask.open_release(labelled)
    assert list(tree.children) == ["state", "county", "tract"]
    assert tree.attrs["levels"] == ["state", "county", "tract"]  # for other readers
    assert list(xr.open_datatree(str(labelled), engine="zarr").children) == [
        "county",
        "state",
        "tract",
    ]  # fmt: skip  (what plain xarray does: alphabetical)
    for node in tree.subtree:
        clash = {n for n in _names(node.ds) if hasattr(xr.Dataset, n)}
        assert not clash, (node.path, clash)
    ds = tree["tract"].ds
    assert ds.answers.dims == ("geography", "workload_query")
    assert ds.workload_query.values[0] == "votingage_001"
    assert str(ds.query_description.sel(workload_query="votingage_002").values) == (
        "votingage=18 years and over"
    )


def test_entries_level_names_its_axes_in_the_domain_order(tmp_path, rng, monkeypatch) -> None:
    """A level published as entries (top-down) shows its estimate with the domain's axes
    in the domain's order, by name: oracle, the true counts of a release without noise
    (the store lists the attributes alphabetically: hisp before votingage)."""
    from dpdask.graph import _output_sparse

    monkeypatch.setattr(_output_sparse, "DENSE_ESTIMATE_CELLS", 0)
    geo = Geography(
        levels=("state", "county", "tract"), ids=ZERO_IDS,
        parents=(np.zeros(2, dtype=int), np.array([0, 0, 1])),
    )  # fmt: skip
    counts = rng.integers(0, 50, size=(3, 2, 2, 3))
    st = write_store(tmp_path / "in.zarr", counts, LABELLED, geo, geo_chunk=2)
    A = Kron([Identity(2), Identity(2), Identity(3)])
    budget = zCDP(1)
    plan = DensePlan(A, A, LABELLED, "gaussian", budget.gaussian_sigma(1.0), budget)
    r = release(
        plan, st, reconstruct="topdown", release_id="entries", key=SecretKey.for_testing(2),
        noise=False, test_mode=True,
    )  # fmt: skip
    tree = dpdask.open_release(r.to_zarr(tmp_path / "entries.zarr"))
    tract = tree["tract"].ds
    assert "entry_offsets" in tract and tract.estimate.dims == ("geography", *LABELLED.attrs)
    one = tract.estimate.sel(votingage="18 years and over", hisp="Hispanic or Latino")
    np.testing.assert_allclose(one.data.compute().todense(), counts[:, 1, 1], atol=1e-4)
    np.testing.assert_allclose(
        tract.estimate.sel(votingage="Under 18 years").data.compute().todense(),
        counts[:, 0],
        atol=1e-4,
    )


def test_an_attribute_named_like_a_dataset_method_is_renamed(tmp_path, rng) -> None:
    domain = Domain(count=2, b=3)  # xarray.Dataset.count
    geo = Geography(levels=("state", "county"), ids=(("s",), ("c0", "c1")),
                    parents=(np.zeros(2, dtype=int),))  # fmt: skip
    counts = rng.integers(0, 50, size=(2, 2, 3))
    st = write_store(tmp_path / "in.zarr", counts, domain, geo)
    A = Kron([Identity(2), Identity(3)])
    budget = zCDP(1)
    plan = DensePlan(A, A, domain, "gaussian", budget.gaussian_sigma(1.0), budget)
    r = release(
        plan, st, release_id="count", key=SecretKey.for_testing(3), noise=False, test_mode=True
    )
    ds = dpdask.open_release(r.to_zarr(tmp_path / "count.zarr"))["county"].ds
    assert ds.estimate.dims == ("geography", "count_attr", "b")
    assert not {n for n in _names(ds) if hasattr(xr.Dataset, n)}
    np.testing.assert_allclose(ds.estimate.sel(count_attr=1).values, counts[:, 1], atol=1e-6)


def _old_layout(new: pathlib.Path, old: pathlib.Path) -> None:
    """``new`` rewritten as releases were before: the workload's dimension ``query``,
    category names in ``<attr>_label`` and the values as the attribute's index."""
    import warnings

    src = zarr.open_group(str(new), mode="r")
    dst = zarr.open_group(str(old), mode="w", zarr_format=3)
    dst.attrs.update(dict(src.attrs))
    for lv, g in src.groups():
        out = dst.create_group(lv)
        out.attrs.update(dict(g.attrs))
        for name, arr in g.arrays():
            data = arr[...]
            dims = tuple(
                "query" if d == "workload_query" else d for d in arr.metadata.dimension_names
            )
            attrs = dict(arr.attrs)
            if "coordinates" in attrs:
                attrs["coordinates"] = attrs["coordinates"].replace("_code", "_label")
            if name.endswith("_code"):
                continue
            if f"{name}_code" in g:  # a labelled attribute
                out.create_array(f"{name}_label", shape=data.shape, dtype=str,
                                 dimension_names=dims)[:] = data  # fmt: skip
                data = g[f"{name}_code"][:]
            name = "query" if name == "workload_query" else name
            dtype = str if data.dtype.kind in "UTO" else data.dtype
            out.create_array(name, shape=data.shape, dtype=dtype, dimension_names=dims,
                             attributes=attrs)[...] = data  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(old))


def test_older_releases_read_with_the_current_names(labelled, tmp_path) -> None:
    old = tmp_path / "old.zarr"
    _old_layout(labelled, old)
    g = zarr.open_group(str(old), mode="r")["tract"]
    assert g["answers"].metadata.dimension_names == ("geography", "query")
    assert "votingage_label" in g and g["votingage"].dtype == np.int64
    before, now = dpdask.open_release(old), dpdask.open_release(labelled)
    for lv in ("state", "county", "tract"):
        xr.testing.assert_equal(before[lv].ds, now[lv].ds)
    assert before["tract"].ds.sel(votingage="18 years and over").estimate.shape == (3, 2, 3)
    # exports and reports read both layouts
    pd.testing.assert_frame_equal(release_table(old, "tract"), release_table(labelled, "tract"))
    from dpdask.report import report_data

    assert report_data(old)["tables"] == report_data(labelled)["tables"]
    assert {r["kind"] for r in report_data(old)["tables"]} == {"part"}


def test_csv_ids_keep_leading_zeros_and_exports_carry_provenance(labelled, tmp_path) -> None:
    import pyarrow.parquet as pq

    attrs = zarr.open_group(str(labelled), mode="r").attrs
    record = attrs["dpdask"]
    csv = tmp_path / "tract.csv"
    assert main(["export", str(labelled), "--level", "tract", "--format", "csv",
                 "--out", str(csv)]) == 0  # fmt: skip
    df = pd.read_csv(csv)  # no options
    ids = [f"tract:{u}" for u in ZERO_IDS[2] for _ in range(2 + 12)]
    assert df["geography"].tolist() == ids
    assert df["parent"].tolist()[0] == "county:01001"
    assert df["label"].tolist()[:2] == ["votingage=Under 18 years", "votingage=18 years and over"]
    side = json.loads((tmp_path / "tract.csv-metadata.json").read_text())
    assert side["url"] == "tract.csv"
    assert [c["name"] for c in side["tableSchema"]["columns"]] == list(COLUMNS)
    prov = side["dpdask"]
    assert prov["release"] == "labelled" and prov["run_id"] == record["run_id"]
    assert prov["budget"] == attrs["budget"] and prov["dpdask_version"] == record["dpdask_version"]
    assert prov["ledger_head"] == record["ledger"]["head"] and prov["ledger_head"]
    assert prov["levels"] == ["state", "county", "tract"] and prov["rows"] == len(df)
    # the state level: no parent column values; a county id of all digits stays a string
    top = tmp_path / "state.csv"
    assert main(["export", str(labelled), "--level", "state", "--format", "csv",
                 "--out", str(top)]) == 0  # fmt: skip
    state = pd.read_csv(top)
    assert set(state["geography"]) == {"state:01"} and state["parent"].isna().all()
    # plain ids: exact with dtype=str, as the metadata says
    plain = tmp_path / "plain.csv"
    assert main(["export", str(labelled), "--level", "tract", "--format", "csv",
                 "--out", str(plain), "--ids", "plain"]) == 0  # fmt: skip
    assert (
        "dtype" in json.loads((tmp_path / "plain.csv-metadata.json").read_text())["dpdask"]["ids"]
    )
    back = pd.read_csv(plain, dtype={"geography": str, "parent": str})
    assert back["geography"].tolist() == [i.split(":", 1)[1] for i in ids]
    # Parquet: bare ids as strings, provenance in the key-value metadata
    pqt = tmp_path / "tract.parquet"
    assert main(["export", str(labelled), "--level", "tract", "--out", str(pqt)]) == 0
    meta = pq.read_schema(pqt).metadata
    assert meta[b"release"] == b"labelled" and meta[b"run_id"].decode() == record["run_id"]
    assert json.loads(meta[b"budget"]) == attrs["budget"]
    assert meta[b"dpdask_version"].decode() == record["dpdask_version"]
    assert meta[b"ledger_head"].decode() == record["ledger"]["head"]
    assert json.loads(meta[b"dpdask"])["levels"] == ["state", "county", "tract"]
    table = pd.read_parquet(pqt)
    assert table["geography"].tolist() == back["geography"].tolist()
    pd.testing.assert_frame_equal(table, release_table(labelled, "tract"))
    # an existing metadata file is not replaced without --overwrite, and nothing is written
    csv.unlink()
    assert main(["export", str(labelled), "--level", "tract", "--format", "csv",
                 "--out", str(csv)]) == 4  # fmt: skip
    assert not csv.exists()


# -- labels -----------------------------------------------------------------------------
def test_query_labels_count_within_parts() -> None:
    W = pl94()
    labels = query_labels(W)
    assert len(labels) == len(set(labels)) == 319
    assert labels[:4] == ["votingage_001", "votingage_002", "hisp_001", "hisp_002"]
    assert labels[4:10] == [f"race-single_{j:03d}" for j in range(1, 7)]
    assert labels[10] == "race-multiple_001" and labels[66] == "race-multiple_057"
    assert labels[67] == "identity_001" and labels[-1] == "identity_252"
    d = query_descriptions(W, census.pl94_domain())
    assert d[1] == "votingage=18 years and over"
    assert d[5] == "race=Black or African American"
    assert d[67] == "votingage=Under 18 years, hisp=Not Hispanic or Latino, race=White"
    assert query_labels(Identity(3)) == ["query_001", "query_002", "query_003"]
    assert query_labels(VStack([Identity(2), Total(2)])) == ["part1_001", "part1_002", "part2_001"]


def test_sf1_labels_are_census_cells() -> None:
    # SF1's parts are Census tables, some in several products: cells count on across them
    W = sf1_persons(census.cph_domain(), tables=["P1", "P12", "P8"])
    labels = query_labels(W)
    assert labels[0] == "P1_001"
    p12 = [lab for lab in labels if lab.startswith("P12_")]
    assert p12 == [f"P12_{j:03d}" for j in range(1, 50)]
    assert [lab for lab in labels if lab.startswith("P8_")][-1] == "P8_071"
    d = dict(zip(labels, query_descriptions(W, census.cph_domain()), strict=True))
    assert d["P1_001"] == "total" and d["P12_002"] == "sex=Male"
    assert d["P12_003"] == "sex=Male, age=0..4"


def test_pl94_tables_follow_the_census_line_order() -> None:
    domain = census.pl94_domain()
    labels, descriptions, Q = pl94_tables(domain)
    assert Q.shape == (288, 252) and len(labels) == len(set(labels)) == 288
    row = dict(zip(labels, range(288), strict=True))
    desc = dict(zip(labels, descriptions, strict=True))
    assert [desc[f"P1_{j:03d}"] for j in (1, 2, 3, 9, 10, 11, 26, 71)] == [
        "Total", "Population of one race", "White alone", "Two or more races",
        "Population of two races", "White; Black or African American",
        "Population of three races", census.race_label(62),
    ]  # fmt: skip
    assert desc["P2_002"] == "Hispanic or Latino" and desc["P2_003"] == "Not Hispanic or Latino"
    assert desc["P4_005"] == "18 years and over: Not Hispanic or Latino: White alone"
    # against the data, cell by cell: x[votingage, hisp, race]
    x = np.random.default_rng(0).integers(0, 9, size=domain.shape).astype(float)
    a = Q.dense() @ x.ravel()
    races = census.race_combinations()
    assert a[row["P1_001"]] == x.sum()
    assert a[row["P1_002"]] == x[:, :, :6].sum()
    assert a[row["P1_004"]] == x[:, :, 1].sum()  # Black alone
    assert a[row["P1_011"]] == x[:, :, races.index((0, 1))].sum()
    assert a[row["P1_070"]] == a[row["P1_071"]] == x[:, :, 62].sum()
    assert a[row["P2_002"]] == x[:, 1].sum() and a[row["P2_003"]] == x[:, 0].sum()
    assert a[row["P2_005"]] == x[:, 0, 0].sum()
    assert a[row["P3_001"]] == x[1].sum() and a[row["P3_003"]] == x[1, :, 0].sum()
    assert a[row["P4_002"]] == x[1, 1].sum() and a[row["P4_073"]] == x[1, 0, 62]
    # the P1 race lines are SF1's P8 (the same Census tabulation)
    p8 = sf1_persons(census.cph_domain(), tables=["P8"]).parts[0].factors[2].dense()
    np.testing.assert_array_equal(Q.parts[0].factors[2].dense(), p8)


def test_category_labels() -> None:
    labels = category_labels(census.cph_domain())
    assert labels["sex"] == ["Male", "Female"] and labels["age"] is None
    assert labels["race"][0] == "White" and len(labels["relation"]) == 17
    assert category_labels(Domain(race=5))["race"] is None  # not the Census coding


# -- the README's release ----------------------------------------------------------------
@pytest.fixture
def readme_spec(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load((ROOT / "pipelines" / "pl94-providence.yaml").read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["output"] = str(tmp_path / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_readme_release_lookup_from_python_and_export(readme_spec, tmp_path, capsys) -> None:
    assert main(["run", str(readme_spec), "--json", "--no-progress"]) == 0
    out = pathlib.Path(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["output"])
    tree = xr.open_datatree(str(out), engine="zarr")
    assert set(tree.children) == {"state", "county", "tract", "block_group", "block"}
    assert tree.attrs["workload"]["name"] == "pl94" and tree.attrs["workload"]["queries"] == 319
    assert tree.attrs["strategy"]["template"] and tree.attrs["dataset"]
    opened = dpdask.open_release(out)
    assert tuple(opened.children) == ("state", "county", "tract", "block_group", "block")
    tract = opened["tract"].dataset
    unit = tract.sel(geography="44007000101")
    assert str(unit.parent_id.values) == "44007"
    answer = float(unit.table_answers.sel(table_query="P1_001"))
    moe = float(unit.table_moe90.sel(table_query="P1_001"))
    assert str(unit.table_description.sel(table_query="P1_001").values) == "Total"
    # the oracle: each query's row applied densely to the tract's published estimate
    x = unit.estimate.values  # (votingage, hisp, race)
    assert answer == pytest.approx(x.sum(), rel=1e-12)
    assert moe == pytest.approx(
        1.645 * np.sqrt(float(unit.table_variance.sel(table_query="P1_001")))
    )
    assert 0 < moe < 0.05 * answer
    assert float(unit.table_answers.sel(table_query="P1_003")) == pytest.approx(x[:, :, 0].sum())
    assert float(unit.table_answers.sel(table_query="P4_005")) == pytest.approx(x[1, 0, 0])
    W = pl94().dense()
    np.testing.assert_allclose(unit.answers.values, W @ x.ravel(), rtol=1e-10, atol=1e-8)
    # categories by name (the example), codes beside them; no name is a method
    for node in opened.subtree:
        assert not {n for n in _names(node.ds) if hasattr(xr.Dataset, n)}, node.path
    adults = opened["tract"].ds.sel(votingage="18 years and over")
    np.testing.assert_array_equal(adults.estimate.values, tract.estimate.values[:, 1])
    assert list(tract.votingage_code.values) == [0, 1]
    assert list(tract.race.values) == [census.race_label(i) for i in range(63)]
    white = float(unit.estimate.sel(race="White").sum())
    assert white == pytest.approx(float(unit.table_answers.sel(table_query="P1_003")))
    # a workload row and the table cell it is: same answer, same variance by two routes
    same = unit.sel(workload_query="race-single_001", table_query="P1_003")
    assert float(same.answers) == pytest.approx(float(same.table_answers))
    assert float(same.variance) == pytest.approx(float(same.table_variance), rel=1e-9)
    # from the command line
    assert main(["export", str(out), "--level", "tract", "--format", "csv", "--out", "-",
                 "--query", "P1_001", "--geography", "44007000101"]) == 0  # fmt: skip
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(df["geography"]) == ["tract:44007000101"] and list(df["query"]) == ["P1_001"]
    assert list(df["label"]) == ["Total"]
    assert df["answer"][0] == pytest.approx(answer, rel=1e-15)
    assert df["moe90"][0] == pytest.approx(moe, rel=1e-15)
    pq = tmp_path / "tract.parquet"
    assert main(["export", str(out), "--level", "tract", "--format", "parquet",
                 "--out", str(pq)]) == 0  # fmt: skip
    full = pd.read_parquet(pq)
    assert len(full) == 7 * (319 + 288)
    hit = full[(full["geography"] == "44007000101") & (full["query"] == "P1_001")]
    assert hit["answer"].tolist() == [answer] and hit["moe90"].tolist() == [moe]
