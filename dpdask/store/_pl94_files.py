"""The files of a P.L. 94-171 summary file folder, in the 2020 or the 2010 format.

Both vintages are a geographic header and data segments joined on the logical record
number LOGRECNO; this module finds them, tells the formats apart and reads their
records, so that :mod:`dpdask.store._pl94` deals with tables only.

* **2020** (``<st>geo2020.pl``, ``<st>00001..3<year>.pl``): every file is
  pipe-delimited. In the header, SUMLEV is field 3, GEOCOMP 5, LOGRECNO 8 and GEOCODE
  (the GEOID without its prefix) 10. Segment 1 holds P1, P2; segment 2 P3, P4, H1;
  segment 3 P5 (group quarters).
* **2010** (``<st>geo2010.pl``, ``<st>000012010.pl``, ``<st>000022010.pl``): the
  header is fixed-width (1-based columns: FILEID 1-6, STUSAB 7-8, SUMLEV 9-11, GEOCOMP
  12-13, CHARITER 14-16, CIFSN 17-18, LOGRECNO 19-25, STATE 28-29, COUNTY 30-32, TRACT
  55-60, BLKGRP 61, BLOCK 62-65; POP100 319-327, HU100 328-336), the segments
  comma-delimited. Segment 1 holds P1, P2; segment 2 P3, P4, H1. There is no P5.

The format is told from the header's first line: a ``|`` makes it 2020, a
fixed-width line starting with the file id 2010. Segments begin with FILEID, STUSAB,
CHARITER, CIFSN and LOGRECNO in both.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpdask.errors import DataError

__all__ = ["BLOCK_SUMLEV", "SEG_LOGRECNO", "PL94Folder", "line_values", "open_folder"]

BLOCK_SUMLEV = "750"
SEG_LOGRECNO = 4  # FILEID, STUSAB, CHARITER, CIFSN, LOGRECNO, then the table lines
_GEO_2020 = {"sumlev": 2, "geocomp": 4, "logrecno": 7, "geocode": 9}  # 0-based fields
# 2010: 0-based [start, stop) slices of the fixed-width header
_GEO_2010 = {
    "sumlev": (8, 11),
    "geocomp": (11, 13),
    "logrecno": (18, 25),
    "state": (27, 29),
    "county": (29, 32),
    "tract": (54, 60),
    "block": (61, 65),
}
_MIN_2010_LINE = 65


def _one(
    folder: pathlib.Path, pattern: str, what: str, required: bool = True
) -> pathlib.Path | None:
    found = sorted(folder.glob(pattern))
    if len(found) > 1 or (required and not found):
        raise DataError(
            f"{folder}: expected one {what} file matching {pattern!r}, found "
            f"{[p.name for p in found] or 'none'}"
        )
    return found[0] if found else None


@dataclass(frozen=True)
class PL94Folder:
    """The files of one state's P.L. 94-171 summary file.

    Attributes
    ----------
    vintage : str
        ``"2020"`` or ``"2010"``.
    geo : pathlib.Path
        The geographic header.
    segments : tuple of (pathlib.Path or None)
        Segments 1, 2 and 3 (``None`` where absent: segment 3 in every 2010 file).
    """

    vintage: str
    geo: pathlib.Path
    segments: tuple[pathlib.Path | None, ...]

    @property
    def sep(self) -> str:
        """The segments' delimiter."""
        return "|" if self.vintage == "2020" else ","

    def blocks(self) -> tuple[npt.NDArray[np.str_], npt.NDArray[np.str_]]:
        """``(logrecno, geoid)`` of every block record (SUMLEV 750, GEOCOMP 00), in file
        order; GEOID is state(2) county(3) tract(6) block(4)."""
        if self.vintage == "2020":
            geo = read_delimited(self.geo, "|", _GEO_2020["geocode"] + 1)
            cols = {k: geo[i] for k, i in _GEO_2020.items()}
            keep = (cols["sumlev"] == BLOCK_SUMLEV) & (cols["geocomp"] == "00")
            logrecno, geoid = cols["logrecno"][keep], cols["geocode"][keep]
        else:
            lines = pd.Series(self.geo.read_text(encoding="latin-1").splitlines())
            short = lines.str.len() < _MIN_2010_LINE
            if short.any():
                raise DataError(
                    f"{self.geo.name}: line {int(np.argmax(short)) + 1} has "
                    f"{len(lines[short].iloc[0])} characters; a 2010 header record has "
                    f"at least {_MIN_2010_LINE}"
                )
            f = {k: lines.str.slice(a, b) for k, (a, b) in _GEO_2010.items()}
            keep = (f["sumlev"] == BLOCK_SUMLEV) & (f["geocomp"] == "00")
            logrecno = f["logrecno"][keep].str.strip().str.lstrip("0")
            geoid = (f["state"] + f["county"] + f["tract"] + f["block"])[keep]
        if not keep.any():
            raise DataError(f"{self.geo.name}: no block records (summary level {BLOCK_SUMLEV})")
        return logrecno.to_numpy().astype(str), geoid.to_numpy().astype(str)

    def segment(
        self, k: int, min_fields: int, logrecno: npt.NDArray[np.str_], ids: npt.NDArray[np.str_]
    ) -> tuple[pd.DataFrame, pathlib.Path]:
        """Segment ``k``'s records of the blocks ``logrecno`` (named ``ids`` in errors), in
        that order."""
        path = self.segments[k - 1]
        if path is None:  # pragma: no cover - callers ask only for present segments
            raise DataError(f"{self.geo.parent}: no segment {k}")
        seg = read_delimited(path, self.sep, min_fields)
        keys = seg[SEG_LOGRECNO].str.strip().str.lstrip("0")
        index = pd.Index(keys)
        if not index.is_unique:
            raise DataError(f"{path.name}: LOGRECNO values repeat")
        pos = index.get_indexer(logrecno)
        if (pos < 0).any():
            i = int(np.argmax(pos < 0))
            raise DataError(f"{path.name}: no record for block {ids[i]} (LOGRECNO {logrecno[i]})")
        return seg.iloc[pos], path


def read_delimited(path: pathlib.Path, sep: str, min_fields: int) -> pd.DataFrame:
    """The file's records as strings, with at least ``min_fields`` fields each."""
    table = pd.read_csv(
        path, sep=sep, header=None, dtype=str, keep_default_na=False, encoding="latin-1"
    )
    if table.shape[1] < min_fields:
        raise DataError(f"{path.name}: {table.shape[1]} fields per line, expected {min_fields}")
    return table


def open_folder(folder: pathlib.Path) -> PL94Folder:
    """Find the header and segments of a folder and tell its format from the header."""
    geo = _one(folder, "*geo*.pl", "geographic header")
    if geo is None:  # pragma: no cover - _one raises when a required file is missing
        raise DataError(f"{folder}: no geographic header")
    with geo.open(encoding="latin-1") as fh:
        first = fh.readline().rstrip("\r\n")
    if "|" in first:
        vintage = "2020"
    elif len(first) >= _MIN_2010_LINE and first[:4].isalpha():
        vintage = "2010"
    else:
        raise DataError(
            f"{geo.name}: neither a 2020 (pipe-delimited) nor a 2010 (fixed-width) "
            "P.L. 94-171 geographic header"
        )
    segments = tuple(
        _one(folder, f"*0000{k}*.pl", f"segment {k}", required=k < 3) for k in (1, 2, 3)
    )
    if vintage == "2010":
        segments = (*segments[:2], None)
    return PL94Folder(vintage, geo, segments)


def line_values(
    segment: pd.DataFrame, first: int, n: int, name: str, path: pathlib.Path
) -> npt.NDArray[np.int64]:
    """Table lines ``1..n`` (1-based) starting at field ``first``, as int64 (rows, n + 1):
    column ``j`` is line ``j`` (column 0 is zero)."""
    block = segment.iloc[:, first : first + n]
    try:
        values = block.apply(lambda c: c.str.strip()).to_numpy(dtype=np.int64)
    except ValueError:
        bad = ~block.apply(lambda c: c.str.strip().str.fullmatch(r"\d+")).to_numpy()
        r, c = np.argwhere(bad)[0]
        raise DataError(
            f"{path.name}: table {name} line {c + 1} of LOGRECNO "
            f"{segment.iloc[r, SEG_LOGRECNO]} is {block.iat[r, c]!r}, not a count"
        ) from None
    if (values < 0).any():
        r, c = np.argwhere(values < 0)[0]
        raise DataError(
            f"{path.name}: table {name} line {c + 1} of LOGRECNO "
            f"{segment.iloc[r, SEG_LOGRECNO]} is {values[r, c]}, not a count"
        )
    return np.concatenate([np.zeros((len(values), 1), np.int64), values], axis=1)
