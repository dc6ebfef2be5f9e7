"""The fitness-for-use solver's entry point: :func:`solve` chooses a method and runs it.

See :mod:`dpdask.strategy.fitness` for the problems, the solver and what is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.linalg import Kron, LinearQuery, VStack, aslinearquery
from dpdask.privacy import Budget
from dpdask.strategy.fitness._dense import solve_dense
from dpdask.strategy.fitness._product import factor_targets, solve_kron, solve_union
from dpdask.strategy.fitness._smii import SMIIOptions
from dpdask.strategy.fitness._solution import (
    FitnessResult,
)

__all__ = ["DENSE_MAX_COLUMNS", "solve"]

# "auto" solves a workload densely up to this many columns, by parts beyond.
DENSE_MAX_COLUMNS = 4096

Method = Literal["auto", "dense", "factor", "union"]


def _flat_targets(W: LinearQuery, targets: Any) -> np.ndarray:
    c = np.asarray(targets, dtype=float)
    if c.ndim == 0:
        c = np.full(W.shape[0], float(c))
    if c.shape != (W.shape[0],):
        raise ShapeError(f"targets have shape {c.shape}, the workload has {W.shape[0]} queries")
    if not np.isfinite(c).all() or (c <= 0).any():
        raise ArgumentError("variance targets must be finite and positive")
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
    raise PlanError(
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
    dpdask.errors.ArgumentError, dpdask.errors.ShapeError, dpdask.errors.PlanError
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
        raise ArgumentError("an initial strategy (init=) is only used by the dense method")
    result: FitnessResult
    if how == "dense":
        result = solve_dense(W, _flat_targets(W, targets), basis, init, options)
    elif how == "factor":
        if not isinstance(W, Kron):
            raise ArgumentError("method='factor' needs a Kron workload")
        if _is_factored(W, targets):
            per = _check_factor_targets(W, targets)
        else:
            split = factor_targets(_flat_targets(W, targets), W.out_shape)
            if split is None:
                raise ArgumentError("the targets are not a Kronecker product of per-factor targets")
            per = split
        if basis is not None and not (isinstance(basis, Kron) and len(basis.factors) == len(per)):
            raise ArgumentError("by factors, the basis must be a Kron with one basis per factor")
        bases = None if basis is None else basis.factors
        result = solve_kron(W, per, bases, names, options)
    elif how == "union":
        if not isinstance(W, VStack):
            raise ArgumentError("method='union' needs a VStack workload")
        if basis is not None:
            raise ArgumentError("a union is solved part by part in each part's canonical basis")
        result = solve_union(W, _flat_targets(W, targets), names, options)
    else:
        raise ArgumentError(f"unknown method {method!r}")
    return result if budget is None else result.for_budget(budget)
