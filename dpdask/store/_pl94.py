"""The Census P.L. 94-171 redistricting summary file (2020 or 2010 format) at block level.

A state's file is a geographic header and data segments, one row per geographic unit,
joined on the logical record number LOGRECNO (the formats: :mod:`._pl94_files`).
Segment 1 holds tables P1 (race, all ages) and P2 (Hispanic or Latino, and not
Hispanic by race); segment 2 holds P3 and P4 (the same for the population 18 years
and over) and H1 (housing units: total, occupied, vacant); in the 2020 format segment 3
holds P5 (the group-quarters population by major type). This module reads the blocks
(summary level 750) into the PL94 domain of :func:`dpdask.census.pl94_domain`::

    votingage (0 under 18, 1 18 and over) x hisp (0 not Hispanic, 1 Hispanic) x race (63)

from the identities, for every race combination ``r``:

* not Hispanic, all ages = P2[r];  Hispanic, all ages = P1[r] - P2[r];
* not Hispanic, 18+ = P4[r];       Hispanic, 18+ = P3[r] - P4[r];
* under 18 = all ages - 18+ (for each Hispanic origin).

The column of race combination ``r`` in P1 and P3 is :data:`P1_RACE_COLUMNS` ``[r]``;
P2 and P4 have two more lines in front (Hispanic, not Hispanic), so their column is
``P1_RACE_COLUMNS[r] + 2``.

**This 252-cell domain is the richest the public file supports.** P5 counts the
group-quarters population of a block by type, but is not crossed with age, Hispanic
origin or race, so the 2,016-cell ``pl94-full`` histogram (hhgq x voting age x
Hispanic x race) cannot be filled from it. H1 and P5 are kept instead as public block
attributes of the store (:mod:`._attributes`): ``housing_units`` and
``occupied_units`` (H1 lines 1, 2) and, from a 2020 file, ``gq_population``
(persons by :data:`dpdask.census.HHGQ` type: column 0 the household population, P1's
total less P5's, columns 1..7 P5 lines 3, 4, 5, 6, 8, 9, 10). A 2010 file has no P5:
its blocks carry no ``gq_population``.

The file is checked before anything is returned: the segments must cover the same
records, the race lines must add up to each table's totals, H1's occupied and vacant
units to its total, P5's types to its institutional, non-institutional and total
lines, P5's total may not exceed P1's, and no derived cell may be negative.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpdask.census import pl94_domain, race_combinations
from dpdask.domain import Domain, Geography
from dpdask.errors import DataError
from dpdask.store._pl94_files import SEG_LOGRECNO, line_values, open_folder

__all__ = [
    "P1_RACE_COLUMNS",
    "P5_HHGQ_LINES",
    "PL94_LEVELS",
    "PL94File",
    "pl94_geography",
    "read_pl94",
    "read_pl94_file",
]

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
_P1_LINES, _P2_LINES, _P3_LINES, _P4_LINES, _H1_LINES, _P5_LINES = 71, 73, 71, 73, 3, 10

P5_HHGQ_LINES: tuple[int, ...] = (3, 4, 5, 6, 8, 9, 10)
"""P5 line of each group-quarters type 1..7 of :data:`dpdask.census.HHGQ`: correctional
facilities for adults, juvenile facilities, nursing facilities, other institutional;
college housing, military quarters, other non-institutional. Line 1 is the total,
2 the institutional subtotal (3..6), 7 the non-institutional one (8..10)."""

PL94_LEVELS: dict[str, int] = {"state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}
"""GEOID prefix length of each level of the P.L. 94-171 block hierarchy."""


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
        _check_parts(table, line, parts, name, ids, what="the race lines")


@dataclass(frozen=True, eq=False)
class PL94File:
    """What :func:`read_pl94_file` reads from a P.L. 94-171 summary file.

    Attributes
    ----------
    counts : ndarray
        int64 ``(n_blocks, 2, 2, 63)``: persons by voting age, Hispanic origin and
        race, rows in the order of the geography's blocks.
    domain : Domain
        ``pl94_domain()``.
    geography : Geography
        state > county > tract > block_group > block (:data:`PL94_LEVELS`).
    unit_attributes : dict of str to ndarray
        Public block attributes, rows as ``counts``: ``housing_units``,
        ``occupied_units`` and (2020 files with segment 3) ``gq_population``.
    vintage : str
        ``"2020"`` or ``"2010"``: the format the files were read in.
    """

    counts: npt.NDArray[np.int64]
    domain: Domain
    geography: Geography
    unit_attributes: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    vintage: str = "2020"


def _check_parts(
    table: npt.NDArray[np.int64],
    total: int,
    parts: list[int] | npt.NDArray[np.int64],
    name: str,
    ids: npt.NDArray[np.str_],
    what: str = "",
) -> None:
    """Lines ``parts`` of every block add up to line ``total`` (else a DataError naming
    the first block that fails)."""
    diff = table[:, parts].sum(axis=1) - table[:, total]
    if diff.any():
        i = int(np.flatnonzero(diff)[0])
        what = what or f"lines {list(map(int, parts))}"
        raise DataError(
            f"table {name} of block {ids[i]}: {what} add up to "
            f"{table[i, parts].sum()} but line {total} says {table[i, total]}"
        )


def _gq_population(
    p5: npt.NDArray[np.int64], p1_total: npt.NDArray[np.int64], ids: npt.NDArray[np.str_]
) -> npt.NDArray[np.int64]:
    """P5 checked and as persons by hhgq type (household: P1 total less P5 total)."""
    _check_parts(p5, 2, [3, 4, 5, 6], "P5", ids)
    _check_parts(p5, 7, [8, 9, 10], "P5", ids)
    _check_parts(p5, 1, [2, 7], "P5", ids)
    over = p5[:, 1] > p1_total
    if over.any():
        i = int(np.argmax(over))
        raise DataError(
            f"table P5 of block {ids[i]}: line 1 says {p5[i, 1]} persons in group quarters "
            f"but P1 line 1 says the block has {p1_total[i]}"
        )
    return np.column_stack([p1_total - p5[:, 1], p5[:, list(P5_HHGQ_LINES)]])


def read_pl94_file(folder: str | os.PathLike[str]) -> PL94File:
    """Read a P.L. 94-171 summary file (2020 or 2010 format) into block-level PL94
    counts and public block attributes.

    Parameters
    ----------
    folder : str or path-like
        Folder with the geographic header (``*geo*.pl``) and data segments 1 and 2
        (``*00001*.pl``, ``*00002*.pl``) and, for P5 in the 2020 format, 3
        (``*00003*.pl``) of one state. The format is told from the header.

    Returns
    -------
    PL94File

    Raises
    ------
    FileNotFoundError
        If ``folder`` does not exist.
    dpdask.errors.DataError
        If a file is missing or malformed, the segments disagree on the blocks, the
        lines of a table do not add up to its totals, P5's total exceeds P1's, or a
        derived cell is negative (the message names the file, block and line).

    Examples
    --------
    >>> f = read_pl94_file("examples/data/pl94_providence")  # doctest: +SKIP
    >>> f.vintage, sorted(f.unit_attributes)  # doctest: +SKIP
    ('2020', ['gq_population', 'housing_units', 'occupied_units'])
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no P.L. 94-171 folder at {folder}")
    files = open_folder(folder)
    logrecno, geocode = files.blocks()
    tables = []
    layout = [(1, ("P1", "P2")), (2, ("P3", "P4", "H1"))]
    if files.segments[2] is not None:
        layout.append((3, ("P5",)))
    sizes = {"P1": _P1_LINES, "P2": _P2_LINES, "P3": _P3_LINES, "P4": _P4_LINES}
    sizes.update(H1=_H1_LINES, P5=_P5_LINES)
    for k, names in layout:
        n_fields = [sizes[name] for name in names]
        seg, path = files.segment(k, SEG_LOGRECNO + 1 + sum(n_fields), logrecno, geocode)
        first = SEG_LOGRECNO + 1
        for n, name in zip(n_fields, names, strict=True):
            tables.append(line_values(seg, first, n, name, path))
            first += n
    p1, p2, p3, p4, h1 = tables[:5]
    for table, name, first_race in ((p1, "P1", 3), (p2, "P2", 5), (p3, "P3", 3), (p4, "P4", 5)):
        _check_sums(table, name, first_race, geocode)
    for table, name in ((p2, "P2"), (p4, "P4")):
        _check_parts(table, 1, [2, 3], name, geocode)
    _check_parts(h1, 1, [2, 3], "H1", geocode)
    attributes = {"housing_units": h1[:, 1], "occupied_units": h1[:, 2]}
    if len(tables) > 5:
        attributes["gq_population"] = _gq_population(tables[5], p1[:, 1], geocode)

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
    geography = _blocks_geography(geocode, files.geo.name)
    order = pd.Index(geocode).get_indexer(list(geography.ids[-1]))
    ordered = {name: values[order] for name, values in attributes.items()}
    return PL94File(cells[order], pl94_domain(), geography, ordered, files.vintage)


def pl94_geography(folder: str | os.PathLike[str]) -> Geography:
    """The blocks' geography of a P.L. 94-171 summary file from its geographic header
    alone (public: the Census geography, no counts read), as :func:`read_pl94_file`
    builds it.

    Raises
    ------
    FileNotFoundError
        If ``folder`` does not exist.
    dpdask.errors.DataError
        If the header is missing or malformed, or block GEOIDs repeat.
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no P.L. 94-171 folder at {folder}")
    files = open_folder(folder)
    _, geocode = files.blocks()
    return _blocks_geography(geocode, files.geo.name)


def _blocks_geography(geocode: npt.NDArray[np.str_], header: str) -> Geography:
    """The geography of the blocks ``geocode`` (GEOIDs), refusing repeated ones."""
    geography = Geography.from_geoids(geocode, PL94_LEVELS)
    if geography.n_units() != len(geocode):
        raise DataError(f"{header}: block GEOIDs repeat")
    return geography


def read_pl94(folder: str | os.PathLike[str]) -> tuple[npt.NDArray[np.int64], Domain, Geography]:
    """Read a P.L. 94-171 summary file (2020 or 2010 format) into block-level PL94 counts.

    The counts, domain and geography of :func:`read_pl94_file` (which also gives the
    blocks' housing units and group-quarters population).

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
        As :func:`read_pl94_file`.

    Examples
    --------
    >>> counts, domain, geography = read_pl94("examples/data/pl94_providence")  # doctest: +SKIP
    >>> counts.shape, int(counts.sum())  # doctest: +SKIP
    ((569, 2, 2, 63), 614053)
    """
    read = read_pl94_file(folder)
    return read.counts, read.domain, read.geography
