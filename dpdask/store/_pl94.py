"""The Census P.L. 94-171 redistricting summary file (2020 format) at block level.

A state's file is a geographic header (``<st>geo<year>.pl``) and three pipe-delimited
data segments (``<st>00001<year>.pl`` ...), one row per geographic unit, joined on the
logical record number LOGRECNO. Segment 1 holds tables P1 (race, all ages) and P2
(Hispanic or Latino, and not Hispanic by race); segment 2 holds P3 and P4 (the same
for the population 18 years and over) and H1. This module reads the blocks (summary
level 750) into the PL94 domain of :func:`dpdask.census.pl94_domain`::

    votingage (0 under 18, 1 18 and over) x hisp (0 not Hispanic, 1 Hispanic) x race (63)

from the identities, for every race combination ``r``:

* not Hispanic, all ages = P2[r];  Hispanic, all ages = P1[r] - P2[r];
* not Hispanic, 18+ = P4[r];       Hispanic, 18+ = P3[r] - P4[r];
* under 18 = all ages - 18+ (for each Hispanic origin).

The column of race combination ``r`` in P1 and P3 is :data:`P1_RACE_COLUMNS` ``[r]``;
P2 and P4 have two more lines in front (Hispanic, not Hispanic), so their column is
``P1_RACE_COLUMNS[r] + 2``. The file is checked before anything is returned: the
segments must cover the same records, the race lines must add up to each table's
totals, and no derived cell may be negative.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpdask.census import pl94_domain, race_combinations
from dpdask.domain import Domain, Geography
from dpdask.errors import DataError

__all__ = ["P1_RACE_COLUMNS", "PL94_LEVELS", "read_pl94"]

P1_RACE_COLUMNS: tuple[int, ...] = (
    *range(3, 9),  # P0010003-P0010008: the six races alone (P0010002 is their subtotal)
    *range(11, 26),  # P0010011-P0010025: two races (P0010009 two or more, P0010010 two)
    *range(27, 47),  # P0010027-P0010046: three races (P0010026 their subtotal)
    *range(48, 63),  # P0010048-P0010062: four races (P0010047)
    *range(64, 70),  # P0010064-P0010069: five races (P0010063)
    71,  # P0010071: all six races (P0010070)
)
"""1-based P1 (and P3) line of each race combination, in ``race_combinations()`` order.

Table P1 lists the combinations by number of races, each group after a subtotal line
and, within a group, in the Census order of the races (White; Black or African
American; American Indian and Alaska Native; Asian; Native Hawaiian and Other Pacific
Islander; Some Other Race), which is the order of
:func:`dpdask.census.race_combinations`.
"""

_P1_SUBTOTALS = {2: 1, 10: 2, 26: 3, 47: 4, 63: 5, 70: 6}  # subtotal line -> number of races
_P1_LINES, _P2_LINES, _P3_LINES, _P4_LINES = 71, 73, 71, 73

PL94_LEVELS: dict[str, int] = {"state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}
"""GEOID prefix length of each level of the P.L. 94-171 block hierarchy."""

_BLOCK_SUMLEV = "750"
_GEO_SUMLEV, _GEO_GEOCOMP, _GEO_LOGRECNO, _GEO_GEOCODE = 2, 4, 7, 9
_SEG_LOGRECNO = 4  # FILEID, STUSAB, CHARITER, CIFSN, LOGRECNO, then the table lines


def _one(folder: pathlib.Path, pattern: str, what: str) -> pathlib.Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise DataError(
            f"{folder}: expected one {what} file matching {pattern!r}, found "
            f"{[p.name for p in found] or 'none'}"
        )
    return found[0]


def _read_pipe(path: pathlib.Path, min_fields: int) -> pd.DataFrame:
    table = pd.read_csv(
        path, sep="|", header=None, dtype=str, keep_default_na=False, encoding="latin-1"
    )
    if table.shape[1] < min_fields:
        raise DataError(f"{path.name}: {table.shape[1]} fields per line, expected {min_fields}")
    return table


def _lines(
    segment: pd.DataFrame, first: int, n: int, name: str, path: pathlib.Path
) -> npt.NDArray[np.int64]:
    """Table lines ``1..n`` (1-based) starting at field ``first``, as int64 (rows, n + 1)."""
    block = segment.iloc[:, first : first + n]
    try:
        values = block.to_numpy(dtype=np.int64)
    except ValueError:
        bad = ~block.apply(lambda c: c.str.fullmatch(r"\d+")).to_numpy()
        r, c = np.argwhere(bad)[0]
        raise DataError(
            f"{path.name}: table {name} line {c + 1} of LOGRECNO "
            f"{segment.iloc[r, _SEG_LOGRECNO]} is {block.iat[r, c]!r}, not a count"
        ) from None
    return np.concatenate([np.zeros((len(values), 1), np.int64), values], axis=1)


def _check_sums(
    table: npt.NDArray[np.int64], name: str, first_race: int, ids: npt.NDArray[np.str_]
) -> None:
    """Race lines add up to the subtotal lines and the total of a P1-shaped table."""
    cols = np.asarray(P1_RACE_COLUMNS) + first_race - 3
    sizes = np.array([len(c) for c in race_combinations()])
    checks = [(first_race - 2, cols)]  # the total of the race part
    for line, k in _P1_SUBTOTALS.items():
        checks.append((line + first_race - 3, cols[sizes == k]))
    checks.append((first_race + 6, cols[sizes >= 2]))  # "two or more races"
    for line, parts in checks:
        diff = table[:, parts].sum(axis=1) - table[:, line]
        if diff.any():
            i = int(np.flatnonzero(diff)[0])
            raise DataError(
                f"table {name} of block {ids[i]}: the race lines add up to "
                f"{table[i, parts].sum()} but line {line} says {table[i, line]}"
            )


def read_pl94(folder: str | os.PathLike[str]) -> tuple[npt.NDArray[np.int64], Domain, Geography]:
    """Read a P.L. 94-171 summary file (2020 format) into block-level PL94 counts.

    Parameters
    ----------
    folder : str or path-like
        Folder with the geographic header (``*geo*.pl``) and data segments 1 and 2
        (``*00001*.pl``, ``*00002*.pl``) of one state.

    Returns
    -------
    counts : ndarray
        int64, shape ``(n_blocks, 2, 2, 63)``: persons by voting age, Hispanic
        origin and race in every block, rows in the order of the geography's blocks.
    domain : Domain
        ``pl94_domain()``: votingage 2, hisp 2, race 63.
    geography : Geography
        state > county > tract > block_group > block, from the blocks' GEOIDs
        (:data:`PL94_LEVELS`).

    Raises
    ------
    FileNotFoundError
        If ``folder`` does not exist.
    dpdask.errors.DataError
        If a file is missing or malformed, the segments disagree on the blocks, the
        race lines do not add up to the totals, or a derived cell is negative (the
        message names the file, block and line).

    Examples
    --------
    >>> counts, domain, geography = read_pl94("examples/data/pl94_providence")  # doctest: +SKIP
    >>> counts.shape, int(counts.sum())  # doctest: +SKIP
    ((569, 2, 2, 63), 614053)
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no P.L. 94-171 folder at {folder}")
    geo_path = _one(folder, "*geo*.pl", "geographic header")
    seg_paths = [_one(folder, f"*0000{k}*.pl", f"segment {k}") for k in (1, 2)]
    geo = _read_pipe(geo_path, _GEO_GEOCODE + 1)
    blocks = geo[(geo[_GEO_SUMLEV] == _BLOCK_SUMLEV) & (geo[_GEO_GEOCOMP] == "00")]
    if blocks.empty:
        raise DataError(f"{geo_path.name}: no block records (summary level {_BLOCK_SUMLEV})")
    logrecno = blocks[_GEO_LOGRECNO].to_numpy()
    geocode = blocks[_GEO_GEOCODE].to_numpy().astype(str)

    tables = []
    for path, n_fields, names in (
        (seg_paths[0], (_P1_LINES, _P2_LINES), ("P1", "P2")),
        (seg_paths[1], (_P3_LINES, _P4_LINES), ("P3", "P4")),
    ):
        seg = _read_pipe(path, _SEG_LOGRECNO + 1 + sum(n_fields))
        index = pd.Index(seg[_SEG_LOGRECNO])
        if not index.is_unique:
            raise DataError(f"{path.name}: LOGRECNO values repeat")
        pos = index.get_indexer(logrecno)
        if (pos < 0).any():
            raise DataError(
                f"{path.name}: no record for block {geocode[np.argmax(pos < 0)]} "
                f"(LOGRECNO {logrecno[np.argmax(pos < 0)]})"
            )
        seg = seg.iloc[pos]
        first = _SEG_LOGRECNO + 1
        for n, name in zip(n_fields, names, strict=True):
            tables.append(_lines(seg, first, n, name, path))
            first += n
    p1, p2, p3, p4 = tables
    for table, name, first_race in ((p1, "P1", 3), (p2, "P2", 5), (p3, "P3", 3), (p4, "P4", 5)):
        _check_sums(table, name, first_race, geocode)
    for table, name in ((p2, "P2"), (p4, "P4")):
        if (table[:, 2] + table[:, 3] != table[:, 1]).any():
            i = int(np.flatnonzero(table[:, 2] + table[:, 3] != table[:, 1])[0])
            raise DataError(f"table {name} of block {geocode[i]}: Hispanic + not != total")

    race = np.asarray(P1_RACE_COLUMNS)
    nonhisp_all, hisp_all = p2[:, race + 2], p1[:, race] - p2[:, race + 2]
    nonhisp_adult, hisp_adult = p4[:, race + 2], p3[:, race] - p4[:, race + 2]
    cells = np.stack(
        [
            np.stack([nonhisp_all - nonhisp_adult, hisp_all - hisp_adult], axis=1),
            np.stack([nonhisp_adult, hisp_adult], axis=1),
        ],
        axis=1,
    )  # (block, votingage, hisp, race)
    if (cells < 0).any():
        b, v, h, r = (int(i) for i in np.argwhere(cells < 0)[0])
        raise DataError(
            f"block {geocode[b]}: derived count {cells[b, v, h, r]} < 0 for votingage={v}, "
            f"hisp={h}, race={r} (P1..P4 lines {race[r]} / {race[r] + 2} disagree)"
        )
    geography = Geography.from_geoids(geocode, PL94_LEVELS)
    if geography.n_units() != len(geocode):
        raise DataError(f"{geo_path.name}: block GEOIDs repeat")
    order = pd.Index(geocode).get_indexer(list(geography.ids[-1]))
    return cells[order], pl94_domain(), geography
