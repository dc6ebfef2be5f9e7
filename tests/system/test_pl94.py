"""The P.L. 94-171 reader against the file's own published rows at every summary level."""

from __future__ import annotations

import csv
import pathlib
import shutil

import numpy as np
import pytest

from dpdask.census import pl94_domain, race_label
from dpdask.errors import DataError
from dpdask.store import P1_RACE_COLUMNS, aggregate, read_pl94, read_store, write_store
from tests import ROOT, requires_shared_data, shared_data

EXAMPLE = ROOT / "examples" / "data" / "pl94_providence"
GEO, SEG1, SEG2 = "rigeo2018_2020Style.pl", "ri000012018_2020Style.pl", "ri000022018_2020Style.pl"

# P1 lines of the 63 race combinations, typed from the 2020 P.L. 94-171 table shells:
# subtotal lines (2 one race, 9 two or more, 10 two, 26 three, 47 four, 63 five, 70 six) skipped.
P1_LINES = [3, 4, 5, 6, 7, 8]
P1_LINES += [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]
P1_LINES += list(range(27, 47)) + list(range(48, 63)) + [64, 65, 66, 67, 68, 69, 71]

# (P1 line, label in the table shell) for a sample of lines of every group
P1_LABELS = [
    (3, "White"),
    (4, "Black or African American"),
    (8, "Some Other Race"),
    (11, "White; Black or African American"),
    (15, "White; Some Other Race"),
    (16, "Black or African American; American Indian and Alaska Native"),
    (25, "Native Hawaiian and Other Pacific Islander; Some Other Race"),
    (27, "White; Black or African American; American Indian and Alaska Native"),
    (37, "Black or African American; American Indian and Alaska Native; Asian"),
    (46, "Asian; Native Hawaiian and Other Pacific Islander; Some Other Race"),
    (48, "White; Black or African American; American Indian and Alaska Native; Asian"),
    (
        62,
        "American Indian and Alaska Native; Asian; Native Hawaiian and Other Pacific "
        "Islander; Some Other Race",
    ),
    (
        64,
        "White; Black or African American; American Indian and Alaska Native; Asian; "
        "Native Hawaiian and Other Pacific Islander",
    ),
    (
        69,
        "Black or African American; American Indian and Alaska Native; Asian; Native "
        "Hawaiian and Other Pacific Islander; Some Other Race",
    ),
    (
        71,
        "White; Black or African American; American Indian and Alaska Native; Asian; "
        "Native Hawaiian and Other Pacific Islander; Some Other Race",
    ),
]


def published(folder: pathlib.Path) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """{sumlev: {geocode: {"P1": lines, ...}}} read with the csv module (index 0 unused)."""
    with open(folder / GEO, encoding="latin-1") as f:
        geo = {r[7]: (r[2], r[9], int(r[90])) for r in csv.reader(f, delimiter="|")}
    out: dict = {}
    for seg, tables in ((SEG1, (("P1", 71), ("P2", 73))), (SEG2, (("P3", 71), ("P4", 73)))):
        with open(folder / seg, encoding="latin-1") as f:
            for r in csv.reader(f, delimiter="|"):
                sumlev, code, pop100 = geo[r[4]]
                entry = out.setdefault(sumlev, {}).setdefault(code, {"POP100": pop100})
                pos = 5
                for name, n in tables:
                    entry[name] = np.array([0] + [int(v) for v in r[pos : pos + n]])
                    pos += n
    return out


def tables_from_cells(x: np.ndarray) -> dict[str, np.ndarray]:
    """P1..P4 race lines and totals implied by (votingage, hisp, race) cells of one unit."""
    return {
        "P1": x.sum(axis=(0, 1)),
        "P2": x[:, 0].sum(axis=0),
        "P3": x[1].sum(axis=0),
        "P4": x[1, 0],
        "P1 total": x.sum(),
        "P2 hispanic": x[:, 1].sum(),
        "P3 total": x[1].sum(),
        "P4 hispanic": x[1, 1].sum(),
    }


def check_against_published(cells: np.ndarray, ids, rows) -> None:
    lines = np.array(P1_LINES)
    for unit, x in zip(ids, cells, strict=True):
        pub, got = rows[unit], tables_from_cells(x)
        np.testing.assert_array_equal(got["P1"], pub["P1"][lines], err_msg=unit)
        np.testing.assert_array_equal(got["P2"], pub["P2"][lines + 2], err_msg=unit)
        np.testing.assert_array_equal(got["P3"], pub["P3"][lines], err_msg=unit)
        np.testing.assert_array_equal(got["P4"], pub["P4"][lines + 2], err_msg=unit)
        assert got["P1 total"] == pub["P1"][1] == pub["POP100"]
        assert got["P2 hispanic"] == pub["P2"][2]
        assert got["P3 total"] == pub["P3"][1]
        assert got["P4 hispanic"] == pub["P4"][2]


@pytest.fixture(scope="module")
def example():
    return read_pl94(EXAMPLE)


def test_race_lines_are_the_census_ones():
    assert list(P1_RACE_COLUMNS) == P1_LINES
    for line, label in P1_LABELS:
        assert race_label(P1_LINES.index(line)) == label


def test_domain_and_hierarchy(example):
    counts, domain, geo = example
    assert domain == pl94_domain() and counts.shape == (569, 2, 2, 63)
    assert geo.levels == ("state", "county", "tract", "block_group", "block")
    assert [geo.n_units(lv) for lv in geo.levels] == [1, 1, 7, 28, 569]
    assert counts.dtype == np.int64 and counts.min() >= 0


@pytest.mark.parametrize(
    ("level", "sumlev"), [("block", "750"), ("block_group", "150"), ("tract", "140")]
)
def test_levels_reproduce_published_tables(example, level, sumlev):
    counts, _, geo = example
    rows = published(EXAMPLE)[sumlev]
    cells = aggregate(counts, geo, level, chunks=50).compute()
    ids = geo.ids[geo.level_index(level)]
    assert sorted(rows) == list(ids)
    check_against_published(cells, ids, rows)


def test_county_total_and_coverage(example):
    """The county's published P1 total is 614,053; the file's blocks cover 7 of its tracts."""
    counts, _, geo = example
    pub = published(EXAMPLE)
    assert pub["050"]["44007"]["P1"][1] == 614_053 == pub["040"]["44"]["POP100"]
    tract_total = sum(r["P1"][1] for r in pub["140"].values())
    county = aggregate(counts, geo, "county").compute()
    assert county.sum() == tract_total == 29_225 < 614_053


@requires_shared_data
def test_shipped_copy_matches_shared_data(example):
    counts, domain, geo = read_pl94(shared_data("pl94_2018e2e_providence"))
    np.testing.assert_array_equal(counts, example[0])
    assert domain == example[1] and geo == example[2]
    for name in (GEO, SEG1, SEG2):
        assert (EXAMPLE / name).read_bytes() == shared_data(
            "pl94_2018e2e_providence", name
        ).read_bytes()


def test_store_round_trip(tmp_path, example):
    write_store(tmp_path / "pl94", *example)
    counts, domain, geo = read_store(tmp_path / "pl94")
    np.testing.assert_array_equal(counts.compute(), example[0])
    assert (domain, geo) == example[1:]


# -- fail closed on damaged files ------------------------------------------------


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "pl"
    shutil.copytree(EXAMPLE, folder)
    return folder


def _edit(path: pathlib.Path, logrecno: str, field: int, value: str) -> None:
    lines = path.read_text(encoding="latin-1").splitlines()
    for i, line in enumerate(lines):
        parts = line.split("|")
        if parts[4] == logrecno:
            parts[field] = value
            lines[i] = "|".join(parts)
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")


def _blocks(folder: pathlib.Path) -> list[tuple[str, str]]:
    """(LOGRECNO, GEOCODE) of the populated blocks."""
    with open(folder / GEO, encoding="latin-1") as f:
        rows = list(csv.reader(f, delimiter="|"))
    return [(r[7], r[9]) for r in rows if r[2] == "750" and int(r[90]) > 20]


def _a_block(folder: pathlib.Path) -> tuple[str, str]:
    return _blocks(folder)[0]


def test_missing_folder_and_segment(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no P\.L\. 94-171 folder"):
        read_pl94(tmp_path / "absent")
    folder = _copy(tmp_path)
    (folder / SEG2).unlink()
    with pytest.raises(DataError, match="expected one segment 2 file"):
        read_pl94(folder)


def test_damaged_value_is_named(tmp_path):
    folder = _copy(tmp_path)
    logrecno, _ = _a_block(folder)
    _edit(folder / SEG1, logrecno, 5 + 2, "x")  # P1 line 3
    with pytest.raises(DataError, match=f"table P1 line 3 of LOGRECNO {logrecno} is 'x'"):
        read_pl94(folder)


def test_inconsistent_subtotal_is_named(tmp_path):
    folder = _copy(tmp_path)
    logrecno, code = _a_block(folder)
    row = published(folder)["750"][code]
    _edit(folder / SEG1, logrecno, 5 + 2, str(row["P1"][3] + 1))
    with pytest.raises(DataError, match=f"table P1 of block {code}: the race lines add up"):
        read_pl94(folder)


def test_negative_derived_cell_is_named(tmp_path):
    """Move a person between two P2 race lines (sums stay right): a Hispanic cell goes < 0."""
    folder = _copy(tmp_path)
    pub = published(folder)["750"]
    singles = np.arange(3, 9)
    for block in _blocks(folder):
        logrecno, code = block
        row = pub[code]
        no_hisp = [c for c in singles if row["P1"][c] == row["P2"][c + 2]]
        donors = [c for c in singles if row["P2"][c + 2] > 0 and c not in no_hisp[:1]]
        if no_hisp and donors:
            break
    r1, r2 = no_hisp[0], donors[0]
    _edit(folder / SEG1, logrecno, 5 + 71 + r1 + 1, str(row["P2"][r1 + 2] + 1))
    _edit(folder / SEG1, logrecno, 5 + 71 + r2 + 1, str(row["P2"][r2 + 2] - 1))
    message = f"block {code}: derived count -1 < 0 .*hisp=1, race={r1 - 3}"
    with pytest.raises(DataError, match=message):
        read_pl94(folder)


def test_block_without_data_record(tmp_path):
    folder = _copy(tmp_path)
    logrecno, code = _a_block(folder)
    lines = (folder / SEG2).read_text(encoding="latin-1").splitlines()
    kept = [ln for ln in lines if ln.split("|")[4] != logrecno]
    (folder / SEG2).write_text("\n".join(kept) + "\n", encoding="latin-1")
    with pytest.raises(DataError, match=f"no record for block {code}"):
        read_pl94(folder)
