"""Product workloads over a domain, and the small per-attribute predicate matrices they use.

A product workload (paper 003, "Product workloads") takes one set of predicates
per attribute and asks every conjunction of one predicate from each: it is the
Kronecker product of the per-attribute predicate matrices, in domain order.
Attributes without predicates get the single predicate *True* (the total,
:class:`~dpdask.linalg.Ones`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np
import scipy.sparse as sp

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import Kron, LinearQuery, Ones, Sparse, aslinearquery

__all__ = ["ValueGroup", "indicator", "product"]

ValueGroup = Iterable[SupportsIndex] | slice
"""The values of one attribute a predicate row counts: a list, range or array, or a slice."""


def product(domain: Domain, factors: Mapping[str, Any] | None = None) -> Kron:
    """The product workload with ``factors[attr]`` on each named attribute, Total elsewhere.

    Parameters
    ----------
    domain : Domain
        The data domain; the result has ``domain.size`` columns in its C order.
    factors : mapping of str to LinearQuery or array_like, optional
        Predicate matrix of each attribute (``m_a x domain[a]``). Arrays are
        wrapped with :func:`dpdask.linalg.aslinearquery`.

    Returns
    -------
    Kron
        One factor per domain attribute.

    Raises
    ------
    ArgumentError
        ``DomainError`` if an attribute is not in the domain, ``ShapeError`` if a
        factor has the wrong number of columns.

    Examples
    --------
    >>> from dpdask import Domain
    >>> from dpdask.linalg import Identity
    >>> W = product(Domain(a=2, b=3), {"b": Identity(3)})
    >>> W.shape
    (3, 6)
    """
    factors = dict(factors or {})
    for name in factors:
        domain[name]  # raises ValueError naming the attribute
    out: list[LinearQuery] = []
    for name, size in domain.items():
        if name not in factors:
            out.append(Ones(size))
            continue
        f = aslinearquery(factors[name])
        if f.shape[1] != size:
            raise ShapeError(
                f"the factor on attribute {name!r} has {f.shape[1]} columns but the "
                f"attribute has {size} values"
            )
        out.append(f)
    return Kron(out)


def indicator(
    n: int,
    groups: Sequence[ValueGroup],
    weights: Sequence[float] | np.ndarray | None = None,
) -> Sparse:
    """A predicate matrix over one attribute: row ``k`` counts the values in ``groups[k]``.

    Parameters
    ----------
    n : int
        Number of values of the attribute.
    groups : sequence of (sequence of int, range or slice)
        The values each row counts (a slice or range of values, or a list).
    weights : array_like, optional
        A weight per value (length ``n``) multiplying every row, e.g. the number
        of races for a "total races tallied" row.

    Returns
    -------
    Sparse
        ``len(groups) x n``.

    Raises
    ------
    ArgumentError
        If a value is outside ``0..n-1`` or repeated within a group (``ShapeError``
        for ``weights`` of the wrong shape).

    Examples
    --------
    >>> indicator(4, [range(0, 2), [3]]).dense()
    array([[1., 1., 0., 0.],
           [0., 0., 0., 1.]])
    """
    rows, cols = [], []
    for k, g in enumerate(groups):
        idx = np.arange(n)[g] if isinstance(g, slice) else np.asarray(list(g), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ArgumentError(f"row {k} counts a value outside 0..{n - 1}")
        if np.unique(idx).size != idx.size:
            raise ArgumentError(f"row {k} counts a value twice")
        rows.append(np.full(idx.size, k))
        cols.append(idx)
    r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (n,):
        raise ShapeError(f"weights has shape {w.shape}, expected ({n},)")
    return Sparse(sp.csr_array((w[c], (r, c)), shape=(len(groups), n)))
