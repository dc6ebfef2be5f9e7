"""Reconstruction: estimates of the data from noisy measurements.

Every estimator takes implicit operators and returns an :class:`Estimate` (the
estimate and a :class:`ConvergenceReport`).
"""

from dpdask.reconstruct._report import ConvergenceReport, Estimate
from dpdask.reconstruct.admm import admm
from dpdask.reconstruct.consistency import children_sum, tree_consistent
from dpdask.reconstruct.isotonic import isotonic
from dpdask.reconstruct.least_squares import batched_cg, least_squares
from dpdask.reconstruct.nnls import nnls, nonnegative_fit, wnnls
from dpdask.reconstruct.tree import HierarchicalTree

__all__ = [
    "ConvergenceReport",
    "Estimate",
    "HierarchicalTree",
    "admm",
    "batched_cg",
    "children_sum",
    "isotonic",
    "least_squares",
    "nnls",
    "nonnegative_fit",
    "tree_consistent",
    "wnnls",
]
