"""Checks of the measure step's inputs: the plan, the data, integer strategies.

Everything here reads only metadata and public structure, except
:func:`check_data`, which inspects the chunk's counts (dtype, shape, attribute
names, NaN/inf, negative counts) before anything is charged. Whether a strategy
has integer entries is decided from the operator's structure
(:func:`has_integer_entries`), never by materialising it; the strategy's
sensitivities are cached per operator (:func:`cached_sensitivity`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import ArgumentTypeError, BudgetTypeError, DataError, DataTypeError, PlanError
from dpdask.linalg import LinearQuery, has_integer_entries
from dpdask.privacy import MECHANISM_NORM, Budget

__all__ = [
    "MeasurePlan",
    "cached_sensitivity",
    "check_data",
    "check_plan",
    "has_integer_entries",
]


class MeasurePlan(Protocol):
    """What :func:`measure` needs from a plan (``dpdask.Plan`` satisfies it).

    Read-only attributes: ``strategy`` (the implicit matrix ``A``), ``mechanism``,
    ``noise_scale``, ``privacy`` (what one measurement charges) and ``domain`` (or
    ``None``). :func:`check_plan` checks them at run time, whatever the plan's class.
    """

    @property
    def strategy(self) -> LinearQuery: ...

    @property
    def mechanism(self) -> str: ...

    @property
    def noise_scale(self) -> float: ...

    @property
    def privacy(self) -> Budget: ...

    @property
    def domain(self) -> Domain | None: ...


_SENSITIVITY: weakref.WeakKeyDictionary[LinearQuery, dict[int, float]] = weakref.WeakKeyDictionary()


def cached_sensitivity(op: LinearQuery, p: int) -> float:
    """``op.sensitivity(p)`` as a float, computed once per operator (weakly cached)."""
    try:
        cache = _SENSITIVITY.setdefault(op, {})
    except TypeError:  # not weak-referenceable
        return float(op.sensitivity(p))
    if p not in cache:
        cache[p] = float(op.sensitivity(p))
    return cache[p]


# -- plan checks ---------------------------------------------------------------
def check_plan(plan: MeasurePlan) -> tuple[LinearQuery, str, float, Budget, Domain | None]:
    """The plan's ``(strategy, mechanism, noise scale, privacy, domain)``, checked (fail
    closed: any object may arrive here, so every attribute is checked at run time)."""
    for attr in ("strategy", "mechanism", "noise_scale", "privacy", "domain"):
        if not hasattr(plan, attr):
            raise ArgumentTypeError(f"the plan has no {attr!r} attribute")
    A, mech, scale, privacy, domain = (
        plan.strategy,
        plan.mechanism,
        plan.noise_scale,
        plan.privacy,
        plan.domain,
    )
    if not isinstance(A, LinearQuery):
        raise ArgumentTypeError(f"plan.strategy must be a LinearQuery, got {type(A).__name__}")
    if mech not in MECHANISM_NORM:
        raise PlanError(f"plan.mechanism {mech!r} is not one of {sorted(MECHANISM_NORM)}")
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.integer | np.floating):
        raise ArgumentTypeError(f"plan.noise_scale must be a number, got {scale!r}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise PlanError(f"plan.noise_scale must be positive and finite, got {scale!r}")
    if not isinstance(privacy, Budget):
        raise BudgetTypeError(f"plan.privacy must be a PureDP, ApproxDP or zCDP, got {privacy!r}")
    if domain is not None:
        if not isinstance(domain, Domain):
            raise ArgumentTypeError(
                f"plan.domain must be a Domain or None, got {type(domain).__name__}"
            )
        if domain.size != A.shape[1]:
            raise PlanError(
                f"plan.domain has {domain.size} cells but the strategy has {A.shape[1]} columns"
            )
    return A, mech, scale, privacy, domain


# -- data checks -------------------------------------------------------------------
def check_data(
    x: object, A: LinearQuery, domain: Domain | None, dims: Sequence[str] | None
) -> tuple[np.ndarray, bool]:
    """The data as a ``(g, *cells)`` array in domain order, and whether it was one geography.

    A sparse chunk (:class:`sparse.COO` or a SciPy sparse array, ``(g, n)``) is checked on
    its entries and returned as a ``(g, n)`` CSR array (:mod:`dpdask.measure._rows`).
    """
    from dpdask.measure._rows import check_sparse, is_sparse

    if is_sparse(x):
        if dims is not None:
            raise DataError("dims applies to dense counts; a sparse chunk is in domain order")
        return check_sparse(x, A, domain), False
    if not isinstance(x, np.ndarray):
        raise DataTypeError(
            f"x must be a numpy array of counts, got {type(x).__name__} "
            "(compute a dask chunk before measuring it)"
        )
    if x.dtype == np.bool_ or not (
        np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)
    ):
        raise DataTypeError(f"x must hold integer (or float) counts, got dtype {x.dtype}")
    cell_shape: tuple[int, ...] = domain.shape if domain is not None else (A.shape[1],)
    if dims is not None:
        if domain is None:
            raise DataError("dims names the data's attributes, so the plan needs a domain")
        dims = list(dims)
        for name in dims:
            domain[name]  # raises ValueError naming an unknown attribute
        if sorted(dims) != sorted(domain.attrs) or len(set(dims)) != len(dims):
            raise DataError(f"dims {dims} must name each attribute of {domain.attrs} exactly once")
        lead = x.ndim - len(dims)
        if lead not in (0, 1):
            raise DataError(f"x has {x.ndim} axes but dims names {len(dims)} attributes")
        order = [dims.index(a) + lead for a in domain.attrs]
        x = np.transpose(x, list(range(lead)) + order)
    if x.shape == cell_shape:
        single = True
        x = x[None]
    elif x.ndim == len(cell_shape) + 1 and x.shape[1:] == cell_shape:
        single = False
    elif domain is None and x.ndim >= 2 and math.prod(x.shape[1:]) == A.shape[1]:
        single = False
    else:
        raise DataError(
            f"x has shape {x.shape}; expected (geographies, *{cell_shape}) "
            f"or {cell_shape} for one geography"
        )
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise DataError("x contains NaN or infinite counts")
    if x.size and x.min() < 0:
        raise DataError("x contains negative counts")
    return x, single
