"""Applying an operator to per-geography data: Dask arrays (a task per chunk) and
sparse chunks (a few dense rows at a time)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import dask.array as da
import numpy as np
from dask.base import tokenize

if TYPE_CHECKING:
    from dpdask.linalg._base import LinearQuery

__all__ = ["DENSE_BATCH_CELLS", "apply_per_geography", "apply_rows"]

DENSE_BATCH_CELLS = 2**23
"""Cells of dense rows formed at once by :func:`apply_rows` (64 MiB of float64)."""


def apply_rows(op: LinearQuery, x: object) -> np.ndarray:
    """``op`` applied to each row (geography) of a dense or sparse chunk, float64 ``(g, m)``.

    A dense ``(g, n)`` or ``(g, *shape)`` array goes through :meth:`LinearQuery.apply` at
    once; a sparse one (:class:`sparse.COO` or a SciPy sparse array, ``(g, n)``) a few
    dense rows at a time (:data:`DENSE_BATCH_CELLS` cells), so that memory stays bounded
    by the batch whatever the chunk's size. Both give the same numbers for the same rows.

    Examples
    --------
    >>> import sparse
    >>> from dpdask.linalg import Total
    >>> x = sparse.COO.from_numpy(np.array([[0, 2, 0], [1, 0, 0]]))
    >>> apply_rows(Total(3), x).tolist()
    [[2.0], [1.0]]
    """
    from scipy import sparse as sp

    if hasattr(x, "tocsr") or sp.issparse(x):
        csr = sp.csr_array(x.tocsr() if hasattr(x, "tocsr") else x)  # type: ignore[attr-defined]
        g, n = csr.shape
        out = np.empty((g, op.shape[0]), dtype=np.float64)
        step = max(1, DENSE_BATCH_CELLS // max(1, n))
        for a in range(0, g, step):
            b = min(g, a + step)
            out[a:b] = op.apply(csr[a:b].toarray())
        return out
    return np.asarray(op.apply(np.asarray(x)), dtype=np.float64)


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
