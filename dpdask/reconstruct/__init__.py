"""Reconstruction: estimates of the data from noisy measurements.

Every estimator takes implicit operators and returns an :class:`Estimate` (the
estimate and a :class:`ConvergenceReport`).
"""

from dpdask.reconstruct._report import ConvergenceReport, Estimate
from dpdask.reconstruct.consistency import children_sum, tree_consistent
from dpdask.reconstruct.least_squares import batched_cg, least_squares

__all__ = [
    "ConvergenceReport",
    "Estimate",
    "batched_cg",
    "children_sum",
    "least_squares",
    "tree_consistent",
]
