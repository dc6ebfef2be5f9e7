"""The attribute columns of person records, as codes of a domain's attributes.

A column holds integer codes (numbers, or text such as ``" 3"``) or, with
``categories``, labels compared as text. Each value is checked: a missing value, a
value that is not an integer code, a code out of range or an unknown category is
reported with the value, for :mod:`dpdask.store._ingest` to name its row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dpdask.domain import Domain
from dpdask.errors import SpecError

__all__ = ["Column", "columns_of", "encode", "text"]

_INT = r"^\s*[+-]?\d{1,18}\s*$"  # at most 18 digits: always fits int64


@dataclass(frozen=True)
class Column:
    """An attribute, the column holding it, its size and its labels (if any)."""

    attr: str
    column: str
    size: int
    labels: tuple[str, ...] | None


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds (for readable messages)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_numeric(values: pd.Series) -> bool:
    return isinstance(values.dtype, np.dtype) and values.dtype.kind in "iubf"


def text(values: pd.Series) -> pa.Array:
    """A column as an Arrow string array; nulls stay null, other values become text."""
    arr = pa.array(values.astype(pd.StringDtype("pyarrow")))
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _np(arr: pa.Array, fill: Any) -> npt.NDArray[Any]:
    return np.asarray(pc.fill_null(arr, fill).to_numpy(zero_copy_only=False))


def _missing_text(arr: pa.Array) -> npt.NDArray[np.bool_]:
    """Rows of a text column holding no value: null, or blank."""
    return _np(pc.equal(pc.utf8_trim_whitespace(arr), ""), True)


def encode(
    values: pd.Series, col: Column
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], str | None]:
    """Codes of one attribute column, the mask of its bad rows, and why the first is bad."""
    n = len(values)
    codes = np.zeros(n, dtype=np.int64)
    if col.labels is not None or not _is_numeric(values):
        arr = text(values)
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


def columns_of(
    domain: Domain,
    attribute_columns: Mapping[str, str] | Sequence[str] | None,
    categories: Mapping[str, Sequence[Any]] | None,
) -> tuple[Column, ...]:
    """The column of each attribute of ``domain``, in its order (see
    :func:`~dpdask.store.ingest_records` for the arguments); a SpecError names an
    attribute without a column or wrong categories, a DomainError an unknown attribute."""
    if attribute_columns is None:
        mapping = {a: a for a in domain}
    elif isinstance(attribute_columns, Mapping):
        mapping = dict(attribute_columns)
    else:
        cols = list(attribute_columns)
        if len(cols) != len(domain):
            raise SpecError(
                f"{len(cols)} attribute columns {cols} for the {len(domain)} attributes "
                f"{list(domain)}"
            )
        mapping = dict(zip(domain, cols, strict=True))
    for a in mapping:
        domain[a]  # raises, naming the attribute
    absent = [a for a in domain if a not in mapping]
    if absent:
        raise SpecError(f"attribute_columns gives no column for attribute(s) {absent}")
    categories = dict(categories or {})
    out = []
    for a in domain:
        labels = None
        if a in categories:
            labels = tuple(str(v) for v in categories.pop(a))
            if len(labels) != domain[a]:
                raise SpecError(
                    f"categories of {a!r} have {len(labels)} labels but the attribute has "
                    f"{domain[a]} values"
                )
            if len(set(labels)) != len(labels):
                raise SpecError(f"categories of {a!r} repeat a label: {list(labels)}")
        out.append(Column(a, mapping[a], domain[a], labels))
    if categories:
        domain[next(iter(categories))]  # raises, naming the unknown attribute
    return tuple(out)
