"""The Rhode Island 2010 block reader and its release spec, on the real file.

The oracle is the CSV read again here with the ``csv`` module: every block's cells
against its row, and every coarser level against the sums of its blocks' rows by
GEOID prefix. The data (ALARM Project, CC BY-SA 4.0) is in ``../shared/data``.
"""

from __future__ import annotations

import csv
import json
import pathlib
from collections import defaultdict

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.errors import DataError
from dpdask.pipeline import load_spec
from dpdask.store import RI2010_LEVELS, aggregate, read_ri2010
from dpdask.workloads import ri2010_domain
from tests import ROOT, requires_shared_data, shared_data

pytestmark = requires_shared_data

SPEC = ROOT / "pipelines" / "ri2010-topdown.yaml"
GROUPS = ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two")


def _csv() -> pathlib.Path:
    return shared_data("ri_2010_blocks", "ri_2010_block.csv")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    with open(_csv(), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def blocks():
    return read_ri2010(shared_data("ri_2010_blocks"))


def _cells(row: dict[str, str]) -> np.ndarray:
    vap = [int(row[f"vap_{g}"]) for g in GROUPS]
    return np.array([[int(row[f"pop_{g}"]) - v for g, v in zip(GROUPS, vap, strict=True)], vap])


def test_domain_and_geography(blocks):
    counts, domain, geo = blocks
    assert domain == ri2010_domain() == load_spec(SPEC).domain
    assert counts.shape == (25_181, 2, 8) and counts.dtype == np.int64 and counts.min() >= 0
    assert geo.levels == ("state", "county", "tract", "block_group", "block")
    assert [geo.n_units(lv) for lv in geo.levels] == [1, 5, 244, 815, 25_181]
    for k, (level, width) in enumerate(RI2010_LEVELS.items()):
        ids = geo.ids[k]
        assert all(len(i) == width for i in ids) and list(ids) == sorted(ids)
        if k:
            parents = np.asarray(geo.ids[k - 1])[geo.parents[k - 1]]
            assert [i[: len(p)] for i, p in zip(ids, parents, strict=True)] == list(parents), level
    assert geo.ids[0] == ("44",)


def test_blocks_are_the_file_rows(blocks, rows):
    counts, _, geo = blocks
    by_id = {r["GEOID"]: r for r in rows}
    assert sorted(by_id) == list(geo.ids[-1])
    for i, block in enumerate(geo.ids[-1]):
        np.testing.assert_array_equal(counts[i], _cells(by_id[block]), err_msg=block)


def test_totals_and_every_level_adds_up(blocks, rows):
    counts, _, geo = blocks
    assert int(counts.sum()) == 1_052_567 == sum(int(r["pop"]) for r in rows)
    assert int(counts[:, 1].sum()) == sum(int(r["vap"]) for r in rows)
    for k, (level, width) in enumerate(RI2010_LEVELS.items()):
        expected: dict[str, np.ndarray] = defaultdict(lambda: np.zeros((2, 8), np.int64))
        for r in rows:
            expected[r["GEOID"][:width]] += _cells(r)
        got = aggregate(counts, geo, level).compute()
        assert got.dtype.kind in "iu" or np.array_equal(got, np.round(got))
        assert sorted(expected) == list(geo.ids[k])
        for unit, x in zip(geo.ids[k], got, strict=True):
            np.testing.assert_array_equal(x, expected[unit], err_msg=f"{level} {unit}")
        assert int(got.sum()) == 1_052_567


# -- fail closed on damaged files ------------------------------------------------------
def _sample(tmp_path: pathlib.Path, rows, edit=None, n: int = 30) -> pathlib.Path:
    """The header and the first ``n`` populated rows of the file, the fourth edited
    (``edit(row, first_row)``): line 5 of the sample."""
    with open(_csv(), newline="") as f:
        header = next(csv.reader(f))
    chosen = [dict(r) for r in rows if int(r["pop"]) > 10][:n]
    if edit is not None:
        edit(chosen[3], chosen[0])
    path = tmp_path / "ri.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(chosen)
    return path


def _add(column: str, delta: int):
    def edit(row: dict[str, str], first: dict[str, str]) -> None:
        row[column] = str(int(row[column]) + delta)

    return edit


def _put(column: str, value: str):
    def edit(row: dict[str, str], first: dict[str, str]) -> None:
        row[column] = value

    return edit


def _more_adults_than_persons(row: dict[str, str], first: dict[str, str]) -> None:
    """Move a voting-age person to a group with no one under 18: every sum stays right."""
    g = next(g for g in GROUPS if row[f"pop_{g}"] == row[f"vap_{g}"])
    h = next(h for h in GROUPS if h != g and int(row[f"vap_{h}"]) > 0)
    row[f"vap_{g}"] = str(int(row[f"vap_{g}"]) + 1)
    row[f"vap_{h}"] = str(int(row[f"vap_{h}"]) - 1)


def _repeat_first(row: dict[str, str], first: dict[str, str]) -> None:
    row["GEOID"] = first["GEOID"]


def test_a_sample_reads(tmp_path, rows):
    counts, _, geo = read_ri2010(_sample(tmp_path, rows))
    assert counts.shape == (30, 2, 8) and geo.n_units("state") == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_add("pop_white", 1), r"pop_white \+ .* \+ pop_two = \d+ but pop = \d+"),
        (_add("vap_hisp", 1), r"vap_white \+ .* \+ vap_two = \d+ but vap = \d+"),
        (_add("pop", -1), r"pop_white \+ .* but pop = \d+"),
        (_more_adults_than_persons, r"vap_\w+ = \d+ is more than pop_\w+ = \d+"),
        (_put("pop_asian", "2.5"), r"pop_asian is '2\.5', not a count"),
        (_put("vap_black", "NA"), r"vap_black is 'NA', not a count"),
        (_put("vap_white", "-1"), r"vap_white is '-1', a negative count"),
        (_put("GEOID", "4400103010010"), r"a block GEOID must be 15 digits"),
        (_repeat_first, r"GEOID repeats an earlier block"),
    ],
)
def test_damaged_row_is_named(tmp_path, rows, edit, message):
    path = _sample(tmp_path, rows, edit)
    with open(path, newline="") as f:
        geoid = list(csv.DictReader(f))[3]["GEOID"]
    with pytest.raises(DataError, match=rf"ri\.csv: line 5 \(GEOID '{geoid}'\): {message}"):
        read_ri2010(path)


def test_missing_column_and_missing_file(tmp_path, rows):
    path = _sample(tmp_path, rows)
    path.write_text(path.read_text().replace(",pop_nhpi,", ",pop_nh,", 1))
    with pytest.raises(DataError, match=r"ri\.csv: missing column\(s\) \['pop_nhpi'\]"):
        read_ri2010(path)
    with pytest.raises(FileNotFoundError, match="no Rhode Island 2010 block file"):
        read_ri2010(tmp_path / "absent")


# -- the release spec --------------------------------------------------------------------
def _spec_copy(tmp_path: pathlib.Path, **changes) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(load_spec(SPEC).data.path)
    raw["output"] = str(tmp_path / "out" / "ri.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_spec_reads_the_shared_file_and_validates(tmp_path, capsys):
    spec = load_spec(SPEC)
    assert spec.data.format == "ri2010" and spec.data.path == _csv().resolve()
    assert spec.levels == ("state", "county", "tract", "block_group", "block")
    assert main(["validate", str(_spec_copy(tmp_path)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["workload_queries"] == 27
    assert report["units"] == {
        "state": 1, "county": 5, "tract": 244, "block_group": 815, "block": 25_181,
    }  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_the_spec_says_when_the_data_is_absent(tmp_path, capsys):
    folder = tmp_path / "elsewhere" / "pipelines"
    folder.mkdir(parents=True)
    spec = folder / SPEC.name
    spec.write_text(SPEC.read_text())
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.path:" in err[0] and "ri_2010_blocks does not exist" in err[0]


def test_a_few_tracts_release_and_add_up(tmp_path, rows, capsys):
    """A small release of the spec's kind: three tracts, every level, published."""
    tracts = sorted({r["GEOID"][:11] for r in rows})[:3]
    with open(_csv(), newline="") as f:
        header = next(csv.reader(f))
    data = tmp_path / "ri_2010_block.csv"
    with open(data, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(r for r in rows if r["GEOID"][:11] in tracts)
    cluster = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    spec = _spec_copy(tmp_path, cluster=cluster)
    raw = yaml.safe_load(spec.read_text())
    raw["data"]["path"] = str(tmp_path)  # the folder: its ri_2010_block.csv is read
    raw["data"]["id"] = "ri-2010-three-tracts"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    g = zarr.open_group(summary["output"], mode="r")
    counts, _, geo = read_ri2010(data)
    for k in range(1, len(geo.levels)):
        child, parent = geo.levels[k], geo.levels[k - 1]
        x, y = g[f"{child}/estimate"][:], g[f"{parent}/estimate"][:]
        assert x.shape == (geo.n_units(child), 2, 8)
        sums = np.zeros_like(y)
        np.add.at(sums, g[f"{child}/parent"][:], x)
        np.testing.assert_allclose(sums, y, atol=1e-6, err_msg=child)
    truth = int(counts.sum())
    assert abs(float(g["state/estimate"][:].sum()) - truth) < 0.05 * truth
