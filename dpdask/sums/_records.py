"""The records of a sum release, read and checked before anything is charged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dpdask.errors import SpecError

__all__ = ["read_records"]


def read_records(spec: dict[str, Any], bins: Any) -> np.ndarray:
    """The histogram of every listed geography over the bins (int64, ``(g, k)``).

    Raises
    ------
    SpecError
        Listing every problem found, before anything is charged.
    """
    gcol, vcol = spec["geography_column"], spec["value_column"]
    path = spec["data"]
    if not path.exists():
        raise SpecError(f"data.path: {path} does not exist")
    df = pd.read_csv(path, dtype={gcol: str}, keep_default_na=True)
    cols = [c for c in (gcol, vcol) if c not in df]
    if cols:
        raise SpecError(f"{path}: no column(s) {cols} (columns: {list(df.columns)})")
    problems = []
    geo = df[gcol]
    if geo.isna().any():
        problems.append(f"{int(geo.isna().sum())} record(s) without a {gcol}")
    ids = spec["geographies"]
    known = geo.notna() & geo.isin(ids)
    unknown = sorted(set(geo[geo.notna() & ~known]))
    if unknown:
        problems.append(f"{gcol} value(s) not in geographies: {unknown[:10]}")
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
    g = pd.Categorical(geo, categories=ids).codes.astype(np.int64)
    j = bins.index(vals.to_numpy())
    k = bins.size
    flat = np.bincount(g * k + j, minlength=len(ids) * k)
    return flat.reshape(len(ids), k).astype(np.int64)
