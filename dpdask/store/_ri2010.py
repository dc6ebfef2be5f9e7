"""Rhode Island 2010 block populations by voting age and race/ethnicity.

The file is ``ri_2010_block.csv`` of the ALARM Project's census-2020 data
(alarm-redist, licensed CC BY-SA 4.0; keep its attribution and license beside any
copy): one row per 2010 Census block, ``GEOID`` = state (2) county (3) tract (6)
block (4) digits, and, besides election columns this module ignores,

* ``pop`` and ``pop_white``, ``pop_black``, ``pop_hisp``, ``pop_aian``, ``pop_asian``,
  ``pop_nhpi``, ``pop_other``, ``pop_two``: persons of all ages by eight mutually
  exclusive race/ethnicity groups (Hispanic or Latino, and the six races alone and
  two or more races of the population that is not Hispanic or Latino);
* ``vap`` and ``vap_white`` .. ``vap_two``: the same for the voting-age population
  (18 and over).

This module reads it into the domain :func:`dpdask.workloads.ri2010_domain`::

    votingage (0 under 18 = pop_g - vap_g, 1 18 and over = vap_g) x raceeth (8)

with the groups ``g`` in the file's column order (:data:`~dpdask.workloads.ri2010.RACEETH`),
and the geography state > county > tract > block_group > block from the GEOIDs (a
block group is its tract and the first digit of the block number). The file is
checked before anything is returned: every count an integer >= 0, the groups adding up
to ``pop`` and to ``vap``, ``vap <= pop`` in every group, GEOIDs of 15 digits without
repeats; a :class:`~dpdask.errors.DataError` names the first bad row otherwise.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpdask.domain import Domain, Geography
from dpdask.errors import DataError
from dpdask.workloads.ri2010 import RACEETH, ri2010_domain

__all__ = ["RI2010_FILE", "RI2010_LEVELS", "read_ri2010", "ri2010_csv"]

RI2010_FILE = "ri_2010_block.csv"
"""The name of the block file in the ALARM Project's ``ri_2010_blocks`` folder."""

RI2010_LEVELS: dict[str, int] = {
    "state": 2,
    "county": 5,
    "tract": 11,
    "block_group": 12,
    "block": 15,
}
"""GEOID prefix length of each level of the 2010 block hierarchy."""

_UNIVERSES = ("pop", "vap")


def ri2010_csv(path: str | os.PathLike[str]) -> pathlib.Path:
    """The block file a path names: ``path`` itself, or :data:`RI2010_FILE` in a folder.

    Parameters
    ----------
    path : str or path-like
        The CSV file or the folder holding it (the folder need not exist).

    Returns
    -------
    pathlib.Path
        ``path / RI2010_FILE`` when ``path`` is a folder, else ``path``.
    """
    path = pathlib.Path(path)
    return path / RI2010_FILE if path.is_dir() else path


def _where(table: pd.DataFrame, i: int) -> str:
    """A row named by its line in the file (the header is line 1) and its GEOID."""
    return f"line {i + 2} (GEOID {table['GEOID'].iat[i]!r})"


def _counts(table: pd.DataFrame, columns: list[str], path: pathlib.Path) -> npt.NDArray[np.int64]:
    """The columns as int64 ``(rows, len(columns))``; a DataError names a value that is
    not an integer count."""
    text = table[columns]
    ok = text.apply(lambda c: c.str.fullmatch(r"\d+")).to_numpy(dtype=bool)
    if not ok.all():
        r, c = (int(v) for v in np.argwhere(~ok)[0])
        value = text.iat[r, c]
        what = (
            "a negative count" if value.startswith("-") and value[1:].isdigit() else "not a count"
        )
        raise DataError(
            f"{path.name}: {_where(table, r)}: {columns[c]} is {value!r}, {what} "
            "(counts are integers >= 0)"
        )
    return np.asarray(text.to_numpy(dtype=np.int64), dtype=np.int64)


def read_ri2010(path: str | os.PathLike[str]) -> tuple[npt.NDArray[np.int64], Domain, Geography]:
    """Read the Rhode Island 2010 block file into block counts by voting age and race.

    Parameters
    ----------
    path : str or path-like
        ``ri_2010_block.csv``, or the folder holding it (``ri_2010_blocks``).

    Returns
    -------
    counts : ndarray
        int64, shape ``(n_blocks, 2, 8)``: persons by voting age (under 18, 18 and
        over) and race/ethnicity in every block, rows in the order of the
        geography's blocks.
    domain : Domain
        :func:`~dpdask.workloads.ri2010_domain`: votingage 2, raceeth 8.
    geography : Geography
        state > county > tract > block_group > block from the GEOIDs
        (:data:`RI2010_LEVELS`); unit ids are GEOID prefixes.

    Raises
    ------
    FileNotFoundError
        If there is no such file (or no :data:`RI2010_FILE` in the folder).
    DataError
        If a column is missing, a count is not an integer >= 0, the groups do not add
        up to ``pop`` or ``vap``, a group has more voting-age persons than persons, or
        a GEOID is malformed or repeated (the message names the file's line and GEOID).

    Examples
    --------
    >>> counts, domain, geo = read_ri2010("../shared/data/ri_2010_blocks")  # doctest: +SKIP
    >>> counts.shape, int(counts.sum())  # doctest: +SKIP
    ((25181, 2, 8), 1052567)
    """
    csv = ri2010_csv(path)
    if not csv.is_file():
        raise FileNotFoundError(f"no Rhode Island 2010 block file at {csv}")
    groups = {u: [f"{u}_{g}" for g in RACEETH] for u in _UNIVERSES}
    needed = ["GEOID", *_UNIVERSES, *groups["pop"], *groups["vap"]]
    header = pd.read_csv(csv, nrows=0).columns
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataError(f"{csv.name}: missing column(s) {missing}")
    table = pd.read_csv(csv, usecols=needed, dtype=str, keep_default_na=False)
    if table.empty:
        raise DataError(f"{csv.name}: no blocks")

    geoid = table["GEOID"].str.strip()
    bad = ~geoid.str.fullmatch(r"\d{15}").to_numpy(dtype=bool)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{csv.name}: {_where(table, i)}: a block GEOID must be 15 digits")
    repeated = geoid.duplicated().to_numpy()
    if repeated.any():
        i = int(np.argmax(repeated))
        raise DataError(f"{csv.name}: {_where(table, i)}: GEOID repeats an earlier block")

    cells = {}
    for u in _UNIVERSES:
        total = _counts(table, [u], csv)[:, 0]
        cells[u] = _counts(table, groups[u], csv)
        diff = cells[u].sum(axis=1) != total
        if diff.any():
            i = int(np.argmax(diff))
            raise DataError(
                f"{csv.name}: {_where(table, i)}: {' + '.join(groups[u])} = "
                f"{int(cells[u][i].sum())} but {u} = {int(total[i])}"
            )
    under18 = cells["pop"] - cells["vap"]
    if (under18 < 0).any():
        i, g = (int(v) for v in np.argwhere(under18 < 0)[0])
        raise DataError(
            f"{csv.name}: {_where(table, i)}: vap_{RACEETH[g]} = {int(cells['vap'][i, g])} "
            f"is more than pop_{RACEETH[g]} = {int(cells['pop'][i, g])}"
        )
    counts = np.stack([under18, cells["vap"]], axis=1)  # (block, votingage, raceeth)
    ids = geoid.to_numpy().astype(str)
    geography = Geography.from_geoids(ids, RI2010_LEVELS)
    order = pd.Index(ids).get_indexer(list(geography.ids[-1]))
    return counts[order], ri2010_domain(), geography
