"""The public bound on a geography's total that a release sizes its lattice for.

A strategy with non-integer entries is measured on a lattice
(:func:`dpdask.measure.lattice`): its answers are rounded to a grid of step ``h``, and
each rounding adds to the sensitivity, so to the noise, in proportion to ``h``. The
floating-point error of computing the answers grows with a geography's total, and the
grid can be no finer than that error at the largest total the release admits,
``max_total``. The default bound (:data:`~dpdask.measure.DEFAULT_MAX_TOTAL`) is more
people than live on Earth; on the 2,016-cell ``pl94-full`` domain with a dense strategy
(a fitness plan) it leaves the grid so coarse that the noise drawn is well above the
plan's (BENCHMARKS.md, session 19).

A release that publishes every top-level unit's total exactly (an invariant, public by the
agency's declaration: :mod:`dpdask.pipeline.invariants`) has a public bound already: no
geography holds more people than the largest of those totals. :func:`release_bound` uses
it when the caller gives no bound. The data is still checked against the bound before
anything is charged (:func:`~dpdask.graph._run.check_totals`), and the bound is published
in the release's summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpdask.measure import DEFAULT_MAX_TOTAL
from dpdask.reconstruct.topdown import Constraints, known_totals

__all__ = ["MAX_TOP_UNITS", "release_bound"]

MAX_TOP_UNITS = 4096
"""The most top-level units whose published totals are read for the bound (a larger top
level keeps the default: its bounds would be built densely)."""


def release_bound(max_total: int | None, constraints: Mapping[str, Any] | None, top: str) -> int:
    """The release's ``max_total``: the caller's, else the invariant one (module notes).

    Parameters
    ----------
    max_total : int or None
        The caller's public bound on one geography's total (None: not given).
    constraints : mapping of str to Constraints or chunked constraints, optional
        The release's constraints by level (:func:`dpdask.graph.release`).
    top : str
        The top released level.

    Returns
    -------
    int
        ``max_total`` when given; else, when the constraints of ``top`` fix every unit's
        total, the largest of them (at least 1, at most the default); else
        :data:`~dpdask.measure.DEFAULT_MAX_TOTAL`.

    Examples
    --------
    >>> import numpy as np
    >>> state = Constraints(np.zeros((1, 2)), np.full((1, 2), np.inf), np.ones((1, 2)),
    ...                     np.array([[1000.0]]), np.array([[1000.0]]), ("44",), ("total",))
    >>> release_bound(None, {"state": state}, "state")
    1000
    >>> release_bound(None, None, "state") == DEFAULT_MAX_TOTAL
    True
    """
    if max_total is not None:  # checked where the lattice is sized for it
        return max_total
    given = constraints.get(top) if isinstance(constraints, Mapping) else None
    if given is None or not (isinstance(given, Constraints) or hasattr(given, "take")):
        return DEFAULT_MAX_TOTAL  # none, or not constraints (refused with the release's checks)
    units = given.lower.shape[0] if isinstance(given, Constraints) else int(given.k)
    if not 0 < units <= MAX_TOP_UNITS:
        return DEFAULT_MAX_TOTAL
    known, value = known_totals(given if isinstance(given, Constraints) else given.take(None))
    if not known.all() or not np.isfinite(value).all():
        return DEFAULT_MAX_TOTAL
    return int(min(DEFAULT_MAX_TOTAL, max(1, math.ceil(float(value.max())))))
