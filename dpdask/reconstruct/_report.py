"""What every estimator returns: the estimate and a report of how it was reached."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.errors import ConvergenceWarning

__all__ = ["ConvergenceReport", "Estimate", "warn_at_limit"]


@dataclass
class ConvergenceReport:
    """How an estimator stopped.

    Attributes
    ----------
    method : str
        The algorithm used (``"pinv"``, ``"cg"``, ``"nnls"``, ``"admm"``, ...).
    converged : bool
        Whether every right-hand side met the stopping rule.
    iterations : int
        Iterations taken (0 for direct methods).
    residual : float
        The largest final value of the stopping criterion over right-hand sides.
    tolerance : float
        The stopping tolerance.
    details : dict
        Method-specific extras (JSON-safe).
    """

    method: str
    converged: bool
    iterations: int = 0
    residual: float = 0.0
    tolerance: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "converged": bool(self.converged),
            "iterations": int(self.iterations),
            "residual": float(self.residual),
            "tolerance": float(self.tolerance),
            **({"details": self.details} if self.details else {}),
        }


@dataclass
class Estimate:
    """An estimate of the data vector(s) and its convergence report.

    ``x`` has shape ``(n,)`` for one right-hand side or ``(g, n)`` for a batch of
    ``g`` geographies. Unpacks as ``x, report = estimate``.
    """

    x: np.ndarray
    report: ConvergenceReport

    def __iter__(self) -> Iterator[Any]:
        # Any: unpacking gives an ndarray then a report, which one element type cannot say
        return iter((self.x, self.report))


def warn_at_limit(report: ConvergenceReport, maxiter: int, *, stacklevel: int = 3) -> None:
    """Emit a :class:`~dpdask.errors.ConvergenceWarning` if the estimator stopped at its
    iteration limit ``maxiter`` before its tolerance.

    ``stacklevel=3`` names the caller of the estimator that calls this function.
    """
    if not report.converged and report.iterations >= maxiter:
        warnings.warn(
            f"{report.method} stopped at its iteration limit ({maxiter}) before its "
            f"tolerance: residual {report.residual:.3g} > {report.tolerance:.3g}",
            ConvergenceWarning,
            stacklevel=stacklevel,
        )
