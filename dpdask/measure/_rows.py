"""Sparse chunks of counts for the measure step: checks, row totals and answers.

At fine geography levels a chunk's counts are mostly zeros (a Census block holds a few
dozen persons over hundreds of thousands of cells), and the release carries them as
:class:`sparse.COO` blocks of shape ``(g, n)`` (geographies by flat cells). The measure
step takes them as they are: the checks look only at the stored entries, the totals are
sums of entries by row, and the answers ``A x`` are computed a few rows at a time from
their dense rows a batch at a time (:func:`dpdask.linalg.apply_rows`), so that memory
stays bounded by the batch whatever the chunk's size. The answers are those of the dense
chunk exactly: the same rows go through the same operator.
"""

from __future__ import annotations

import math

import numpy as np
import sparse
from scipy import sparse as sp

from dpdask.domain import Domain
from dpdask.errors import DataError, DataTypeError
from dpdask.linalg import LinearQuery, apply_rows

__all__ = ["answers", "check_sparse", "is_sparse", "row_totals"]


def is_sparse(x: object) -> bool:
    """Whether ``x`` is a sparse chunk (:class:`sparse.COO` or a SciPy sparse array)."""
    return isinstance(x, sparse.SparseArray) or sp.issparse(x)


def check_sparse(x: object, A: LinearQuery, domain: Domain | None) -> sp.csr_array:
    """A sparse chunk of counts as a ``(g, n)`` CSR array, after the checks of
    :func:`~dpdask.measure._checks.check_data` on its entries.

    Raises
    ------
    DataTypeError
        If the entries are not integers or floats.
    DataError
        For a shape other than ``(g, n)`` (or ``(g, *domain.shape)``), NaN or infinite
        entries, or negative counts.
    """
    n = A.shape[1]
    shape = tuple(int(s) for s in x.shape)  # type: ignore[attr-defined]
    cells = domain.shape if domain is not None else (n,)
    if len(shape) < 2 or math.prod(shape[1:]) != n or shape[1:] not in ((n,), tuple(cells)):
        raise DataError(
            f"x has shape {shape}; expected (geographies, {n}) or (geographies, *{cells})"
        )
    if isinstance(x, sparse.SparseArray):
        coo = x if isinstance(x, sparse.COO) else sparse.COO(x)
        if coo.ndim > 2:
            coo = coo.reshape((shape[0], n))
        data = np.asarray(coo.data)
        _check_entries(data)
        csr = sp.csr_array((data, (coo.coords[0], coo.coords[1])), shape=(shape[0], n))
    else:
        csr = sp.csr_array(x)
        if len(shape) != 2:
            raise DataError(f"a SciPy sparse chunk must be (geographies, {n}), got {shape}")
        _check_entries(np.asarray(csr.data))
    csr.sum_duplicates()
    return csr


def _check_entries(data: np.ndarray) -> None:
    if data.dtype == np.bool_ or not (
        np.issubdtype(data.dtype, np.integer) or np.issubdtype(data.dtype, np.floating)
    ):
        raise DataTypeError(f"x must hold integer (or float) counts, got dtype {data.dtype}")
    if np.issubdtype(data.dtype, np.floating) and not np.isfinite(data).all():
        raise DataError("x contains NaN or infinite counts")
    if data.size and data.min() < 0:
        raise DataError("x contains negative counts")


def row_totals(x: np.ndarray | sp.csr_array) -> np.ndarray:
    """Each geography's total ``sum |x|`` as float64 (dense or CSR chunk)."""
    if isinstance(x, sp.csr_array):
        out: np.ndarray = np.asarray(abs(x).sum(axis=1), dtype=np.float64).reshape(-1)
        return out
    arr = np.asarray(x)
    dense: np.ndarray = np.abs(arr.reshape(arr.shape[0], -1)).sum(axis=1, dtype=np.float64)
    return dense


def answers(A: LinearQuery, x: np.ndarray | sp.csr_array) -> np.ndarray:
    """``A x`` per geography, float64 ``(g, m)``: a dense chunk at once, a sparse one a
    few dense rows at a time or marginal by marginal for integer counts
    (:func:`dpdask.linalg.apply_rows`, whose sums are then exact)."""
    return apply_rows(A, x, exact_only=True)
