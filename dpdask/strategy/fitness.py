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

The solver is SM-II (section 6, :mod:`dpdask.strategy._fitness_smii`): soft maxima
for both maxima, Newton's method with conjugate gradient on Hessian-vector products,
backtracking with a Cholesky test, continuation on the soft-max parameters, and a
certified optimality gap from weak duality. Budgets: the privacy cost ``c`` of a
mechanism is ``rho = c^2 / 2`` zCDP, and (epsilon, delta)-DP through the exact
Gaussian calibration of Balle and Wang (Corollary 3.2 of paper 000).

As a release plan: ``dpdask.select(W, privacy, strategy="fitness", targets=c, basis=B)``
returns a :class:`FitnessPlan` (``privacy=None`` for Problem 1, a budget for Problem 2)
that measures the whitened strategy ``A = Sigma^{-1/2} B`` with i.i.d. Gaussian noise;
least squares on it releases ``L (B x + N(0, Sigma))`` exactly
(:mod:`dpdask.strategy._fitness_plan`), so ``dpdask.release`` runs it unchanged.

What is exact and what is approximate:

* one workload (``method="dense"``): SM-II to the certified gap in ``info["gap"]``
  (``gap_tol``, default ``1e-4``), limited only by ``d`` (``O(r^3)`` per iteration);
* a Kronecker product with factored targets (``method="factor"``): solved factor by
  factor, one Dask task per factor; exact (the product of the factors' optima is the
  optimum of the product, see :mod:`dpdask.strategy._fitness_product`);
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

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from dpdask.linalg import Kron, LinearQuery, VStack, aslinearquery
from dpdask.privacy import Budget
from dpdask.strategy._fitness_dense import solve_dense
from dpdask.strategy._fitness_plan import FitnessPlan, whitened_strategy
from dpdask.strategy._fitness_product import factor_targets, solve_kron, solve_union
from dpdask.strategy._fitness_smii import SMIIOptions
from dpdask.strategy._fitness_solution import (
    FitnessResult,
    FitnessSolution,
    KronFitnessSolution,
    UnionFitnessSolution,
)

__all__ = [
    "FitnessPlan",
    "FitnessResult",
    "FitnessSolution",
    "KronFitnessSolution",
    "SMIIOptions",
    "UnionFitnessSolution",
    "solve",
    "whitened_strategy",
]

# "auto" solves a workload densely up to this many columns, by parts beyond.
DENSE_MAX_COLUMNS = 4096

Method = Literal["auto", "dense", "factor", "union"]


def _flat_targets(W: LinearQuery, targets: Any) -> np.ndarray:
    c = np.asarray(targets, dtype=float)
    if c.ndim == 0:
        c = np.full(W.shape[0], float(c))
    if c.shape != (W.shape[0],):
        raise ValueError(f"targets have shape {c.shape}, the workload has {W.shape[0]} queries")
    if not np.isfinite(c).all() or (c <= 0).any():
        raise ValueError("variance targets must be finite and positive")
    return c


def _is_factored(W: LinearQuery, targets: Any) -> bool:
    """Per-factor targets: a list with one vector (or scalar) per Kronecker factor."""
    return (
        isinstance(W, Kron)
        and isinstance(targets, list | tuple)
        and len(targets) == len(W.factors)
        and all(np.ndim(t) <= 1 for t in targets)
        and any(np.ndim(t) == 1 for t in targets)
    )


def _check_factor_targets(W: Kron, targets: Sequence[Any]) -> list[np.ndarray]:
    return [_flat_targets(f, t) for f, t in zip(W.factors, targets, strict=True)]


def _choose(W: LinearQuery, targets: Any, method: Method) -> str:
    if method != "auto":
        return method
    if isinstance(W, Kron) and len(W.factors) > 1:
        if _is_factored(W, targets):
            return "factor"
        c = _flat_targets(W, targets)
        if factor_targets(c, W.out_shape) is not None:
            return "factor"
    if W.shape[1] <= DENSE_MAX_COLUMNS:
        return "dense"
    if isinstance(W, VStack):
        return "union"
    raise ValueError(
        f"the workload has {W.shape[1]} columns, too many to solve densely "
        f"(limit {DENSE_MAX_COLUMNS}); give a Kronecker product with factored targets or a "
        "union (VStack) of such products, or pass method='dense' to insist"
    )


def solve(
    W: Any,
    targets: Any = 1.0,
    basis: Any = None,
    *,
    budget: Budget | None = None,
    total_weight: float = 0.0,
    init: Any = None,
    method: Method = "auto",
    names: Sequence[str] | None = None,
    options: SMIIOptions | None = None,
) -> FitnessResult:
    """Solve the fitness-for-use problem for ``W`` (Problem 1, or Problem 2 with ``budget``).

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload, ``m x d``.
    targets : float, array_like or list of array_like
        Variance targets: one number for all queries, one per query (length ``m``),
        or, for a :class:`~dpdask.linalg.Kron` workload, one vector per factor
        (``c = c_1 (x) c_2 (x) ...``). With ``budget`` they are relative.
    basis : LinearQuery or array_like, optional
        ``B`` with linearly independent rows spanning ``W``'s row space (for a
        Kronecker workload solved by factors: a :class:`~dpdask.linalg.Kron` of
        per-factor bases). Default: the identity when ``W`` has full column rank,
        else an orthonormal basis of its row space. The optimum does not depend on it.
    budget : zCDP or ApproxDP, optional
        Solve Problem 2: return the mechanism rescaled to spend exactly this budget.
    total_weight : float
        ``lambda`` of the optional total-squared-error term (section 6.1): the
        objective becomes ``cost^2 * (max ratio + lambda * sum of variances)``,
        trading a little of the per-query guarantee for total accuracy.
    init : LinearQuery or array_like, optional
        A strategy ``A`` whose i.i.d.-noise mechanism initialises SM-II (section 6.3;
        default ``A = I``). Dense method only.
    method : {"auto", "dense", "factor", "union"}
        ``"auto"``: by factors for a Kronecker product with factored targets, densely
        up to :data:`DENSE_MAX_COLUMNS` columns, by parts for a larger union.
    names : sequence of str, optional
        Attribute names of the Kronecker factors (used in the Dask task keys,
        ``optimize-factor-<name>-<token>``).
    options : SMIIOptions, optional
        Solver tuning (tolerances, continuation).

    Returns
    -------
    FitnessResult
        :class:`FitnessSolution` (dense), :class:`KronFitnessSolution` or
        :class:`UnionFitnessSolution`, all with ``privacy_cost``, ``privacy_profile()``,
        ``query_variances()``, ``Sigma``, ``basis``, ``noise_factor()``, ``zcdp()``,
        ``approx_dp(epsilon)`` and ``for_budget(budget)``.

    Raises
    ------
    ValueError
        On targets that are not positive and finite or do not match ``W``, a basis
        that is not one for ``W``, a method that does not fit the workload, or a
        budget that admits no Gaussian mechanism.
    """
    W = aslinearquery(W)
    if total_weight:
        options = SMIIOptions(
            **{**(options or SMIIOptions()).__dict__, "total_weight": float(total_weight)}
        )
    how = _choose(W, targets, method)
    if init is not None and how != "dense":
        raise ValueError("an initial strategy (init=) is only used by the dense method")
    result: FitnessResult
    if how == "dense":
        result = solve_dense(W, _flat_targets(W, targets), basis, init, options)
    elif how == "factor":
        if not isinstance(W, Kron):
            raise ValueError("method='factor' needs a Kron workload")
        if _is_factored(W, targets):
            per = _check_factor_targets(W, targets)
        else:
            split = factor_targets(_flat_targets(W, targets), W.out_shape)
            if split is None:
                raise ValueError("the targets are not a Kronecker product of per-factor targets")
            per = split
        if basis is not None and not (isinstance(basis, Kron) and len(basis.factors) == len(per)):
            raise ValueError("by factors, the basis must be a Kron with one basis per factor")
        bases = None if basis is None else basis.factors
        result = solve_kron(W, per, bases, names, options)
    elif how == "union":
        if not isinstance(W, VStack):
            raise ValueError("method='union' needs a VStack workload")
        if basis is not None:
            raise ValueError("a union is solved part by part in each part's canonical basis")
        result = solve_union(W, _flat_targets(W, targets), names, options)
    else:
        raise ValueError(f"unknown method {method!r}")
    return result if budget is None else result.for_budget(budget)
