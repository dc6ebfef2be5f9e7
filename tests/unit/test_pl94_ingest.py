"""The P.L. 94-171 reader in both formats, with H1 and P5 as block attributes.

Oracle for the 2010 reader: the shipped 2020 Providence file turned into the 2010
layout by a converter written here (fixed-width header from the 2020 GEOCODE,
comma-delimited segments, P5 dropped); both readers must agree on counts, geography
and housing units. P5 and H1 are checked against the 2020 file's own subtotal lines.
"""

from __future__ import annotations

import csv
import pathlib
import shutil

import numpy as np
import pytest

from dpdask.census import HHGQ
from dpdask.errors import DataError
from dpdask.store import pl94_geography, read_pl94, read_pl94_file
from tests import ROOT

EXAMPLE = ROOT / "examples" / "data" / "pl94_providence"
GEO, SEG1, SEG2, SEG3 = (
    "rigeo2018_2020Style.pl",
    "ri000012018_2020Style.pl",
    "ri000022018_2020Style.pl",
    "ri000032018_2020Style.pl",
)


def _rows(path: pathlib.Path, sep: str = "|") -> list[list[str]]:
    with open(path, encoding="latin-1", newline="") as f:
        return list(csv.reader(f, delimiter=sep))


def _fixed(fields: dict[int, str], width: int = 500) -> str:
    """A fixed-width line: ``fields`` maps a 1-based start column to its text."""
    line = [" "] * width
    for start, text in fields.items():
        line[start - 1 : start - 1 + len(text)] = list(text)
    return "".join(line)


def to_2010(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """The 2020-format folder ``src`` rewritten in the 2010 layout into ``dst``."""
    dst.mkdir()
    lines = []
    for r in _rows(src / GEO):
        sumlev, logrecno, code = r[2], r[7], r[9]
        fields = {1: "PLST", 7: r[1], 9: sumlev, 12: r[4], 14: "000", 17: "00"}
        fields |= {19: logrecno.zfill(7), 28: code[:2]}
        if len(code) >= 5:
            fields[30] = code[2:5]
        if len(code) >= 11:
            fields[55] = code[5:11]
        if len(code) >= 12:
            fields[61] = code[11]
        if len(code) == 15:
            fields[62] = code[11:15]
        fields |= {319: r[90].rjust(9, "0"), 328: r[91].rjust(9, "0")}
        lines.append(_fixed(fields))
    (dst / "rigeo2010.pl").write_text("\r\n".join(lines) + "\r\n", encoding="latin-1")
    for k, seg in ((1, SEG1), (2, SEG2)):
        out = []
        for r in _rows(src / seg):
            out.append(",".join(["PLST", r[1], "000", f"{k:02d}", r[4].zfill(7), *r[5:]]))
        (dst / f"ri0000{k}2010.pl").write_text("\r\n".join(out) + "\r\n", encoding="latin-1")
    return dst


@pytest.fixture(scope="module")
def pl2020():
    return read_pl94_file(EXAMPLE)


@pytest.fixture(scope="module")
def folder2010(tmp_path_factory):
    return to_2010(EXAMPLE, tmp_path_factory.mktemp("pl") / "ri2010")


def _by_geocode(path: pathlib.Path, sumlev: str = "750") -> dict[str, list[str]]:
    geo = {r[7]: r[9] for r in _rows(EXAMPLE / GEO) if r[2] == sumlev and r[4] == "00"}
    return {geo[r[4]]: r for r in _rows(path) if r[4] in geo}


def test_2020_h1_and_p5_are_the_files_lines(pl2020):
    """H1 lines 1, 2 and P5's type lines per block, typed from the table shells."""
    ids = pl2020.geography.ids[-1]
    seg2, seg3 = _by_geocode(EXAMPLE / SEG2), _by_geocode(EXAMPLE / SEG3)
    h1 = np.array([[int(v) for v in seg2[u][5 + 71 + 73 :]] for u in ids])
    p5 = np.array([[int(v) for v in seg3[u][5:]] for u in ids])
    assert h1.shape[1] == 3 and p5.shape[1] == 10
    attrs = pl2020.unit_attributes
    np.testing.assert_array_equal(attrs["housing_units"], h1[:, 0])
    np.testing.assert_array_equal(attrs["occupied_units"], h1[:, 1])
    np.testing.assert_array_equal(h1[:, 1] + h1[:, 2], h1[:, 0])  # occupied + vacant
    gq = attrs["gq_population"]
    assert gq.shape == (len(ids), len(HHGQ)) and gq.dtype == np.int64
    # P5: 1 total = 2 institutional + 7 non-institutional; 2 = 3..6; 7 = 8..10
    np.testing.assert_array_equal(p5[:, 1] + p5[:, 6], p5[:, 0])
    np.testing.assert_array_equal(p5[:, 2:6].sum(axis=1), p5[:, 1])
    np.testing.assert_array_equal(p5[:, 7:10].sum(axis=1), p5[:, 6])
    np.testing.assert_array_equal(gq[:, 1:], p5[:, [2, 3, 4, 5, 7, 8, 9]])
    persons = pl2020.counts.reshape(len(ids), -1).sum(axis=1)
    np.testing.assert_array_equal(gq.sum(axis=1), persons)
    np.testing.assert_array_equal(gq[:, 0], persons - p5[:, 0])
    assert gq[:, 1:].sum() > 0  # the file has group quarters: the test can fail


def test_2010_layout_reads_the_same_blocks(pl2020, folder2010):
    got = read_pl94_file(folder2010)
    assert (got.vintage, pl2020.vintage) == ("2010", "2020")
    np.testing.assert_array_equal(got.counts, pl2020.counts)
    assert got.domain == pl2020.domain and got.geography == pl2020.geography
    assert sorted(got.unit_attributes) == ["housing_units", "occupied_units"]  # no P5 in 2010
    for name in got.unit_attributes:
        np.testing.assert_array_equal(got.unit_attributes[name], pl2020.unit_attributes[name])
    counts, domain, geography = read_pl94(folder2010)  # the old API reads 2010 files too
    np.testing.assert_array_equal(counts, pl2020.counts)
    assert (domain, geography) == (pl2020.domain, pl2020.geography)


def test_the_geography_alone_is_the_readers(pl2020, folder2010, tmp_path):
    """The header alone (what ``dpdask plan`` reads) gives the full reader's geography,
    in both layouts."""
    assert pl94_geography(EXAMPLE) == pl2020.geography
    assert pl94_geography(folder2010) == pl2020.geography
    with pytest.raises(FileNotFoundError, match=r"no P\.L\. 94-171 folder"):
        pl94_geography(tmp_path / "nowhere")


def test_2010_block_ids_come_from_the_fixed_columns(folder2010):
    """Oracle: GEOIDs cut from the header's columns by hand (STATE 28, COUNTY 30, TRACT 55,
    BLOCK 62), not by the reader."""
    lines = (folder2010 / "rigeo2010.pl").read_text(encoding="latin-1").splitlines()
    expected = sorted(ln[27:32] + ln[54:60] + ln[61:65] for ln in lines if ln[8:11] == "750")
    assert list(read_pl94_file(folder2010).geography.ids[-1]) == expected


# -- malformed input ----------------------------------------------------------------


def _copy(src: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(src, tmp_path / "copy"))


def _a_block(folder: pathlib.Path) -> tuple[str, str]:
    """(LOGRECNO, GEOCODE) of a populated block with housing units, of the 2020 header."""
    for r in _rows(folder / GEO):
        if r[2] == "750" and int(r[90]) > 20 and int(r[91]) > 5:
            return r[7], r[9]
    raise AssertionError("no populated block")  # pragma: no cover


def _edit(path: pathlib.Path, sep: str, logrecno: str, field: int, value: str) -> None:
    lines = path.read_text(encoding="latin-1").splitlines()
    for i, line in enumerate(lines):
        parts = line.split(sep)
        if parts[4].lstrip("0") == logrecno:
            parts[field] = value
            lines[i] = sep.join(parts)
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")


H1_FIELD = 5 + 71 + 73  # H1 line 1 in segment 2


@pytest.mark.parametrize("vintage", ["2020", "2010"])
def test_bad_count_is_named(tmp_path, folder2010, vintage):
    logrecno, _ = _a_block(EXAMPLE)
    folder = _copy(EXAMPLE if vintage == "2020" else folder2010, tmp_path)
    sep, seg = ("|", SEG2) if vintage == "2020" else (",", "ri000022010.pl")
    _edit(folder / seg, sep, logrecno, H1_FIELD + 1, "-3")
    with pytest.raises(DataError, match=f"table H1 line 2 of LOGRECNO 0*{logrecno} is "):
        read_pl94_file(folder)


@pytest.mark.parametrize("vintage", ["2020", "2010"])
def test_h1_subtotal_mismatch_is_named(tmp_path, folder2010, vintage):
    logrecno, code = _a_block(EXAMPLE)
    folder = _copy(EXAMPLE if vintage == "2020" else folder2010, tmp_path)
    sep, seg = ("|", SEG2) if vintage == "2020" else (",", "ri000022010.pl")
    row = _by_geocode(EXAMPLE / SEG2)[code]
    _edit(folder / seg, sep, logrecno, H1_FIELD + 2, str(int(row[H1_FIELD + 2]) + 1))
    with pytest.raises(DataError, match=f"table H1 of block {code}: lines"):
        read_pl94_file(folder)


def test_missing_block_in_2010_segment_is_named(tmp_path, folder2010):
    logrecno, code = _a_block(EXAMPLE)
    folder = _copy(folder2010, tmp_path)
    seg = folder / "ri000012010.pl"
    kept = [ln for ln in seg.read_text().splitlines() if ln.split(",")[4].lstrip("0") != logrecno]
    seg.write_text("\n".join(kept) + "\n")
    with pytest.raises(DataError, match=f"ri000012010.pl: no record for block {code}"):
        read_pl94_file(folder)


def test_p5_subtotal_mismatch_and_excess_are_named(tmp_path):
    logrecno, code = _a_block(EXAMPLE)
    folder = _copy(EXAMPLE, tmp_path)
    row = _by_geocode(EXAMPLE / SEG3)[code]
    _edit(folder / SEG3, "|", logrecno, 5 + 9, str(int(row[5 + 9]) + 1))  # P5 line 10
    with pytest.raises(DataError, match=f"table P5 of block {code}: lines \\[8, 9, 10\\]"):
        read_pl94_file(folder)
    # every P5 line consistent, but more persons in group quarters than P1 says live there
    total = int(_by_geocode(EXAMPLE / SEG1)[code][5])
    for field, value in ((5, total + 1), (6, 0), (7, 0), (8, 0), (9, 0), (10, 0)):
        _edit(folder / SEG3, "|", logrecno, field, str(value))
    for field, value in ((11, total + 1), (12, 0), (13, 0), (14, total + 1)):
        _edit(folder / SEG3, "|", logrecno, field, str(value))
    with pytest.raises(DataError, match=f"table P5 of block {code}: line 1 says {total + 1}"):
        read_pl94_file(folder)


def test_unreadable_header_is_refused(tmp_path):
    folder = _copy(EXAMPLE, tmp_path)
    (folder / GEO).write_text("not a header\n")
    with pytest.raises(DataError, match=r"neither a 2020 .* nor a 2010"):
        read_pl94_file(folder)


def test_short_2010_header_line_is_named(tmp_path, folder2010):
    folder = _copy(folder2010, tmp_path)
    geo = folder / "rigeo2010.pl"
    lines = geo.read_text(encoding="latin-1").splitlines()
    lines[3] = lines[3][:40]
    geo.write_text("\n".join(lines) + "\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"rigeo2010\.pl: line 4 has 40 characters"):
        read_pl94_file(folder)


def test_2020_without_segment_3_has_no_gq_population(tmp_path, pl2020):
    folder = _copy(EXAMPLE, tmp_path)
    (folder / SEG3).unlink()
    got = read_pl94_file(folder)
    assert sorted(got.unit_attributes) == ["housing_units", "occupied_units"]
    np.testing.assert_array_equal(got.counts, pl2020.counts)
