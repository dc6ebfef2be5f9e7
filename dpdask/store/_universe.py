"""The public geography universe that person records are counted into.

Which units a release publishes must not depend on who is in the data: a unit
published because one person lives in it reveals that person, and no noise hides
it. Person records are therefore counted into a *universe* declared from public
input (a list of ids, a parent table, a CSV file with one column per level, or a
:class:`~dpdask.Geography`): every unit of the universe is published, with zero
counts where no record falls, and no other unit ever is.

A record is *inside* the universe when its geography id is, exactly (no trimming,
no case folding), a finest unit of it and, when the ids are GEOIDs with prefix
lengths per level, each prefix of the id is that unit's ancestor in the universe at
that level (a block whose GEOID names tract X while the universe puts it in tract Y
is outside). Records outside are either refused, by a
:class:`~dpdask.errors.GeographyUniverseError` that gives only counts (the ids come
from the confidential records, so they are never shown, not even to a log), or
dropped before anything is counted. How many records were dropped is a function of
the data: it is never published, returned or logged.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dpdask.domain import Geography
from dpdask.errors import DataError, GeographyUniverseError, SpecError

__all__ = [
    "UNKNOWN_GEOGRAPHY",
    "Matcher",
    "Universe",
    "geography_universe",
    "outside_error",
    "prefix_levels",
]

UNKNOWN_GEOGRAPHY = ("refuse", "drop")
"""What ``unknown_geography`` may say about records outside the universe."""

Universe: TypeAlias = (
    Geography | Mapping[str, Sequence[str]] | pd.DataFrame | str | os.PathLike[str] | Sequence[str]
)


def prefix_levels(levels: Mapping[str, int]) -> dict[str, int]:
    """GEOID prefix lengths, coarsest (shortest) first whatever the mapping's order (a
    YAML mapping dumped with sorted keys lists ``county`` before ``state``)."""
    for name, width in levels.items():
        if isinstance(width, bool) or not isinstance(width, int | np.integer) or width < 1:
            raise SpecError(f"level {name!r}: prefix length {width!r} is not a positive integer")
    return dict(sorted(((str(k), int(v)) for k, v in levels.items()), key=lambda kv: kv[1]))


def _ids(values: Any, where: str) -> list[str]:
    """Unit ids as given: text only (a YAML ``0101`` read as a number would lose its
    leading zero), none empty or blank."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray | pd.Series):
        raise SpecError(f"{where}: expected a list of ids, got {type(values).__name__}")
    ids = list(values)
    for v in ids:
        if not isinstance(v, str):
            raise SpecError(
                f"{where}: unit id {v!r} is not text; quote ids (e.g. '0101') so that leading "
                "zeros are kept"
            )
        if not v.strip():
            raise SpecError(f"{where}: a unit id is empty")
    return ids


def _read_table(path: pathlib.Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"no geography universe file at {path}")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    if table.empty:
        raise DataError(f"{path}: the geography universe lists no units")
    return table


def geography_universe(
    geographies: Universe,
    levels: Mapping[str, int] | None = None,
    level: str = "geography",
) -> Geography:
    """The geography a declared universe names, checked.

    Parameters
    ----------
    geographies : Geography, parent table, path or sequence of str
        The public universe, one of

        * a :class:`~dpdask.Geography`;
        * a parent table: a mapping ``{level: ids}`` or a DataFrame, one column per
          level (coarsest first), one row per finest unit with its ancestors;
        * the path of a CSV file holding such a table (a header row names the
          levels; every value is read as text);
        * a sequence of finest ids: with ``levels`` their ancestors are their
          prefixes, otherwise they form one level named ``level``.

        Units are sorted by id at every level (a Geography is taken as it is).

        With ``levels`` a table may also have one column only, the finest level's.
    levels : mapping of str to int, optional
        GEOID prefix length of each level (ordered by length, so coarsest first); a
        table's columns must then be these levels (or the finest alone).
    level : str
        The name of the one level of a flat list of ids.

    Returns
    -------
    Geography

    Raises
    ------
    dpdask.errors.SpecError
        If an id is not text, empty or repeated, or the table's levels are not
        ``levels`` (the message names the level or id: the universe is public).
    ValueError
        If a unit has two parents (from :class:`~dpdask.Geography`); a
        :class:`~dpdask.errors.DataError` if the file lists no units.
    FileNotFoundError
        If a path names no file.
    """
    levels = prefix_levels(levels) if levels is not None else None
    if isinstance(geographies, Geography):
        geo = geographies
    elif isinstance(geographies, str | os.PathLike):
        geo = _from_table(_read_table(pathlib.Path(geographies)), levels)
    elif isinstance(geographies, pd.DataFrame | Mapping):
        geo = _from_table(geographies, levels)
    else:
        ids = _ids(geographies, "geographies")
        if not ids:
            raise SpecError("geographies: the universe lists no units")
        if len(set(ids)) != len(ids):
            raise SpecError("geographies: a unit id is repeated")
        geo = Geography.from_geoids(ids, levels) if levels else Geography.flat(sorted(ids), level)
    if levels is not None and geo.levels != tuple(levels):
        raise SpecError(
            f"geographies: the universe's levels {list(geo.levels)} are not the levels "
            f"{list(levels)}"
        )
    return geo


def _from_table(
    table: Mapping[str, Any] | pd.DataFrame, levels: Mapping[str, int] | None
) -> Geography:
    names = [str(c) for c in table.keys()]
    columns = {n: _ids(list(table[n]), f"geographies.{n}") for n in names}
    if not names or not columns[names[-1]]:
        raise SpecError("geographies: the universe lists no units")
    if levels is not None and names == list(levels)[-1:] and len(levels) > 1:
        ids = columns[names[0]]
        if len(set(ids)) != len(ids):
            raise SpecError(f"geographies.{names[0]}: a unit id is repeated")
        return Geography.from_geoids(ids, levels)
    if levels is not None and names != list(levels):
        raise SpecError(
            f"geographies: the universe's columns {names} are not the levels {list(levels)} "
            f"(or the finest, {list(levels)[-1]!r}, alone)"
        )
    return Geography.from_table(columns, names)


@dataclass(frozen=True)
class Matcher:
    """What a scan task needs to place records in the universe (picklable)."""

    levels: tuple[str, ...]
    finest: pa.Array  # the finest units' ids
    prefixes: tuple[tuple[int, pa.Array], ...]  # coarser levels: (width, ancestor of each unit)

    @classmethod
    def of(cls, universe: Geography, levels: Mapping[str, int] | None) -> Matcher:
        """The matcher of ``universe``; with ``levels``, records' prefixes are checked too."""
        checks: list[tuple[int, pa.Array]] = []
        if levels is not None:
            for i, (name, width) in enumerate(list(prefix_levels(levels).items())[:-1]):
                ancestors = np.asarray(universe.ids[i], dtype=object)[universe.ancestor_index(name)]
                checks.append((int(width), pa.array(ancestors, pa.large_string())))
        finest = pa.array(universe.ids[-1], pa.large_string())
        return cls(universe.levels, finest, tuple(checks))

    def locate(self, geo: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Each record's finest unit (-1 outside the universe) and, per level, how many
        records are outside because of that level.

        Parameters
        ----------
        geo : pyarrow string array
            The records' geography ids (null for a missing one).
        """
        found = pc.index_in(geo, value_set=self.finest)
        unit = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)
        per_level = np.zeros(len(self.levels), np.int64)
        per_level[-1] = int((unit < 0).sum())
        known = np.flatnonzero(unit >= 0)
        if self.prefixes and known.size:
            ids, where = geo.take(pa.array(known)), pa.array(unit[known])
            differs = np.zeros(known.size, dtype=bool)
            for i, (width, ancestors) in enumerate(self.prefixes):
                prefix = pc.utf8_slice_codeunits(ids, 0, width)
                wrong = pc.not_equal(prefix, ancestors.take(where))
                level_wrong = np.asarray(wrong.to_numpy(zero_copy_only=False), dtype=bool)
                per_level[i] = int(level_wrong.sum())
                differs |= level_wrong
            unit[known[differs]] = -1
        return unit, per_level


def outside_error(n_outside: int, per_level: Sequence[int], levels: Sequence[str]) -> Exception:
    """The refusal of records outside the universe: counts only, never their ids."""
    parts = []
    for i, (name, n) in enumerate(zip(levels, per_level, strict=True)):
        if n and i == len(levels) - 1:
            parts.append(f"{n:,} whose {name!r} id is not a unit of it")
        elif n:
            parts.append(f"{n:,} whose {name!r} (their id's prefix) is not their unit's parent")
    return GeographyUniverseError(
        f"{n_outside:,} record(s) have a geography outside the declared universe "
        f"({'; '.join(parts)}); their ids are not shown, as they come from the records. "
        "Declare those units in the universe (data.geographies), or write "
        "unknown_geography: drop to leave such records out; nothing was written"
    )
