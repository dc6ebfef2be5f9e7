"""Person records (CSV or Parquet) to a data store, validated before anything is written.

Each record carries a geography id and one value per domain attribute. Ingestion is
two steps:

1. **scan** (``ingest-scan`` tasks, one per partition of the input, read with
   :mod:`dask.dataframe`): every value is checked against the domain (missing values,
   values that are not integer codes, codes out of range, unknown categories,
   unknown or malformed geography ids) and the partition's records are counted by
   (geography, cell);
2. **write**: only if no partition found a problem, the counts of every finest unit
   are written to a new store under a temporary name and renamed into place: as
   entries (the sparse layout, straight from the merged (unit, cell) counts) when
   they take less room than the dense array, as at block level on a large domain.

A problem raises :class:`ValueError` naming the column, the value and the row
(records counted from 0 across the input, in read order), with the number of rows
that have problems; nothing is written and an existing store is untouched.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from dask.base import tokenize

from dpdask.dataflow._entries import write_sorted
from dpdask.dataflow._store_write import (
    _publish_store,
    check_integer_dtype,
    check_layout,
    choose_layout,
)
from dpdask.dataflow.store import DataStore, open_store
from dpdask.domain import Domain, Geography
from dpdask.publish import check_target

__all__ = ["ingest_records"]

_INT = r"^\s*[+-]?\d{1,18}\s*$"  # at most 18 digits: always fits int64
_Levels = Mapping[str, int] | Mapping[str, Sequence[str]] | pd.DataFrame | Geography | None


@dataclass(frozen=True)
class _Problem:
    row: int  # within the partition until made global
    column: str
    message: str  # completed with "column ..., row ...: " in front


@dataclass(frozen=True)
class _Column:
    attr: str
    column: str
    size: int
    labels: tuple[str, ...] | None


@dataclass(frozen=True)
class _Scan:
    n_rows: int
    n_bad: int
    problem: _Problem | None
    geo_ids: np.ndarray  # unique geography ids of the partition (str)
    keys: np.ndarray  # geo_position * domain.size + cell, unique, sorted
    counts: np.ndarray


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds (for readable messages)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_numeric(values: pd.Series) -> bool:
    return isinstance(values.dtype, np.dtype) and values.dtype.kind in "iubf"


def _text(values: pd.Series) -> pa.Array:
    """A column as an Arrow string array; nulls stay null, other values become text."""
    arr = pa.array(values.astype(pd.StringDtype("pyarrow")))
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _np(arr: pa.Array, fill: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, fill).to_numpy(zero_copy_only=False))


def _missing_text(arr: pa.Array) -> np.ndarray:
    """Rows of a text column holding no value: null, or blank."""
    return _np(pc.equal(pc.utf8_trim_whitespace(arr), ""), True)


def _encode(values: pd.Series, col: _Column) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Codes of one attribute column, the mask of its bad rows, and why the first is bad."""
    n = len(values)
    codes = np.zeros(n, dtype=np.int64)
    if col.labels is not None or not _is_numeric(values):
        arr = _text(values)
        miss = _missing_text(arr)
        if col.labels is not None:
            idx = _np(pc.index_in(arr, value_set=pa.array(col.labels, pa.large_string())), -1)
            invalid, raw = ~miss & (idx < 0), idx
        else:
            integral = _np(pc.match_substring_regex(arr, _INT), False)
            digits = pc.replace_substring_regex(pc.utf8_trim_whitespace(arr), r"^\+", "")
            raw = _np(pc.cast(pc.if_else(integral, digits, "0"), pa.int64()), 0)
            invalid = ~miss & ~integral
    else:
        miss = np.array(values.isna(), dtype=bool)
        if values.dtype.kind == "f":
            num = values.to_numpy(dtype=np.float64, na_value=0.0)
            invalid = ~miss & ~(np.isfinite(num) & (np.floor(num) == num))
            raw = np.where(invalid | miss, 0, num).astype(np.int64)
        else:
            raw = values.to_numpy(dtype=np.int64)
            invalid = np.zeros(n, dtype=bool)
    out = ~miss & ~invalid & ((raw < 0) | (raw >= col.size))
    bad = miss | invalid | out
    good = ~bad
    codes[good] = raw[good]
    if not bad.any():
        return codes, bad, None
    i = int(np.argmax(bad))
    if miss[i]:
        reason = "missing value"
    elif invalid[i] and col.labels is not None:
        shown = list(col.labels[:10]) + (["..."] if len(col.labels) > 10 else [])
        reason = (
            f"unknown category {str(_plain(values.iloc[i]))!r}; attribute {col.attr!r} has "
            f"categories {shown}"
        )
    elif invalid[i]:
        reason = (
            f"value {_plain(values.iloc[i])!r} is not an integer code of attribute "
            f"{col.attr!r} (give categories={{{col.attr!r}: [...]}} to map labels to codes)"
        )
    else:
        reason = (
            f"value {raw[i]} is outside 0..{col.size - 1} "
            f"(attribute {col.attr!r} has {col.size} values)"
        )
    return codes, bad, reason


def _scan_partition(
    df: pd.DataFrame,
    geo_column: str,
    columns: tuple[_Column, ...],
    shape: tuple[int, ...],
    geo_width: int | None,
    units: pa.Array | None,
) -> _Scan:
    """Validate and count one partition of records."""
    n = len(df)
    first: list[_Problem] = []

    geo = _text(df[geo_column])
    miss = _missing_text(geo)
    wrong = np.zeros(n, dtype=bool)
    unknown = np.zeros(n, dtype=bool)
    if geo_width is not None:
        wrong = ~miss & (_np(pc.utf8_length(geo), 0) != geo_width)
    if units is not None:
        unknown = ~miss & ~wrong & (_np(pc.index_in(geo, value_set=units), -1) < 0)
    bad_any = miss | wrong | unknown
    if bad_any.any():
        i = int(np.argmax(bad_any))
        value = geo[i].as_py()
        if miss[i]:
            reason = "missing geography id"
        elif wrong[i]:
            reason = (
                f"geography id {value!r} has {len(value)} characters; the finest level "
                f"needs {geo_width}"
            )
        else:
            reason = f"unknown geography id {value!r} (not a unit of the geography)"
        first.append(_Problem(i, geo_column, reason))

    cell = np.zeros(n, dtype=np.int64)
    for col, size in zip(columns, shape, strict=True):
        codes, bad, reason = _encode(df[col.column], col)
        if reason is not None:
            first.append(_Problem(int(np.argmax(bad)), col.column, reason))
        bad_any |= bad
        cell = cell * size + codes
    n_bad = int(bad_any.sum())
    if n_bad:
        problem = min(first, key=lambda p: p.row)
        return _Scan(n, n_bad, problem, np.empty(0, str), np.empty(0, np.int64), np.empty(0))
    encoded = geo.dictionary_encode()
    geo_ids = np.asarray(encoded.dictionary.to_pylist(), dtype=str)
    inv = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    keys, counts = np.unique(inv * int(np.prod(shape)) + cell, return_counts=True)
    return _Scan(n, 0, None, geo_ids, keys, counts.astype(np.int64))


def _read(source: Any, columns: list[str], blocksize: str | int) -> Any:
    """A dask DataFrame of ``columns`` from a path, a list of paths, or a DataFrame."""
    import dask.dataframe as dd

    if isinstance(source, dd.DataFrame):
        ddf = source
    elif isinstance(source, pd.DataFrame):
        ddf = dd.from_pandas(source, npartitions=max(1, len(source) // 1_000_000 + 1), sort=False)
    else:
        paths = [source] if isinstance(source, str | os.PathLike) else list(source)
        if not paths:
            raise ValueError("no input files given")
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
            raise ValueError(
                f"cannot tell the format of {names[:3]}; use .csv/.tsv (optionally .gz) or "
                ".parquet files, or pass a DataFrame"
            )
    missing = [c for c in columns if c not in ddf.columns]
    if missing:
        raise ValueError(
            f"the records have no column {missing}; their columns are {list(ddf.columns)}"
        )
    return ddf[columns]


def _columns(
    domain: Domain,
    attribute_columns: Mapping[str, str] | Sequence[str] | None,
    categories: Mapping[str, Sequence[Any]] | None,
) -> tuple[_Column, ...]:
    if attribute_columns is None:
        mapping = {a: a for a in domain}
    elif isinstance(attribute_columns, Mapping):
        mapping = dict(attribute_columns)
    else:
        cols = list(attribute_columns)
        if len(cols) != len(domain):
            raise ValueError(
                f"{len(cols)} attribute columns {cols} for the {len(domain)} attributes "
                f"{list(domain)}"
            )
        mapping = dict(zip(domain, cols, strict=True))
    for a in mapping:
        domain[a]  # raises, naming the attribute
    absent = [a for a in domain if a not in mapping]
    if absent:
        raise ValueError(f"attribute_columns gives no column for attribute(s) {absent}")
    categories = dict(categories or {})
    out = []
    for a in domain:
        labels = None
        if a in categories:
            labels = tuple(str(v) for v in categories.pop(a))
            if len(labels) != domain[a]:
                raise ValueError(
                    f"categories of {a!r} have {len(labels)} labels but the attribute has "
                    f"{domain[a]} values"
                )
            if len(set(labels)) != len(labels):
                raise ValueError(f"categories of {a!r} repeat a label: {list(labels)}")
        out.append(_Column(a, mapping[a], domain[a], labels))
    if categories:
        domain[next(iter(categories))]  # raises, naming the unknown attribute
    return tuple(out)


def _geography_spec(
    levels: _Levels, geography_column: str
) -> tuple[Geography | None, Mapping[str, int] | None]:
    """Either a fixed geography (from a Geography or a parent table) or prefix lengths."""
    if levels is None:
        return None, None
    if isinstance(levels, Geography):
        return levels, None
    if isinstance(levels, pd.DataFrame):
        return Geography.from_table(levels), None
    if isinstance(levels, Mapping):
        values = list(levels.values())
        if values and all(isinstance(v, int | np.integer) for v in values):
            return None, dict(levels)
        if values and all(not isinstance(v, str | int | np.integer) for v in values):
            return Geography.from_table(levels), None
    raise ValueError(
        "levels must be None, {level: GEOID prefix length}, a parent table "
        "({level: ids} or a DataFrame) or a Geography"
    )


def ingest_records(
    source: Any,
    domain: Domain,
    geography_column: str,
    attribute_columns: Mapping[str, str] | Sequence[str] | None = None,
    levels: _Levels = None,
    *,
    store: str | os.PathLike,
    categories: Mapping[str, Sequence[Any]] | None = None,
    geo_chunk: int | None = None,
    dtype: np.dtype | str = "int32",
    overwrite: bool = False,
    blocksize: str | int = "64MB",
    layout: str = "auto",
) -> DataStore:
    """Count person records into a data store, after validating every record.

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
        so leading zeros are kept in CSV files).
    attribute_columns : mapping or sequence of str, optional
        ``{attribute: column}``, or columns in the domain's attribute order
        (default: columns named like the attributes).
    levels : optional
        The geography hierarchy, one of

        * ``None``: one level, the distinct ids in the records;
        * ``{level: prefix length}``, coarsest first, e.g. ``{"state": 2,
          "county": 5, "tract": 11, "block": 15}``: levels from GEOID prefixes,
          units as found in the records;
        * a parent table (``{level: ids}`` or a DataFrame, one column per level,
          coarsest first, one row per finest unit): every unit of the table gets a
          row, with zeros where no record falls;
        * a :class:`~dpdask.Geography`: the same, given directly.
    store : str or path-like
        Directory of the new store.
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
        The new store.

    Raises
    ------
    ValueError
        On any bad record (missing value, non-integer code, code out of range,
        unknown category, unknown or malformed geography id: the message names the
        column, the value and the row), on arguments that do not fit the domain,
        or when no record was read. Nothing is written.
    StoreExistsError
        If ``store`` exists and ``overwrite`` is false.
    FileNotFoundError
        If an input file does not exist.
    """
    check_target(store, overwrite)
    check_layout(layout)
    dtype = check_integer_dtype(dtype, "dtype")
    columns = _columns(domain, attribute_columns, categories)
    fixed, prefixes = _geography_spec(levels, geography_column)
    geo_width = list(prefixes.values())[-1] if prefixes else None
    units = pa.array(fixed.ids[-1], pa.large_string()) if fixed is not None else None

    ddf = _read(source, [geography_column, *(c.column for c in columns)], blocksize)
    token = tokenize(ddf, columns, geo_width, fixed)
    parts = ddf.to_delayed()
    scans = dask.compute(
        *[
            dask.delayed(_scan_partition, pure=True)(
                part,
                geography_column,
                columns,
                domain.shape,
                geo_width,
                units,
                dask_key_name=(f"ingest-scan-{token}", i),
            )
            for i, part in enumerate(parts)
        ]
    )
    offset, n_bad, problem = 0, 0, None
    for s in scans:
        if s.problem is not None and problem is None:
            problem = (offset + s.problem.row, s.problem)
        n_bad += s.n_bad
        offset += s.n_rows
    if problem is not None:
        row, p = problem
        more = f" ({n_bad:,} rows have problems; the first is shown)" if n_bad > 1 else ""
        raise ValueError(f"column {p.column!r}, row {row}: {p.message}{more}; nothing was written")
    if offset == 0:
        raise ValueError("the records are empty; nothing was written")

    if fixed is not None:
        geography = fixed
    elif prefixes is not None:
        geography = Geography.from_geoids(np.concatenate([s.geo_ids for s in scans]), prefixes)
    else:
        name = geography_column if re.fullmatch(r"[A-Za-z_]\w*", geography_column) else "geography"
        ids = np.unique(np.concatenate([s.geo_ids for s in scans]))
        geography = Geography.flat(tuple(ids.tolist()), level=name)
    keys, counts = _merge(scans, pd.Index(geography.ids[-1]), domain.size)
    if counts.size and counts.max() > np.iinfo(dtype).max:
        raise ValueError(f"a count of {counts.max()} does not fit dtype {dtype}; nothing written")

    src = source if isinstance(source, str | os.PathLike) else type(source).__name__
    args = (store, domain, geography, dtype, geo_chunk, overwrite, f"records from {src}")
    n = geography.n_units()
    if choose_layout(layout, int(keys.size), n, domain, dtype) == "sparse":

        def fill_entries(root: Any, group: Any) -> int:
            units, cells = np.divmod(keys, domain.size)
            return write_sorted(group, units, cells, counts, n, dtype)

        _publish_store(*args, fill_entries, layout="sparse")
        return open_store(store)

    def fill(target: Any) -> None:
        step = target.chunks[0]
        for a in range(0, geography.n_units(), step):
            b = min(a + step, geography.n_units())
            lo, hi = np.searchsorted(keys, [a * domain.size, b * domain.size])
            block = np.zeros((b - a) * domain.size, dtype=dtype)
            block[keys[lo:hi] - a * domain.size] = counts[lo:hi]
            target[a:b] = block.reshape((b - a, *domain.shape))

    _publish_store(*args, fill)
    return open_store(store)


def _merge(scans: Sequence[_Scan], units: pd.Index, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Global (unit * size + cell) keys, sorted and unique, with their summed counts."""
    all_keys, all_counts = [], []
    for s in scans:
        if not s.keys.size:
            continue
        pos = units.get_indexer(s.geo_ids).astype(np.int64)
        all_keys.append(pos[s.keys // size] * size + s.keys % size)
        all_counts.append(s.counts)
    if not all_keys:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    keys, counts = np.concatenate(all_keys), np.concatenate(all_counts)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1])
    return keys[starts], np.add.reduceat(counts, starts)
