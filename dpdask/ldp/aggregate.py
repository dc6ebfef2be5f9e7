"""Server-side aggregation of local responses: count, reconstruct, post-process.

Responses arrive as a table with one row per person: the output index the device sent
(column ``response``) and a geography id (column ``geography``), in Parquet or CSV files,
a pandas or a Dask DataFrame. :func:`count_responses` counts them per geography and
output as a Dask reduction: each partition is validated (an index outside ``0..m-1``, a
missing value or a non-integer is an error, never a silent drop) and counted into a
``(its geographies) x m`` table with one ``bincount``; the tables are merged pairwise up a
tree. :func:`aggregate` then applies the optimal reconstruction per chunk of geographies,
``x_hat = X^+ Q^T D^-1 y`` (so ``W x_hat = V* y``, Theorem 3.3), and optionally the
workload non-negative least squares of appendix A through
:func:`dpdask.reconstruct.nonnegative_fit`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
from dask.base import compute
from dask.delayed import delayed

from dpdask.errors import ArgumentError, DataError
from dpdask.ldp.strategy import LocalStrategy
from dpdask.linalg import LinearQuery, aslinearquery

__all__ = ["LocalEstimate", "aggregate", "count_responses", "read_responses"]


def read_responses(source: Any, *, blocksize: str | int = "128MiB") -> Any:
    """A Dask DataFrame of responses from a path (Parquet or CSV), pandas or Dask frame."""
    import dask.dataframe as dd

    if isinstance(source, dd.DataFrame):
        return source
    if isinstance(source, pd.DataFrame):
        nparts = max(1, len(source) // 5_000_000)
        return dd.from_pandas(source, npartitions=nparts)  # type: ignore[no-untyped-call]
    path = os.fspath(source)
    if path.endswith(".csv") or path.endswith(".csv.gz"):
        return dd.read_csv(path, blocksize=blocksize)
    return dd.read_parquet(path)


def _count_partition(
    df: pd.DataFrame, m: int, response: str, geography: str | None
) -> tuple[np.ndarray, np.ndarray]:
    if response not in df.columns:
        raise DataError(f"no {response!r} column in the responses")
    r = df[response]
    if r.isna().any():
        raise DataError("a response is missing")
    vals = r.to_numpy()
    if not np.issubdtype(vals.dtype, np.integer):
        as_int = vals.astype(np.int64)
        if not np.array_equal(as_int, vals):
            raise DataError("responses must be integer output indices")
        vals = as_int
    vals = vals.astype(np.int64, copy=False)
    if vals.size and (vals.min() < 0 or vals.max() >= m):
        bad = vals[(vals < 0) | (vals >= m)][0]
        raise DataError(f"response {bad} is out of range 0..{m - 1}")
    if geography is None:
        return np.zeros(1, dtype=object), np.bincount(vals, minlength=m)[None, :]
    if geography not in df.columns:
        raise DataError(f"no {geography!r} column in the responses")
    g = df[geography]
    if g.isna().any():
        raise DataError("a geography id is missing")
    codes, uniques = pd.factorize(g.to_numpy(), sort=True)
    counts = np.bincount(codes * m + vals, minlength=len(uniques) * m).reshape(-1, m)
    return np.asarray(uniques), counts


def _merge(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    ga, ca = a
    gb, cb = b
    if len(ga) == len(gb) and (ga == gb).all():
        return ga, ca + cb
    union = np.union1d(ga, gb)
    out = np.zeros((len(union), ca.shape[1]), dtype=np.int64)
    out[np.searchsorted(union, ga)] += ca
    out[np.searchsorted(union, gb)] += cb
    return union, out


def _tree(parts: list[Any]) -> Any:
    while len(parts) > 1:
        nxt = [delayed(_merge)(a, b) for a, b in zip(parts[::2], parts[1::2], strict=False)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def count_responses(
    responses: Any,
    m: int,
    *,
    response: str = "response",
    geography: str | None = "geography",
    scheduler: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Count responses per geography and output (a Dask tree reduction over partitions).

    Returns
    -------
    geographies : ndarray
        Sorted geography ids (one ``None`` when ``geography`` is ``None``).
    counts : ndarray of int64, shape (len(geographies), m)

    Raises
    ------
    DataError
        On a missing column or value, a non-integer or an out-of-range index.
    """
    ddf = read_responses(responses)
    cols = [response] if geography is None else [response, geography]
    parts = [
        delayed(_count_partition)(p, int(m), response, geography) for p in ddf[cols].to_delayed()
    ]
    if not parts:
        raise DataError("no responses")
    geos, counts = compute(_tree(parts), scheduler=scheduler)[0]  # type: ignore[no-untyped-call]
    return geos, counts


@dataclass
class LocalEstimate:
    """Estimates per geography from local responses.

    Attributes
    ----------
    geographies : ndarray
        The geography ids, sorted.
    counts : ndarray, shape (g, m)
        Responses per geography and output (``y``).
    x : ndarray, shape (g, n)
        The unbiased estimate ``x_hat = X^+ Q^T D^-1 y`` (``W x_hat = V* y``).
    x_nonnegative : ndarray or None
        The WNNLS estimate (appendix A) when requested.
    workload : LinearQuery
    info : dict
    """

    geographies: np.ndarray
    counts: np.ndarray
    x: np.ndarray
    x_nonnegative: np.ndarray | None
    workload: LinearQuery
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def people(self) -> np.ndarray:
        """Responses per geography."""
        people: np.ndarray = self.counts.sum(axis=1)
        return people

    def answers(self, nonnegative: bool = False) -> np.ndarray:
        """Workload answers per geography, ``(g, p)``: ``V* y`` or ``W x_nonnegative``."""
        x = self.x_nonnegative if nonnegative else self.x
        if x is None:
            raise ArgumentError("no non-negative estimate: aggregate with wnnls=True")
        return self.workload.apply(x)


def aggregate(
    responses: Any,
    strategy: LocalStrategy,
    W: Any,
    *,
    response: str = "response",
    geography: str | None = "geography",
    wnnls: bool = False,
    chunk: int = 512,
    scheduler: str | None = None,
    **wnnls_options: Any,
) -> LocalEstimate:
    """Count responses, reconstruct per geography, optionally fit ``x >= 0`` (WNNLS).

    Parameters
    ----------
    responses : path, pandas or Dask DataFrame
        One row per person: ``response`` (output index) and ``geography`` (id).
    strategy : LocalStrategy
        The strategy the devices ran.
    W : LinearQuery or ndarray
        The workload (must be supported by the strategy).
    wnnls : bool
        Also compute the non-negative estimate of appendix A.
    chunk : int
        Geographies per reconstruction task.
    **wnnls_options
        Passed to :func:`dpdask.reconstruct.nonnegative_fit` (``tol``, ``maxiter``...).

    Raises
    ------
    DataError, PlanError
        If the responses are invalid or the strategy does not support ``W``.
    """
    Wq = W if isinstance(W, LinearQuery) else aslinearquery(np.asarray(W, dtype=float))
    E = strategy.estimator(Wq)  # n x m, checks support
    m = strategy.shape[0]
    geos, counts = count_responses(
        responses, m, response=response, geography=geography, scheduler=scheduler
    )
    Y = da.from_array(counts.astype(float), chunks=(int(chunk), m))  # type: ignore[no-untyped-call]
    x = (Y @ E.T).compute(scheduler=scheduler)
    x_nn = None
    if wnnls:
        from dpdask.reconstruct import nonnegative_fit

        x_nn = np.asarray(nonnegative_fit(Wq, x, **wnnls_options).x)
    info = {"strategy": strategy.name, "epsilon": str(strategy.epsilon), "m": int(m)}
    return LocalEstimate(geos, counts, x, x_nn, Wq, info)
