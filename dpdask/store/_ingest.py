"""Person records (CSV or Parquet) to a data store, validated before anything is written.

Each record carries a geography id and one value per domain attribute. The units the
store holds, and a release from it publishes, are those of a public geography
*universe* declared by the caller (:mod:`dpdask.store._universe`), never those
found in the records: every unit of the universe gets counts (zeros where no record
falls), and a record outside it is refused or, when asked, dropped. Ingestion is two
steps:

1. **scan** (``ingest-scan`` tasks, one per partition of the input, read with
   :mod:`dask.dataframe`): every record is placed in the universe and every value is
   checked against the domain (missing values, values that are not integer codes,
   codes out of range, unknown categories) and the partition's records are counted by
   (unit, cell);
2. **write**: only if no partition found a problem, the counts of every finest unit
   are written to a new store under a temporary name and renamed into place: as
   entries (the sparse layout, straight from the merged (unit, cell) counts) when
   they take less room than the dense array, as at block level on a large domain.

A bad attribute value raises :class:`~dpdask.errors.DataError` naming the column, the value and
the row (records counted from 0 across the input, in read order), with the number of
rows that have problems; records outside the universe raise a
:class:`~dpdask.errors.GeographyUniverseError` giving their number per level only.
Nothing is written and an existing store is untouched.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
from dask.base import compute, tokenize
from dask.delayed import delayed

from dpdask.domain import Domain, Geography
from dpdask.errors import DataError, GeographyUniverseError, SpecError
from dpdask.publish import check_target
from dpdask.store._entries import write_sorted
from dpdask.store._record_values import Column, columns_of, encode, text
from dpdask.store._store import DataStore, open_store
from dpdask.store._store_write import (
    _publish_store,
    check_integer_dtype,
    check_layout,
    choose_layout,
)
from dpdask.store._universe import (
    UNKNOWN_GEOGRAPHY,
    Matcher,
    Universe,
    geography_universe,
    outside_error,
    prefix_levels,
)

if TYPE_CHECKING:
    import dask.dataframe as dd

__all__ = ["RecordSource", "ingest_records"]

_Levels: TypeAlias = (
    Mapping[str, int] | Mapping[str, Sequence[str]] | pd.DataFrame | Geography | None
)
RecordSource: TypeAlias = (
    "str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | pd.DataFrame | dd.DataFrame"
)
"""Person records: a file, a glob pattern or a list of files, or a pandas / dask DataFrame."""


@dataclass(frozen=True)
class _Problem:
    row: int  # within the partition until made global
    column: str
    message: str  # completed with "column ..., row ...: " in front


@dataclass(frozen=True)
class _Scan:
    n_rows: int
    outside: npt.NDArray[np.int64]  # per level, records outside the universe because of it
    n_outside: int
    n_bad: int  # records inside the universe with a bad attribute value
    problem: _Problem | None
    keys: npt.NDArray[np.int64]  # unit * domain.size + cell, unique, sorted
    counts: npt.NDArray[np.int64]


def _scan_partition(
    df: pd.DataFrame,
    geo_column: str,
    columns: tuple[Column, ...],
    shape: tuple[int, ...],
    matcher: Matcher,
    drop: bool,
) -> _Scan:
    """Place one partition's records in the universe, validate and count them.

    Records outside the universe are never counted; without ``drop`` their presence
    alone refuses the input, so the partition's other values are not checked.
    """
    n = len(df)
    unit, outside = matcher.locate(text(df[geo_column]))
    inside = unit >= 0
    n_outside = n - int(inside.sum())
    empty = np.empty(0, np.int64)
    if n_outside and not drop:
        return _Scan(n, outside, n_outside, 0, None, empty, empty)
    rows = np.flatnonzero(inside)
    if n_outside:
        df, unit = df.iloc[rows], unit[rows]
    first: list[_Problem] = []
    bad_any = np.zeros(len(df), dtype=bool)
    cell = np.zeros(len(df), dtype=np.int64)
    for col, size in zip(columns, shape, strict=True):
        codes, bad, reason = encode(df[col.column], col)
        if reason is not None:
            first.append(_Problem(int(rows[np.argmax(bad)]), col.column, reason))
        bad_any |= bad
        cell = cell * size + codes
    n_bad = int(bad_any.sum())
    if n_bad:
        problem = min(first, key=lambda p: p.row)
        return _Scan(n, outside, n_outside, n_bad, problem, empty, empty)
    keys, counts = np.unique(unit * int(np.prod(shape)) + cell, return_counts=True)
    return _Scan(n, outside, n_outside, 0, None, keys, counts.astype(np.int64))


def _read(source: RecordSource, columns: list[str], blocksize: str | int) -> Any:
    """A dask DataFrame of ``columns`` from a path, a list of paths, or a DataFrame."""
    import dask.dataframe as dd

    if isinstance(source, dd.DataFrame):
        ddf = source
    elif isinstance(source, pd.DataFrame):
        parts = max(1, len(source) // 1_000_000 + 1)
        ddf = dd.from_pandas(source, npartitions=parts, sort=False)  # type: ignore[no-untyped-call]
    else:
        paths = [source] if isinstance(source, str | os.PathLike) else list(source)
        if not paths:
            raise DataError("no input files given")
        names = [str(p) for p in paths]
        for name in names:
            if not any(ch in name for ch in "*?[") and not pathlib.Path(name).exists():
                raise FileNotFoundError(f"input file {name} does not exist")
        suffixes = {pathlib.Path(n.removesuffix(".gz")).suffix.lower() for n in names}
        if suffixes <= {".parquet", ".pq", ""} and all(
            pathlib.Path(n).suffix.lower() in (".parquet", ".pq") or pathlib.Path(n).is_dir()
            for n in names
        ):
            ddf = dd.read_parquet(names)
        elif suffixes <= {".csv", ".txt", ".tsv"}:
            sep = "\t" if suffixes == {".tsv"} else ","
            compression = "gzip" if all(n.endswith(".gz") for n in names) else None
            ddf = dd.read_csv(
                names,
                dtype=str,
                na_filter=False,
                sep=sep,
                blocksize=None if compression else blocksize,
                compression=compression,
            )
        else:
            raise DataError(
                f"cannot tell the format of {names[:3]}; use .csv/.tsv (optionally .gz) or "
                ".parquet files, or pass a DataFrame"
            )
    missing = [c for c in columns if c not in ddf.columns]
    if missing:
        raise DataError(
            f"the records have no column {missing}; their columns are {list(ddf.columns)}"
        )
    return ddf[columns]


def _universe(
    levels: _Levels, geographies: Universe | None, geography_column: str
) -> tuple[Geography, dict[str, int] | None]:
    """The declared universe, and the GEOID prefix lengths of its levels if given."""
    values = list(levels.values()) if isinstance(levels, Mapping) else []
    if levels is None or (values and all(isinstance(v, int | np.integer) for v in values)):
        prefixes = None if levels is None else prefix_levels(cast(Mapping[str, int], levels))
        if geographies is None:
            raise GeographyUniverseError(
                "geographies: person records need a public geography universe (a list of "
                "ids, a parent table or a CSV file with one column per level); publishing "
                "the units found in the records would reveal who is in them"
            )
        name = geography_column if re.fullmatch(r"[A-Za-z_]\w*", geography_column) else "geography"
        return geography_universe(geographies, prefixes, level=name), prefixes
    table = values and all(not isinstance(v, str | int | np.integer) for v in values)
    if not (isinstance(levels, Geography | pd.DataFrame) or table):
        raise SpecError(
            "levels must be None, {level: GEOID prefix length}, a parent table "
            "({level: ids} or a DataFrame) or a Geography"
        )
    if geographies is not None:
        raise SpecError(
            "levels is a parent table (a universe) and geographies another: give the "
            "universe once, as geographies"
        )
    return geography_universe(levels), None


def ingest_records(
    source: RecordSource,
    domain: Domain,
    geography_column: str,
    attribute_columns: Mapping[str, str] | Sequence[str] | None = None,
    levels: _Levels = None,
    *,
    store: str | os.PathLike[str],
    geographies: Universe | None = None,
    unknown_geography: Literal["refuse", "drop"] = "refuse",
    categories: Mapping[str, Sequence[Any]] | None = None,
    geo_chunk: int | None = None,
    dtype: npt.DTypeLike = "int32",
    overwrite: bool = False,
    blocksize: str | int = "64MB",
    layout: Literal["auto", "dense", "sparse"] = "auto",
) -> DataStore:
    """Count person records into the units of a public universe, after validating every
    record.

    The store's units (and so the units a release from it publishes) are exactly
    those of the universe, never the ids found in the records: a unit published
    because someone lives in it would reveal that person, whatever the noise.

    Parameters
    ----------
    source : path, list of paths, or DataFrame
        CSV (``.csv``, ``.tsv``, optionally ``.gz``; a header row names the columns)
        or Parquet files (``.parquet`` or a directory of them), a glob pattern, or a
        pandas / dask DataFrame. Read with :mod:`dask.dataframe`.
    domain : Domain
        The attributes counted.
    geography_column : str
        The column holding each record's finest-level geography id (read as text,
        so leading zeros are kept in CSV files, and compared exactly: no trimming).
    attribute_columns : mapping or sequence of str, optional
        ``{attribute: column}``, or columns in the domain's attribute order
        (default: columns named like the attributes).
    levels : optional
        How records' ids relate to coarser levels, one of

        * ``None``: the levels of ``geographies``;
        * ``{level: prefix length}`` (ordered by length), e.g. ``{"state": 2,
          "county": 5, "tract": 11, "block": 15}``: ids are GEOIDs, each level's id
          is a prefix of the finest one. A record inside the universe must have,
          at every level, the prefix the universe gives as its unit's ancestor;
        * a parent table (``{level: ids}`` or a DataFrame, one column per level,
          coarsest first, one row per finest unit) or a :class:`~dpdask.Geography`:
          the universe itself (then ``geographies`` is not given).
    store : str or path-like
        Directory of the new store.
    geographies : optional
        The public universe (required unless ``levels`` is one): a
        :class:`~dpdask.Geography`, a parent table as above, the path of a CSV file
        holding one (a header row naming the levels, values read as text), or a
        list of finest ids (their ancestors are their prefixes under ``levels``;
        without ``levels`` one level named after ``geography_column``). See
        :func:`dpdask.store.geography_universe`. Every unit gets a row, with
        zeros where no record falls.
    unknown_geography : {"refuse", "drop"}
        What records outside the universe (an unknown or missing id, or a prefix
        that is not the universe's parent) do: refuse the input (default), or are
        dropped before anything is counted. How many were dropped is a function of
        the confidential data: it is not returned, logged or stored anywhere.
    categories : mapping of str to sequence, optional
        ``{attribute: [label, ...]}``: the column holds labels, code ``i`` is
        ``labels[i]`` (compared as text). Other attributes hold integer codes.
    geo_chunk : int, optional
        Geographies per chunk (default: about 64 MiB per chunk).
    dtype : dtype
        Integer dtype of the stored counts (int32 by default, as the synthetic data;
        a count that does not fit is an error before anything is written).
    overwrite : bool
        Replace an existing store at ``store`` (only once the new one is complete).
    blocksize : str or int
        Bytes of CSV per partition.
    layout : {"auto", "dense", "sparse"}
        Write the counts densely, as entries (the non-zero counts), or whichever is
        smaller (default; at block level on a large domain, the entries).

    Returns
    -------
    DataStore
        The new store; its geography is the universe.

    Raises
    ------
    GeographyUniverseError
        If no universe is given, or (with ``unknown_geography="refuse"``) some
        records are outside it: the message gives their number per level, never
        their ids. Nothing is written.
    dpdask.errors.DataError
        On any bad attribute value (missing value, non-integer code, code out of
        range, unknown category: the message names the column, the value and the
        row), on input files or columns it cannot read, or when the input holds no
        record. Nothing is written.
    dpdask.errors.SpecError
        On a universe that is not a geography or options that do not fit the domain
        (the message names the option: ``levels``, ``geographies``,
        ``attribute_columns``, ``categories``, ``unknown_geography``); a
        :class:`~dpdask.errors.DomainError` names an attribute the domain lacks.
        Nothing is written.
    StoreExistsError
        If ``store`` exists and ``overwrite`` is false.
    FileNotFoundError
        If an input file or the universe's file does not exist.
    """
    check_target(store, overwrite)
    check_layout(layout)
    stored = check_integer_dtype(dtype, "dtype")
    if unknown_geography not in UNKNOWN_GEOGRAPHY:
        raise SpecError(
            f"unknown_geography: {unknown_geography!r} is not one of {list(UNKNOWN_GEOGRAPHY)}"
        )
    columns = columns_of(domain, attribute_columns, categories)
    geography, prefixes = _universe(levels, geographies, geography_column)
    matcher, drop = Matcher.of(geography, prefixes), unknown_geography == "drop"

    ddf = _read(source, [geography_column, *(c.column for c in columns)], blocksize)
    token = tokenize(ddf, columns, geography, prefixes, drop)
    parts = ddf.to_delayed()
    scans: tuple[_Scan, ...] = compute(  # type: ignore[no-untyped-call]
        *[
            delayed(_scan_partition, pure=True)(
                part,
                geography_column,
                columns,
                domain.shape,
                matcher,
                drop,
                dask_key_name=(f"ingest-scan-{token}", i),
            )
            for i, part in enumerate(parts)
        ]
    )
    n_outside = sum(s.n_outside for s in scans)
    if n_outside and not drop:
        outside = np.sum([s.outside for s in scans], axis=0)
        raise outside_error(n_outside, outside.tolist(), geography.levels)
    offset, n_bad, problem = 0, 0, None
    for s in scans:
        if s.problem is not None and problem is None:
            problem = (offset + s.problem.row, s.problem)
        n_bad += s.n_bad
        offset += s.n_rows
    if problem is not None:
        row, p = problem
        more = f" ({n_bad:,} rows have problems; the first is shown)" if n_bad > 1 else ""
        raise DataError(f"column {p.column!r}, row {row}: {p.message}{more}; nothing was written")
    if offset == 0:  # records all dropped still publish the universe: that is data-free
        raise DataError("the records are empty; nothing was written")

    keys, counts = _merge(scans)
    if counts.size and counts.max() > np.iinfo(stored).max:
        raise DataError(f"a count of {counts.max()} does not fit dtype {stored}; nothing written")

    src = source if isinstance(source, str | os.PathLike) else type(source).__name__
    args = (store, domain, geography, stored, geo_chunk, overwrite, f"records from {src}")
    n = geography.n_units()
    if choose_layout(layout, int(keys.size), n, domain, stored) == "sparse":

        def fill_entries(root: Any, group: Any) -> int:
            units, cells = np.divmod(keys, domain.size)
            return write_sorted(group, units, cells, counts, n, stored)

        _publish_store(*args, fill_entries, layout="sparse")
        return open_store(store)

    def fill(target: Any) -> None:
        step = target.chunks[0]
        for a in range(0, geography.n_units(), step):
            b = min(a + step, geography.n_units())
            lo, hi = np.searchsorted(keys, [a * domain.size, b * domain.size])
            block = np.zeros((b - a) * domain.size, dtype=stored)
            block[keys[lo:hi] - a * domain.size] = counts[lo:hi]
            target[a:b] = block.reshape((b - a, *domain.shape))

    _publish_store(*args, fill)
    return open_store(store)


def _merge(scans: Sequence[_Scan]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Global (unit * size + cell) keys, sorted and unique, with their summed counts."""
    parts = [s for s in scans if s.keys.size]
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    keys = np.concatenate([s.keys for s in parts])
    counts = np.concatenate([s.counts for s in parts])
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1])
    return keys[starts], np.add.reduceat(counts, starts)
