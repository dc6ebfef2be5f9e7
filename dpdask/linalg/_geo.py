"""Applying an operator to Dask arrays of per-geography data, one chunk per task."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import dask.array as da
import numpy as np
from dask.base import tokenize

if TYPE_CHECKING:
    from dpdask.linalg._base import LinearQuery

__all__ = ["apply_per_geography"]


def _apply_block(block: np.ndarray, op: LinearQuery) -> np.ndarray:
    return op.apply(block)


def apply_per_geography(op: LinearQuery, x: da.Array, name: str = "matvec") -> da.Array:
    """``op`` applied to every geography of ``x``, lazily, one task per chunk.

    Parameters
    ----------
    op : LinearQuery
        An ``m x n`` operator.
    x : dask.array.Array
        Data of shape ``(n_geo, *domain.shape)`` (or ``(n_geo, n)``) chunked along
        the first axis; other axes are merged into one chunk if needed.
    name : str
        Key prefix of the tasks (letters and dashes), e.g. ``"measure-county"``.

    Returns
    -------
    dask.array.Array
        Shape ``(n_geo, m)``, float64, chunked like ``x`` along the first axis.
    """
    if x.ndim < 2:
        raise ValueError(f"per-geography data needs at least 2 dimensions, got shape {x.shape}")
    n = math.prod(x.shape[1:])
    if n != op.shape[1]:
        raise ValueError(
            f"operator has {op.shape[1]} columns but each geography has shape "
            f"{x.shape[1:]} ({n} cells)"
        )
    if any(len(c) > 1 for c in x.chunks[1:]):
        x = x.rechunk({i: -1 for i in range(1, x.ndim)})
    return da.map_blocks(
        _apply_block,
        x,
        op,
        dtype=np.float64,
        chunks=(x.chunks[0], (op.shape[0],)),
        drop_axis=list(range(2, x.ndim)) if x.ndim > 2 else None,
        name=f"{name}-{tokenize(op, x)}",
        meta=np.empty((0, 0), dtype=np.float64),
    )
