"""Constraints of Census blocks from their public attributes (housing units, facilities).

:func:`pl94_full_constraints` states, for the 2,016-cell ``pl94-full`` histogram
(:func:`dpdask.census.pl94_full_domain`: ``hhgq`` 8, ``votingage`` 2, ``hisp`` 2,
``race`` 63, flattened in C order), the Census Bureau's edit constraints and structural
zeros from each block's housing units and group-quarters facilities by type:

* no household persons (``hhgq`` 0) in a block with no housing unit;
* no persons of group-quarters type ``t`` (1..7) in a block with no facility of type
  ``t``, and at least one person per facility of the type (the type's population is at
  least its facilities), at most ``capacity`` when given;
* nobody under 18 in nursing facilities (``hhgq`` 3, ``votingage`` 0);
* so no persons at all in a block with no housing unit and no facility;
* a block's total population as an invariant when ``totals`` is given.

Its query rows are the total and the population of each group-quarters type.
:func:`pl94_constraints` states, for the 252-cell ``pl94`` histogram (no ``hhgq`` axis),
the empty-block zeros and the optional total invariant only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpdask import census
from dpdask.errors import DataError, ShapeError
from dpdask.reconstruct.topdown._constraints import Constraints, _names

__all__ = ["pl94_constraints", "pl94_full_constraints"]

_NURSING = census.HHGQ.index("nursing")


def _counts(a: np.ndarray | Sequence[int], shape: tuple[int, ...], name: str) -> np.ndarray:
    v = np.asarray(a)
    if v.shape != shape:
        raise ShapeError(f"{name} has shape {v.shape}; expected {shape}")
    if v.size and not np.issubdtype(v.dtype, np.integer):
        vf = np.asarray(v, dtype=float)
        if not np.isfinite(vf).all() or (vf != np.round(vf)).any():
            raise DataError(f"{name} must be whole numbers")
        v = vf.astype(np.int64)
    if (v < 0).any():
        raise DataError(f"{name} must be non-negative")
    return v.astype(np.int64)


def _inputs(
    housing_units: np.ndarray, gq_facilities: np.ndarray, totals: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    hu = np.asarray(housing_units)
    if hu.ndim != 1:
        raise ShapeError(f"housing_units must be (n,), got shape {hu.shape}")
    k = hu.shape[0]
    hu = _counts(hu, (k,), "housing_units")
    fac = _counts(gq_facilities, (k, len(census.HHGQ)), "gq_facilities")
    if (fac[:, 0] != 0).any():
        raise DataError("gq_facilities: column 0 (households) must be 0")
    tot = None if totals is None else _counts(totals, (k,), "totals")
    return hu, fac, tot


def pl94_full_constraints(
    housing_units: np.ndarray,
    gq_facilities: np.ndarray,
    *,
    totals: np.ndarray | None = None,
    capacity: np.ndarray | None = None,
    units: Sequence[str] | None = None,
) -> Constraints:
    """The constraints of ``k`` blocks on the 2,016-cell ``pl94-full`` domain (module notes).

    Parameters
    ----------
    housing_units : ndarray
        ``(k,)`` housing units per block (occupied or vacant).
    gq_facilities : ndarray
        ``(k, 8)`` group-quarters facilities by ``hhgq`` type (column 0 is 0).
    totals : ndarray, optional
        ``(k,)`` each block's total population, published exactly (an invariant).
    capacity : ndarray, optional
        ``(k, 8)`` the most persons of each group-quarters type a block may hold
        (column 0 ignored); none when not given.
    units : sequence of str, optional
        The blocks' names, for error messages.

    Returns
    -------
    Constraints
        Query rows ``"total"`` and ``"<type> population"`` for the 7 group-quarters types.

    Raises
    ------
    ShapeError, DataError
        For arrays of the wrong shape, or negative or fractional counts.

    Examples
    --------
    >>> c = pl94_full_constraints(np.array([0, 3]), np.zeros((2, 8), dtype=int))
    >>> bool((c.upper[0] == 0).all()), int((c.upper[1] == 0).sum())
    (True, 1764)
    """
    hu, fac, tot = _inputs(housing_units, gq_facilities, totals)
    k = hu.shape[0]
    dom = census.pl94_full_domain()
    shape = dom.shape
    n = dom.size
    T = len(census.HHGQ)
    upper = np.full((k, *shape), np.inf)
    upper[hu == 0, 0] = 0.0
    for t in range(1, T):
        upper[fac[:, t] == 0, t] = 0.0
    upper[:, _NURSING, 0] = 0.0
    hhgq = np.broadcast_to(np.arange(T)[:, None, None, None], shape).reshape(n)
    Q = np.vstack([np.ones(n), *(hhgq == t for t in range(1, T))]).astype(float)
    lo = np.zeros((k, T))
    hi = np.full((k, T), np.inf)
    lo[:, 1:] = fac[:, 1:]
    if capacity is not None:
        cap = _counts(capacity, (k, T), "capacity")
        hi[:, 1:] = cap[:, 1:]
    if tot is not None:
        lo[:, 0] = hi[:, 0] = tot
    labels = ("total", *(f"{census.HHGQ[t]} population" for t in range(1, T)))
    return Constraints(np.zeros((k, n)), upper.reshape(k, n), Q, lo, hi, _names(units, k), labels)


def pl94_constraints(
    housing_units: np.ndarray,
    gq_facilities: np.ndarray,
    *,
    totals: np.ndarray | None = None,
    units: Sequence[str] | None = None,
) -> Constraints:
    """The constraints of ``k`` blocks on the 252-cell ``pl94`` domain: nobody in a block
    with no housing unit and no facility, and the total as an invariant when given.

    Parameters
    ----------
    housing_units, gq_facilities, totals, units
        As for :func:`pl94_full_constraints`.

    Returns
    -------
    Constraints
        One query row, ``"total"``.

    Examples
    --------
    >>> c = pl94_constraints(np.array([0, 0]), np.array([[0] * 8, [0, 1] + [0] * 6]))
    >>> float(c.upper[0].max()), float(c.upper[1].min())
    (0.0, inf)
    """
    hu, fac, tot = _inputs(housing_units, gq_facilities, totals)
    k = hu.shape[0]
    n = census.pl94_domain().size
    upper = np.full((k, n), np.inf)
    upper[(hu == 0) & (fac.sum(axis=1) == 0)] = 0.0
    lo = np.zeros((k, 1))
    hi = np.full((k, 1), np.inf)
    if tot is not None:
        lo[:, 0] = hi[:, 0] = tot
    return Constraints(
        np.zeros((k, n)), upper, np.ones((1, n)), lo, hi, _names(units, k), ("total",)
    )
