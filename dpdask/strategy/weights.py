"""Per-query-group weights for HDMM: the workload's priorities without hand-tuned shares.

HDMM minimises the total squared error of the workload's answers. Scaling a named
part (query group) of a :class:`~dpdask.linalg.VStack` workload by ``sqrt(w)`` weights
its squared error by ``w`` in that objective; the plan still reports every query's
variance unweighted. ``select(W, privacy, "hdmm", weights={group: w})`` does it,
``weights: {group: w}`` (or a preset name) in a spec's ``strategy``.

:data:`PRESETS` holds named weightings; ``pl94`` ranks the Bureau's P.L. 94 groups (the
``pl94-full`` workload): the total population first, then voting age, then race.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpdask.errors import PlanError
from dpdask.linalg import LinearQuery, VStack

__all__ = ["PRESETS", "group_weights", "weighted_workload"]

PRESETS: dict[str, dict[str, float]] = {
    "pl94": {
        "total": 200000.0,
        "votingage": 2000.0,
        "votingage*hispanic": 200.0,
        "hispanic": 200.0,
        "cenrace": 100.0,
        "hhinstlevels": 10.0,
        "hhgq": 10.0,
        "hispanic*cenrace": 10.0,
        "votingage*cenrace": 10.0,
        "votingage*hispanic*cenrace": 2.0,
        "detailed": 1.0,
    },
}
"""Named group weights (a group's squared error counts ``w`` times)."""


def group_weights(weights: Mapping[str, Any] | str) -> dict[str, float]:
    """The weights a mapping or a preset name (:data:`PRESETS`) gives, checked.

    Raises
    ------
    PlanError
        For an unknown preset or a weight that is not a positive finite number.
    """
    if isinstance(weights, str):
        if weights not in PRESETS:
            raise PlanError(f"weights: unknown preset {weights!r}; presets are {sorted(PRESETS)}")
        return dict(PRESETS[weights])
    if not isinstance(weights, Mapping):
        raise PlanError(f"weights: expected a mapping of query group to weight, got {weights!r}")
    out = {}
    for g, w in weights.items():
        try:
            value = float(w)
        except (TypeError, ValueError):
            raise PlanError(f"weights.{g}: expected a number, got {w!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise PlanError(f"weights.{g}: must be positive and finite, got {w!r}")
        out[str(g)] = value
    return out


def weighted_workload(workload: LinearQuery, weights: Mapping[str, Any] | str) -> VStack:
    """``workload`` with each named part's rows scaled by ``sqrt(weights[part])``.

    Parts not named keep weight 1.

    Raises
    ------
    PlanError
        If the workload has no named parts or a weight names no part.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Ones
    >>> W = VStack([Ones(3), Identity(3)], names=["total", "cells"])
    >>> weighted_workload(W, {"total": 4}).weights.tolist()
    [2.0, 1.0]
    """
    w = group_weights(weights)
    if not isinstance(workload, VStack) or workload.names is None:
        raise PlanError("weights need a workload of named query groups (a VStack with names)")
    unknown = sorted(set(w) - set(workload.names))
    if unknown:
        raise PlanError(f"weights: {unknown} are not query groups of the workload {workload.names}")
    scale = [
        c * math.sqrt(w.get(n, 1.0)) for n, c in zip(workload.names, workload.weights, strict=True)
    ]
    return VStack(workload.parts, weights=scale, names=workload.names)
