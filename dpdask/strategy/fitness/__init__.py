"""Fitness-for-use: every query its own variance target, at the least privacy cost.

Paper 000 (Xiao, Ding, Gaboardi, Kifer: "Optimizing Fitness-For-Use of Differentially
Private Linear Queries", PVLDB 14(10), 2021). A workload ``W`` (``m x d``) is factored
as ``W = L B`` with a basis ``B`` of linearly independent rows; the mechanism releases
``L (B x + N(0, Sigma))`` (unbiased, correlated Gaussian noise).

* **Problem 1** (:func:`solve`): given variance targets ``c``, find the ``Sigma`` of least
  privacy cost ``max_j sqrt(b_j^T Sigma^-1 b_j)`` with ``diag(L Sigma L^T) <= c``.
* **Problem 2** (:func:`solve` with ``budget=``, or :meth:`FitnessResult.for_budget`):
  given a budget and *relative* targets, minimise the largest variance / target ratio.
  By Theorem 3.1 the Problem 1 solution rescaled to the budget solves it.

The solver is SM-II (section 6, :mod:`dpdask.strategy.fitness._smii`): soft maxima
for both maxima, Newton's method with conjugate gradient on Hessian-vector products,
backtracking with a Cholesky test, continuation on the soft-max parameters, and a
certified optimality gap from weak duality. Budgets: the privacy cost ``c`` of a
mechanism is ``rho = c^2 / 2`` zCDP, and (epsilon, delta)-DP through the exact
Gaussian calibration of Balle and Wang (Corollary 3.2 of paper 000).

As a release plan: ``dpdask.select(W, privacy, strategy="fitness", targets=c, basis=B)``
returns a :class:`FitnessPlan` (``privacy=None`` for Problem 1, a budget for Problem 2)
that measures the whitened strategy ``A = Sigma^{-1/2} B`` with i.i.d. Gaussian noise;
least squares on it releases ``L (B x + N(0, Sigma))`` exactly
(:mod:`dpdask.strategy.fitness._plan`), so ``dpdask.release`` runs it unchanged.

What is exact and what is approximate:

* one workload (``method="dense"``): SM-II to the certified gap in ``info["gap"]``
  (``gap_tol``, default ``1e-4``), limited only by ``d`` (``O(r^3)`` per iteration);
* a Kronecker product with factored targets (``method="factor"``): solved factor by
  factor, one Dask task per factor; exact (the product of the factors' optima is the
  optimum of the product, see :mod:`dpdask.strategy.fitness._product`);
* a union of parts (``method="union"``): each part on its own with independent noise,
  the budget split between them; an approximation whose certified lower bound
  (``lower_bound``, the hardest part's optimum) says how far from optimal it can be;
* Problem 1's tie-break (among covariances of least cost, the one whose sorted privacy
  profile is lexicographically smallest, Theorem 5.4) is only approximated, through
  the soft maximum: the privacy *cost* is optimal, but cells below the maximum may
  have a larger profile entry than in the unique minimal solution (for ``W = I``
  with unequal targets, for example, some targets are then over-met).

Examples
--------
>>> import numpy as np
>>> from dpdask.linalg import Prefix
>>> from dpdask.strategy.fitness import solve
>>> sol = solve(Prefix(2), targets=1.0)
>>> round(sol.privacy_cost ** 2, 3)  # paper 000, Table 2
1.333
>>> bool(np.all(sol.query_variances() <= 1 + 1e-9))
True
"""

from dpdask.strategy.fitness._competitors import paper_hm
from dpdask.strategy.fitness._plan import FitnessPlan, fitness_plan, whitened_strategy
from dpdask.strategy.fitness._smii import SMIIOptions
from dpdask.strategy.fitness._solution import (
    FitnessResult,
    FitnessSolution,
    KronFitnessSolution,
    UnionFitnessSolution,
)
from dpdask.strategy.fitness._solve import DENSE_MAX_COLUMNS, solve
from dpdask.strategy.fitness._symmetric import SymmetricSolution, solve_symmetric

__all__ = [
    "DENSE_MAX_COLUMNS",
    "FitnessPlan",
    "FitnessResult",
    "FitnessSolution",
    "KronFitnessSolution",
    "SMIIOptions",
    "SymmetricSolution",
    "UnionFitnessSolution",
    "fitness_plan",
    "paper_hm",
    "solve",
    "solve_symmetric",
    "whitened_strategy",
]
