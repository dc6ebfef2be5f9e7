"""The lattice rule: how fine a grid a non-integral measurement can use, and its cost.

The reasoning is in :mod:`dpdask.measure._lattice`; this module holds the arithmetic,
shared by every measurement on a lattice (operators, residual plans) and by the plan's
choice of what to measure (:meth:`dpdask.strategy.Plan.at`). A strategy of ``m`` rows
whose computed answers are within ``err`` of the exact ones is measured on the grid of
step ``2**-k``, ``k`` the least of: the slack rule (the grid adds at most ``D / 1024``
to the sensitivity ``D``), the noise-scale cap (``s / h <= 2**29``) and the
evaluation rule (``h >= 2 err``); the grid answers have sensitivity at most
``D' = D (1 + 2**-24) + c h`` with ``c = 2 m`` (L1) or ``2 sqrt(m)`` (L2).
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = [
    "DEFAULT_MAX_TOTAL",
    "LATTICE_SLACK",
    "MAX_GRID_SCALE",
    "SENSITIVITY_PAD",
    "grid_rule",
    "grid_step",
    "round_up",
]

LATTICE_SLACK = 1024
"""Target: the lattice adds at most ``D / LATTICE_SLACK`` to the sensitivity."""
SENSITIVITY_PAD = Fraction(1) + Fraction(1, 2**24)
"""Relative error bound of a column norm computed in floating point."""
MAX_GRID_SCALE = 2**29
"""Largest noise scale on the grid."""
DEFAULT_MAX_TOTAL = 2**33
"""Public bound on one geography's total (more people than live on Earth)."""


def grid_step(k: int) -> Fraction:
    """The grid step ``2**-k`` as an exact fraction (``k`` may be negative)."""
    return Fraction(1, 2**k) if k >= 0 else Fraction(2 ** (-k))


def round_up(value: Fraction) -> float:
    """The least double at or above ``value``."""
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def grid_rule(rows: int, p: int, sensitivity: float, scale: float, err: float) -> tuple[int, float]:
    """``(k, D')``: the grid exponent and the grid answers' sensitivity bound.

    Parameters
    ----------
    rows : int
        Rows of the measured strategy (``m``).
    p : int
        The norm of the sensitivity (1 or 2).
    sensitivity : float
        ``D``, the strategy's sensitivity in data units.
    scale : float
        The plan's noise scale ``s``.
    err : float
        Largest floating-point evaluation error of an answer (``e * max_total``).

    Examples
    --------
    >>> k, d = grid_rule(4, 2, 1.0, 1.0, 0.0)
    >>> k, round(d, 5)
    (12, 1.00098)
    """
    c = 2.0 * rows if p == 1 else 2.0 * math.sqrt(rows)
    k = max(0, math.ceil(math.log2(c * LATTICE_SLACK / sensitivity)))
    k = min(k, math.floor(math.log2(MAX_GRID_SCALE / scale)))
    if err > 0:
        k = min(k, math.floor(-math.log2(2.0 * err)))
    while grid_step(k) < 2 * Fraction(err):  # log2 rounding
        k -= 1  # pragma: no cover
    padded = Fraction(sensitivity) * SENSITIVITY_PAD
    return k, round_up(padded + Fraction(math.ceil(c * 2**20), 2**20) * grid_step(k))
