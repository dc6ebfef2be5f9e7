"""Residual answers from records or marginal tables, never from a full data vector.

The residual strategy (:mod:`dpdask.strategy.residual`) reads, for each residual
``A``, the ``A``-marginal ``m_A`` of the data: a group-by count over the records'
codes of the attributes in ``A`` (``prod_{i in A} n_i`` cells, however wide the
table). From it come what a plan measures: ``H_A m_A`` (:func:`residual_rows`, the
rows of :class:`~dpdask.strategy.residual.ResidualPlan`'s strategy before their
weight) and the centred residual ``P_A m_A`` (:func:`residual_answer`). These are
the true answers; noise is the measure step's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dpdask.strategy.residual import helmert

__all__ = ["marginal_counts", "reduce_table", "residual_answer", "residual_rows"]


def _codes(records: Any, columns: Sequence[Any] | None) -> np.ndarray:
    if hasattr(records, "to_numpy") and hasattr(records, "columns"):  # a DataFrame
        cols = list(records.columns) if columns is None else list(columns)
        return np.asarray(records[cols].to_numpy())
    arr = np.asarray(records)
    if arr.ndim != 2:
        raise ValueError(f"records must be a 2-D array of codes, got shape {arr.shape}")
    return arr if columns is None else arr[:, list(columns)]


def marginal_counts(
    records: Any,
    sizes: Sequence[int],
    attrs: Iterable[int],
    *,
    columns: Sequence[Any] | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The ``attrs``-marginal of records: integer counts of shape ``(n_i for i in attrs)``.

    Parameters
    ----------
    records : ndarray of shape (persons, d) or DataFrame
        Integer codes, one column per attribute of the domain (``0 .. n_i - 1``).
    sizes : sequence of int
        Attribute sizes ``n_i``.
    attrs : iterable of int
        The attributes kept (sorted; none gives the total).
    columns : sequence, optional
        The columns of ``records`` holding the ``d`` attributes, in domain order.
    weights : ndarray, optional
        A non-negative integer count per record (default 1).

    Raises
    ------
    ValueError
        If a code is outside its attribute's range or not an integer.

    Examples
    --------
    >>> marginal_counts(np.array([[0, 1], [1, 1], [0, 1]]), (2, 2), [1]).tolist()
    [0, 3]
    """
    sizes = tuple(int(n) for n in sizes)
    A = sorted({int(i) for i in attrs})
    codes = _codes(records, columns)
    if codes.shape[1] != len(sizes):
        raise ValueError(f"records have {codes.shape[1]} columns, the domain {len(sizes)}")
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise ValueError("record codes must be integers")
    shape = tuple(sizes[i] for i in A)
    sub = codes[:, A].astype(np.int64)
    if sub.size and (sub.min() < 0 or np.any(sub.max(axis=0) >= np.asarray(shape))):
        raise ValueError(f"record codes outside the attribute ranges {shape}")
    flat = np.ravel_multi_index(tuple(sub.T), shape) if A else np.zeros(len(sub), np.int64)
    size = int(np.prod(shape)) if A else 1
    if weights is None:
        out = np.bincount(flat, minlength=size)
    else:
        w = np.asarray(weights)
        if w.shape != (len(sub),) or not np.issubdtype(w.dtype, np.integer) or np.any(w < 0):
            raise ValueError("weights must be one non-negative integer per record")
        out = np.bincount(flat, weights=w, minlength=size).astype(np.int64)
    return out.reshape(shape)


def reduce_table(table: Any, table_attrs: Sequence[int], attrs: Iterable[int]) -> np.ndarray:
    """The ``attrs``-marginal of a marginal table over ``table_attrs`` (dense or ``sparse.COO``).

    ``attrs`` must be a subset of ``table_attrs``; the result is dense (a residual's
    marginal has ``prod_{i in A} n_i`` cells).
    """
    keep = sorted({int(i) for i in attrs})
    pos = {int(a): k for k, a in enumerate(table_attrs)}
    missing = [a for a in keep if a not in pos]
    if missing:
        raise ValueError(f"attributes {missing} are not axes of the table {tuple(table_attrs)}")
    drop = tuple(k for a, k in pos.items() if a not in keep)
    out = table.sum(axis=drop) if drop else table
    if hasattr(out, "todense"):
        out = out.todense()
    out = np.asarray(out)
    # the kept axes are now in table order; put them in sorted attribute order
    order = [a for a in table_attrs if int(a) in keep]
    return np.transpose(out, [order.index(a) for a in keep])


def residual_answer(marginal: np.ndarray) -> np.ndarray:
    """``P_A m_A``: the ``A``-marginal centred along every axis (the residual, exactly)."""
    out = np.asarray(marginal, dtype=float)
    for k in range(out.ndim):
        out = out - out.mean(axis=k, keepdims=True)
    return out


def residual_rows(marginal: np.ndarray) -> np.ndarray:
    """``H_A m_A``: the residual in the orthonormal Helmert basis, flat in C order."""
    out = np.asarray(marginal, dtype=float)
    for k in range(out.ndim):
        H = helmert(out.shape[k])
        out = np.moveaxis(np.tensordot(H, out, axes=([1], [k])), 0, k)
    return out.reshape(-1)
