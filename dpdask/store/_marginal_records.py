"""Person records as codes for a marginal release: placed in the universe, checked.

The marginal release (:mod:`dpdask.graph._marginal_release`) never counts records
into a data vector over the domain (the UCI Adult table's has 6.4e17 cells): it keeps
each record's finest unit of the public universe and its attribute codes. Values are
checked as :func:`~dpdask.store.ingest_records` checks them (the same scan of
:mod:`dask.dataframe` partitions, the same errors), records outside the universe are
refused or dropped the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from dask.base import compute
from dask.delayed import delayed

from dpdask.domain import Domain, Geography
from dpdask.errors import DataError, SpecError
from dpdask.store._ingest import RecordSource, _read, _universe
from dpdask.store._record_values import Column, columns_of, encode, text
from dpdask.store._universe import UNKNOWN_GEOGRAPHY, Matcher, Universe, outside_error

__all__ = ["read_codes"]


def _codes_of(
    df: pd.DataFrame, geo_column: str, columns: tuple[Column, ...], matcher: Matcher, drop: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], int, str | None]:
    unit, outside = matcher.locate(text(df[geo_column]))
    inside = unit >= 0
    if not inside.all() and not drop:
        return unit[:0], np.zeros((0, len(columns)), np.int64), outside, int((~inside).sum()), None
    rows = np.flatnonzero(inside)
    df, unit = df.iloc[rows], unit[rows]
    codes = np.zeros((len(df), len(columns)), np.int64)
    for j, col in enumerate(columns):
        c, _bad, reason = encode(df[col.column], col)
        if reason is not None:
            return unit[:0], codes[:0], outside, 0, f"column {col.column!r}: {reason}"
        codes[:, j] = c
    return unit, codes, outside, 0, None


def read_codes(
    source: RecordSource,
    domain: Domain,
    geography_column: str,
    *,
    geographies: Universe,
    levels: Mapping[str, int] | None = None,
    attribute_columns: Mapping[str, str] | Sequence[str] | None = None,
    categories: Mapping[str, Sequence[Any]] | None = None,
    unknown_geography: str = "refuse",
    blocksize: str | int = "64MB",
) -> tuple[Geography, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The universe, each record's finest unit and its codes ``(records, d)``.

    Raises
    ------
    GeographyUniverseError
        Records outside the universe (counts only), unless ``unknown_geography="drop"``.
    dpdask.errors.DataError
        A bad attribute value (naming the column), or no record at all.
    dpdask.errors.SpecError
        An option that does not fit (naming it).
    """
    if unknown_geography not in UNKNOWN_GEOGRAPHY:
        raise SpecError(
            f"unknown_geography: {unknown_geography!r} is not one of {UNKNOWN_GEOGRAPHY}"
        )
    columns = columns_of(domain, attribute_columns, categories)
    geography, prefixes = _universe(levels, geographies, geography_column)
    matcher, drop = Matcher.of(geography, prefixes), unknown_geography == "drop"
    ddf = _read(source, [geography_column, *(c.column for c in columns)], blocksize)
    parts: tuple[Any, ...] = compute(  # type: ignore[no-untyped-call]
        *[
            delayed(_codes_of, pure=True)(p, geography_column, columns, matcher, drop)
            for p in ddf.to_delayed()
        ]
    )
    n_out = sum(p[3] for p in parts)
    if n_out:
        per_level = np.sum([p[2] for p in parts], axis=0)
        raise outside_error(n_out, per_level, geography.levels)
    problems = [p[4] for p in parts if p[4] is not None]
    if problems:
        raise DataError(f"records: {problems[0]}; nothing was charged or written")
    unit = np.concatenate([p[0] for p in parts])
    codes = np.concatenate([p[1] for p in parts])
    if unit.size == 0:
        raise DataError("records: the input holds no record")
    return geography, unit, codes
