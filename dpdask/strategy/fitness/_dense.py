"""Solving one fitness-for-use problem densely: canonical basis, SM-II, the user's basis.

The optimum does not depend on the basis (paper 000, Theorems 3.1 and 3.3: two bases
give mechanisms with the same output distribution and the same privacy profile), so
the optimiser always works in the canonical basis ``B_c`` of
:func:`~dpdask.strategy.fitness._terms.canonical_problem` (cells with equal columns
merged, then ``B = I`` or an orthonormal row-space basis) and the result is carried to
the requested basis ``B`` afterwards: with ``B = T Q`` (``T = B Q^T`` invertible),
``Sigma_B = T Sigma_Q T^T``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla
from threadpoolctl import threadpool_limits

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.linalg import LinearQuery, aslinearquery, check_dense_size
from dpdask.strategy.fitness._smii import SMIIOptions, run_info, smii
from dpdask.strategy.fitness._solution import FitnessSolution
from dpdask.strategy.fitness._terms import Canonical, canonical_problem

__all__ = ["initial_covariance", "solve_dense"]

# Relative tolerance for "B spans W's row space" and "B has independent rows".
_BASIS_RTOL = 1e-8


def _dense(A: Any, what: str) -> np.ndarray:
    op = aslinearquery(A)
    check_dense_size(op.size, what)
    return op.dense()


def initial_covariance(can: Canonical, init: Any = None) -> np.ndarray:
    """Section 6.3: ``Sigma_0 = B A^+ (A^+)^T B^T`` for a strategy ``A`` (default ``A = I``).

    This is the covariance, on the canonical basis ``B``, of the mechanism that adds
    i.i.d. noise to ``A x`` and answers ``W`` as ``W A^+ (A x + noise)``.

    Raises
    ------
    dpdask.errors.ShapeError, dpdask.errors.PlanError
        If ``A`` has the wrong number of columns or does not determine ``W``
        (``Sigma_0`` is then singular).
    """
    r = can.rank
    if init is None:
        return np.eye(r)
    A = _dense(init, "the initial strategy")
    if A.shape[1] != can.d:
        raise ShapeError(f"the initial strategy has {A.shape[1]} columns, the workload {can.d}")
    M = _dense(can.basis, "the basis") @ np.linalg.pinv(A)
    S = M @ M.T
    if np.linalg.matrix_rank(S) < r:
        raise PlanError("the initial strategy does not support the workload (W != W A^+ A)")
    out: np.ndarray = S
    return out


def _user_basis(can: Canonical, basis: Any) -> tuple[LinearQuery, np.ndarray, np.ndarray]:
    """Validate a user basis ``B``; return it, ``T`` with ``B = T B_canonical``, and ``B^+``."""
    Bop = aslinearquery(basis)
    d, r = can.d, can.rank
    if Bop.shape[1] != d:
        raise ShapeError(f"the basis has {Bop.shape[1]} columns, the workload {d}")
    if Bop.shape[0] != r:
        raise ShapeError(
            f"the basis has {Bop.shape[0]} rows but the workload has rank {r}: a basis needs "
            "linearly independent rows spanning the workload's row space"
        )
    B = _dense(Bop, "the basis")
    if can.right_inverse is None:
        T = B
    else:
        T = B @ can.right_inverse
        Bc = _dense(can.basis, "the canonical basis")
        if np.linalg.norm(B - T @ Bc) > _BASIS_RTOL * max(float(np.linalg.norm(B)), 1e-300):
            raise ArgumentError("the basis has rows outside the workload's row space")
    s = sla.svdvals(T)
    if s.min() <= _BASIS_RTOL * s.max():
        raise ArgumentError("the basis rows are not linearly independent")
    return Bop, T, np.linalg.pinv(B)


def solve_dense(
    W: LinearQuery,
    targets: np.ndarray,
    basis: Any = None,
    init: Any = None,
    options: SMIIOptions | None = None,
) -> FitnessSolution:
    """Problem 1 for one workload with SM-II; see :func:`dpdask.strategy.fitness.solve`."""
    can = canonical_problem(W)
    threads = (options or SMIIOptions()).blas_threads
    with threadpool_limits(limits=threads, user_api="blas"):
        res = smii(can.rows, can.cols, targets, initial_covariance(can, init), options)
    weights = None
    if res.dual_weights is not None:
        weights = (can.on_cells(res.dual_weights[0]), res.dual_weights[1])
    info: dict[str, Any] = {**run_info(res), "rank": can.rank, "dual_weights": weights}
    if basis is None:
        return FitnessSolution(
            W, targets, can.basis, res.sigma, can.right_inverse, can.rows, None, info
        )
    Bop, T, Bp = _user_basis(can, basis)
    sigma = T @ res.sigma @ T.T
    return FitnessSolution(
        W, targets, Bop, 0.5 * (sigma + sigma.T), Bp, can.rows, np.linalg.inv(T), info
    )
