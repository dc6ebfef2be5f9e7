"""Wide person records for marginal releases: a synthetic table and a geography column.

:func:`wide_records` draws ``d`` correlated categorical attributes (each a noisy
function of a few latent traits, so marginals are far from uniform);
:func:`with_geography` gives any table a synthetic geography of ``units`` units (ids
``g000`` ...), each record's unit drawn from its row and a seed, and
:func:`geography_ids` the matching public universe.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpdask.errors import ArgumentError

__all__ = ["geography_ids", "wide_records", "with_geography", "write_geography_universe"]


def wide_records(
    n: int, d: int = 30, sizes: tuple[int, ...] | None = None, seed: int = 0
) -> tuple[pd.DataFrame, dict[str, int]]:
    """``n`` records of ``d`` integer-coded attributes ``a00 ..``, and their sizes.

    Parameters
    ----------
    n : int
        Records.
    d : int
        Attributes (default 30).
    sizes : tuple of int, optional
        Attribute sizes (default cycling 2, 3, 5, 4, 8, 2, 6).
    seed : int
        The generator's seed (synthetic data, not a privacy key).

    Examples
    --------
    >>> df, dom = wide_records(5, d=3)
    >>> list(dom.items())
    [('a00', 2), ('a01', 3), ('a02', 5)]
    """
    rng = np.random.default_rng(seed)
    cycle = (2, 3, 5, 4, 8, 2, 6)
    sizes = tuple(sizes) if sizes is not None else tuple(cycle[i % len(cycle)] for i in range(d))
    if len(sizes) != d or any(s < 1 for s in sizes):
        raise ArgumentError(f"sizes must be {d} positive integers")
    traits = rng.normal(size=(n, 3))
    cols = {}
    for i, size in enumerate(sizes):
        w = rng.normal(size=3)
        score = traits @ w + rng.normal(scale=1.0, size=n)
        cuts = np.quantile(score, np.sort(rng.uniform(0.05, 0.95, size=size - 1)))
        cols[f"a{i:02d}"] = np.searchsorted(cuts, score).astype(np.int64)
    return pd.DataFrame(cols), {f"a{i:02d}": s for i, s in enumerate(sizes)}


def geography_ids(units: int) -> list[str]:
    """The ids of a synthetic geography of ``units`` units: ``g000``, ``g001``, ..."""
    return [f"g{i:03d}" for i in range(units)]


def with_geography(
    df: pd.DataFrame, units: int, column: str = "geo", seed: int = 0
) -> pd.DataFrame:
    """``df`` with a column of synthetic unit ids (unequal unit sizes, drawn by ``seed``)."""
    rng = np.random.default_rng(seed)
    weights = rng.gamma(2.0, size=units)
    unit = rng.choice(units, size=len(df), p=weights / weights.sum())
    ids = np.asarray(geography_ids(units), dtype=object)
    return df.assign(**{column: ids[unit]})


def write_geography_universe(path: str, units: int, groups: int, column: str = "geo") -> None:
    """Write the public universe of :func:`with_geography`'s units as a CSV parent table:
    ``region`` (``units / groups`` consecutive units each) and ``column``."""
    ids = geography_ids(units)
    size = -(-units // groups)
    regions = [f"r{i // size:02d}" for i in range(units)]
    pd.DataFrame({"region": regions, column: ids}).to_csv(path, index=False)
