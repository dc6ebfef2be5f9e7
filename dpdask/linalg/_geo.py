"""Applying an operator to per-geography data: Dask arrays (a task per chunk) and
sparse chunks (a few dense rows at a time)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from numpy.typing import NDArray

from dpdask.errors import ShapeError

if TYPE_CHECKING:
    from dpdask.linalg._base import LinearQuery

__all__ = ["DENSE_BATCH_CELLS", "apply_per_geography", "apply_rows", "sparse_rows"]

DENSE_BATCH_CELLS = 2**23
"""Cells of dense rows formed at once by :func:`apply_rows` (64 MiB of float64)."""


def apply_rows(op: LinearQuery, x: object, *, exact_only: bool = False) -> NDArray[np.float64]:
    """``op`` applied to each row (geography) of a dense or sparse chunk, float64 ``(g, m)``.

    A dense ``(g, n)`` or ``(g, *shape)`` array goes through :meth:`LinearQuery.apply` at
    once. A sparse one (:class:`sparse.COO` or a SciPy sparse array, ``(g, n)``) goes part
    by part (:func:`sparse_rows`): a Kronecker part that totals attributes out is summed
    from the entries into its marginal (``O(entries)``, exact for integer counts) and
    only the marginal meets the other factors; anything else a few dense rows at a time
    (:data:`DENSE_BATCH_CELLS` cells), so that memory stays bounded by the batch.

    Parameters
    ----------
    op : LinearQuery
        The operator.
    x : ndarray or sparse array
        The chunk.
    exact_only : bool
        Use the marginal path only for integer entries (whose sums are exact, so that
        the answers' rounding error is within :func:`~dpdask.linalg.evaluation_error`'s
        bound for ``op.apply``): what the measure step asks.

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
        csr = sp.csr_array(x.tocsr() if hasattr(x, "tocsr") else x)
        csr.sum_duplicates()
        fast = not exact_only or csr.dtype.kind in "iub"
        return sparse_rows(op, csr) if fast else _dense_batches(op, csr)
    return np.asarray(op.apply(np.asarray(x)), dtype=np.float64)


def _dense_batches(op: LinearQuery, csr: Any) -> np.ndarray:
    g, n = csr.shape
    out = np.empty((g, op.shape[0]), dtype=np.float64)
    step = max(1, DENSE_BATCH_CELLS // max(1, n))
    for a in range(0, g, step):
        b = min(g, a + step)
        out[a:b] = op.apply(csr[a:b].toarray())
    return out


def sparse_rows(op: LinearQuery, csr: Any) -> np.ndarray:
    """``op`` applied to the rows of a CSR chunk ``(g, n)``, part by part (:func:`apply_rows`)."""
    from dpdask.linalg._base import Scaled
    from dpdask.linalg._kron import Kron
    from dpdask.linalg._union import VStack

    if isinstance(op, VStack):
        parts = [sparse_rows(p, csr) * w for p, w in zip(op.parts, op.weights, strict=True)]
        return np.concatenate(parts, axis=1)
    if isinstance(op, Scaled):
        return sparse_rows(op.A, csr) * op.c
    if isinstance(op, Kron):
        out = _kron_marginal(op, csr)
        if out is not None:
            return out
    return _dense_batches(op, csr)


def _total_weight(factor: LinearQuery) -> float | None:
    """The constant of a one-row factor of equal entries (a total), else None."""
    if factor.shape[0] != 1 or factor.shape[1] > 1 << 16:
        return None
    row = np.asarray(factor.dense(), dtype=np.float64).ravel()
    return float(row[0]) if np.all(row == row[0]) else None


def _kron_marginal(op: LinearQuery, csr: Any) -> np.ndarray | None:
    """A Kronecker part that totals attributes out, from the chunk's entries: the sums of
    the entries into the part's marginal, then the kept factors on it; None when no
    factor is a total or the marginal is too large."""
    from dpdask.linalg._kron import Kron

    factors = op.factors  # type: ignore[attr-defined]
    weights = [_total_weight(f) for f in factors]
    if all(w is None for w in weights):
        return None
    sizes = [f.shape[1] for f in factors]
    kept = [i for i, w in enumerate(weights) if w is None]
    g = csr.shape[0]
    n_kept = math.prod(sizes[i] for i in kept) if kept else 1
    if g * n_kept > DENSE_BATCH_CELLS:
        return None
    rows = np.repeat(np.arange(g, dtype=np.int64), np.diff(csr.indptr))
    multi = np.unravel_index(csr.indices.astype(np.int64), sizes)
    key = rows * n_kept
    if kept:
        key = key + np.ravel_multi_index([multi[i] for i in kept], [sizes[i] for i in kept])
    scale = math.prod(w for w in weights if w is not None)
    counts = np.bincount(key, weights=csr.data.astype(np.float64), minlength=g * n_kept)
    marginal = np.asarray(counts, dtype=np.float64)
    marginal = marginal.reshape(g, n_kept)
    if scale != 1.0:
        marginal *= scale
    if not kept:
        return marginal
    inner = factors[kept[0]] if len(kept) == 1 else Kron([factors[i] for i in kept])
    return np.asarray(inner.apply(marginal), dtype=np.float64)


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
        raise ShapeError(f"per-geography data needs at least 2 dimensions, got shape {x.shape}")
    n = math.prod(x.shape[1:])
    if n != op.shape[1]:
        raise ShapeError(
            f"operator has {op.shape[1]} columns but each geography has shape "
            f"{x.shape[1:]} ({n} cells)"
        )
    arr: Any = x  # dask's methods are untyped
    if any(len(c) > 1 for c in x.chunks[1:]):
        arr = arr.rechunk({i: -1 for i in range(1, x.ndim)})
    out: da.Array = arr.map_blocks(
        _apply_block,
        op,
        dtype=np.float64,
        chunks=(arr.chunks[0], (op.shape[0],)),
        drop_axis=list(range(2, x.ndim)) if x.ndim > 2 else None,
        name=f"{name}-{tokenize(op, arr)}",
        meta=np.empty((0, 0), dtype=np.float64),
    )
    return out
