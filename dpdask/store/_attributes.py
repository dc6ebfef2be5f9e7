"""Public attributes of a store's finest units: housing units, group quarters, ...

A store may carry, beside its counts, per-unit attributes the agency publishes (the
P.L. 94-171 file's housing units per block, a synthetic state's facilities), for the
invariants and constraints of a release. Each is a zarr array ``units/<name>`` whose
first axis is the finest units, in the order of the counts' rows; the store's
``dpdask`` attributes list their names under ``unit_attributes``::

    units/housing_units    int64 (n,)     housing units, occupied or vacant (H1 line 1)
    units/occupied_units   int64 (n,)     occupied housing units (H1 line 2)
    units/gq_population    int64 (n, 8)   persons by household / group-quarters type:
                                          column 0 household population (total minus
                                          group quarters), columns 1..7 the types of
                                          :data:`dpdask.census.HHGQ` (P5)
    units/gq_facilities    int64 (n, 8)   group-quarters facilities by type (column 0
                                          always 0; synthetic data only: no public file
                                          counts facilities per block)

Other names (lower-case letters, digits, underscores) may hold any non-negative
integer array with one row per unit. Attributes are public: they are never measured
and cost no budget; reading them does not touch the counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr

from dpdask.domain import Geography
from dpdask.errors import DataError
from dpdask.store._aggregate import aggregate

__all__ = [
    "UNIT_ATTRIBUTES",
    "attribute_at",
    "check_listed",
    "check_unit_attributes",
    "read_unit_attribute",
    "unit_attribute_names",
    "write_unit_attributes",
]

UNIT_ATTRIBUTES: dict[str, tuple[int, ...]] = {
    "housing_units": (),
    "occupied_units": (),
    "gq_population": (8,),
    "gq_facilities": (8,),
}
"""The standard attribute names and the shape of one unit's value (``()`` a scalar)."""

GROUP = "units"
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_ROWS_PER_CHUNK = 2**20


def check_unit_attributes(
    attributes: Mapping[str, Any] | None, n_units: int
) -> dict[str, npt.NDArray[np.int64]]:
    """The attributes as int64 arrays, checked; a :class:`DataError` naming the first
    bad one (name, dtype, NaN, first dimension, standard shape, negative value).

    Examples
    --------
    >>> check_unit_attributes({"housing_units": [3, 0]}, 2)["housing_units"].tolist()
    [3, 0]
    """
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise DataError(f"unit_attributes must be a mapping of names to arrays, got {attributes!r}")
    checked: dict[str, npt.NDArray[np.int64]] = {}
    for name, raw in attributes.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise DataError(
                f"unit attribute name {name!r}: use lower-case letters, digits and underscores"
            )
        arr = np.asarray(raw)
        where = f"unit attribute {name!r}"
        if arr.dtype.kind in "fc" and np.isnan(arr).any():
            raise DataError(f"{where} holds NaN at unit {int(np.argwhere(np.isnan(arr))[0][0])}")
        if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
            raise DataError(f"{where} has dtype {arr.dtype}; it must hold integers")
        if arr.ndim == 0 or arr.shape[0] != n_units:
            raise DataError(
                f"{where} has shape {arr.shape}; its first axis must be the {n_units:,} "
                "finest units"
            )
        if name in UNIT_ATTRIBUTES and arr.shape[1:] != UNIT_ATTRIBUTES[name]:
            raise DataError(
                f"{where} has shape {arr.shape}; it must be {(n_units, *UNIT_ATTRIBUTES[name])}"
            )
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise DataError(f"{where} holds a value beyond int64")
        if arr.size and arr.min() < 0:
            raise DataError(f"{where} is negative at unit {int(np.argwhere(arr < 0)[0][0])}")
        checked[name] = arr.astype(np.int64)
    return checked


def create_unit_attribute(
    group: zarr.Group, name: str, shape: tuple[int, ...], rows_per_chunk: int | None = None
) -> zarr.Array[Any]:
    """An empty int64 attribute array ``units/<name>`` (chunked along units only)."""
    rows = max(1, min(shape[0], rows_per_chunk or _ROWS_PER_CHUNK))
    sub = group.require_group(GROUP)
    return sub.create_array(
        name,
        shape=shape,
        dtype=np.int64,
        chunks=(rows, *shape[1:]),
        fill_value=0,
        dimension_names=("unit", *(f"{name}_{i}" for i in range(1, len(shape)))),
    )


def write_unit_attributes(
    group: zarr.Group, attributes: Mapping[str, npt.NDArray[np.int64]]
) -> None:
    """Write checked attributes (:func:`check_unit_attributes`) into a store being built."""
    for name, values in attributes.items():
        create_unit_attribute(group, name, values.shape)[...] = values


def unit_attribute_names(group: zarr.Group) -> list[str]:
    """The attributes written into ``group`` so far, sorted (what the attributes list)."""
    if GROUP not in group:
        return []
    sub = group[GROUP]
    if not isinstance(sub, zarr.Group):
        return []
    return sorted(k for k, v in sub.members() if isinstance(v, zarr.Array))


def check_listed(group: zarr.Group, meta: Mapping[str, Any], n_units: int, path: Any) -> None:
    """Every attribute the store's metadata lists is an array with one row per unit."""
    for name in meta.get("unit_attributes", ()):
        node = group.get(f"{GROUP}/{name}")
        if not isinstance(node, zarr.Array) or node.ndim == 0:
            raise DataError(f"{path}: data store lists unit attribute {name!r} but has no array")
        if node.shape[0] != n_units:
            raise DataError(f"{path}/{GROUP}/{name} has {node.shape[0]} rows, not one per unit")


def read_unit_attribute(
    group: zarr.Group, names: tuple[str, ...], name: str, n_units: int
) -> npt.NDArray[np.int64]:
    """The values of attribute ``name``; a :class:`DataError` naming the available ones."""
    if name not in names:
        have = ", ".join(names) if names else "none"
        raise DataError(f"the store has no unit attribute {name!r} (it has: {have})")
    try:
        node = group[f"{GROUP}/{name}"]
    except KeyError:
        raise DataError(f"the store lists unit attribute {name!r} but holds no array") from None
    if not isinstance(node, zarr.Array) or node.ndim == 0 or node.shape[0] != n_units:
        raise DataError(f"unit attribute {name!r} is not an array of {n_units:,} units")
    return np.asarray(node[...], dtype=np.int64)


def attribute_at(
    values: npt.NDArray[np.int64], geography: Geography, level: str | None
) -> npt.NDArray[np.int64]:
    """Per-unit ``values`` of the finest level summed to ``level`` (the store's own
    aggregation, :func:`dpdask.store.aggregate`); ``values`` itself when ``level`` is
    ``None`` or the finest level.

    Examples
    --------
    >>> g = Geography.from_geoids(["11", "12", "21"], {"state": 1, "county": 2})
    >>> attribute_at(np.array([2, 3, 4]), g, "state").tolist()
    [5, 4]
    """
    if level is None or level == geography.levels[-1]:
        return values
    summed: npt.NDArray[np.int64] = np.asarray(aggregate(values, geography, level).compute())  # type: ignore[no-untyped-call]
    return summed
