"""The records of a sum release, read and checked before anything is charged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dpdask.errors import SpecError

__all__ = ["read_records"]


def read_records(spec: dict[str, Any], bins: Any) -> np.ndarray:
    """The histogram of every listed geography over the ``by`` cells and the bins.

    int64, shape ``(g, c_1 * ... * c_b * k)``: the ``by`` columns in the spec's order, the
    bins last (the order of :class:`~dpdask.domain.Domain` ``(*by, value)``).

    Raises
    ------
    SpecError
        Listing every problem found, before anything is charged.
    """
    gcol, vcol = spec["geography_column"], spec["value_column"]
    by: dict[str, list[str]] = spec.get("by", {})
    path = spec["data"]
    if not path.exists():
        raise SpecError(f"data.path: {path} does not exist")
    df = pd.read_csv(path, dtype={gcol: str, **{b: str for b in by}}, keep_default_na=True)
    cols = [c for c in (gcol, vcol, *by) if c not in df]
    if cols:
        raise SpecError(f"{path}: no column(s) {cols} (columns: {list(df.columns)})")
    problems = []
    geo = df[gcol]
    if geo.isna().any():
        problems.append(f"{int(geo.isna().sum())} record(s) without a {gcol}")
    ids = spec["geographies"]
    unknown = int((geo.notna() & ~geo.isin(ids)).sum())
    if unknown:  # counted, never shown: the ids come from the confidential records
        problems.append(f"{unknown} record(s) with a {gcol} not in geographies (ids not shown)")
    for col, cats in by.items():
        v = df[col]
        if v.isna().any():
            problems.append(f"{int(v.isna().sum())} record(s) without a {col}")
        bad_cat = sorted(set(v[v.notna() & ~v.isin(cats)]))
        if bad_cat:
            problems.append(f"{col} value(s) not in by.{col}: {bad_cat[:10]}")
    raw = df[vcol]
    vals = pd.to_numeric(raw, errors="coerce").astype(float)
    if raw.isna().any():
        problems.append(f"{int(raw.isna().sum())} record(s) without a {vcol}")
    bad = (raw.notna() & vals.isna()) | (np.isinf(vals))
    if bad.any():
        problems.append(f"{int(bad.sum())} record(s) with a non-numeric or infinite {vcol}")
    fin = vals[np.isfinite(vals)]
    if (fin < 0).any():
        problems.append(f"{int((fin < 0).sum())} record(s) with a negative {vcol}")
    lo, hi = bins.edges[0], bins.edges[-1]
    out = ((fin < lo) & (fin >= 0)) | (fin > hi)
    if out.any():
        problems.append(f"{int(out.sum())} record(s) with {vcol} outside the bins [{lo}, {hi}]")
    if problems:
        raise SpecError(f"{path}: invalid records, nothing was charged: " + "; ".join(problems))
    cell = pd.Categorical(geo, categories=ids).codes.astype(np.int64)
    for col, cats in by.items():
        cell = cell * len(cats) + pd.Categorical(df[col], categories=cats).codes.astype(np.int64)
    k = bins.size
    cells = int(np.prod([len(c) for c in by.values()], dtype=np.int64)) * k
    flat = np.bincount(cell * k + bins.index(vals.to_numpy()), minlength=len(ids) * cells)
    return flat.reshape(len(ids), cells).astype(np.int64)
