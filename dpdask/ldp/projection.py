"""Euclidean projection onto the LDP polytope with given row floors (Algorithm 1, paper 002).

Problem 4.1: given ``R`` (``m x n``), row floors ``z >= 0`` and ``epsilon``, find the
nearest ``Q`` (Frobenius) with ``z <= Q[:, u] <= e^eps z`` and ``1^T Q[:, u] = 1`` for every
column. Proposition 4.1: the columns separate and ``Q[:, u] = clip(R[:, u] + lambda_u,
z, e^eps z)`` with the scalar ``lambda_u`` that makes the column sum to one.

The column sum ``f(lambda) = sum_o clip(r_o + lambda, z_o, e^eps z_o)`` is piecewise
linear and non-decreasing, with breakpoints ``a_o = z_o - r_o`` (slope +1 after) and
``b_o = e^eps z_o - r_o`` (slope -1 after), so
``f(lambda) = sum z + sum_k s_k (lambda - t_k)_+`` over the sorted breakpoints ``t_k``
with signs ``s_k``. Algorithm 1 sorts the ``2m`` breakpoints, evaluates ``f`` at all of
them by cumulative sums and interpolates on the segment where ``f`` crosses one. Here that
is done for all columns at once (one sort along an axis, no Python loop over columns).
The root is feasible exactly when ``sum z <= 1 <= e^eps sum z``.

The sort costs ``O(m log m)`` per column; projected gradient calls the projection once per
step with shifts close to the previous ones, so the default ``method="newton"`` instead
finds the same root by safeguarded Newton steps on ``f`` (slope = number of free entries;
a step leaving the bracket ``f(lo) <= 1 <= f(hi)`` is replaced by bisection), started from
the previous shifts when given: a few ``O(m)`` passes per column, exact once the active set
settles (the last Newton step on a linear piece lands on the root).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError, ShapeError
from dpdask.ldp.strategy import as_epsilon

__all__ = ["feasible_floors", "project"]


def feasible_floors(z: np.ndarray, epsilon: Any) -> np.ndarray:
    """Clip ``z`` at zero and rescale it into ``e^-eps <= sum z <= 1`` (a feasible polytope)."""
    e = math.exp(float(as_epsilon(epsilon)))
    z = np.clip(np.asarray(z, dtype=float), 0.0, None)
    total = z.sum()
    if total <= 0:
        return np.full(z.shape, 2.0 / (z.size * (1.0 + e)))
    if total > 1.0:
        z = z / total
    elif e * total < 1.0:
        z = z / (e * total)
    return z


def project(
    R: np.ndarray,
    z: np.ndarray,
    epsilon: Any,
    *,
    method: str = "newton",
    shift0: np.ndarray | None = None,
    return_shift: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Project every column of ``R`` onto ``{q : z <= q <= e^eps z, 1^T q = 1}``.

    Parameters
    ----------
    R : ndarray, shape (m, n)
        The matrix to project (one column per type).
    z : ndarray, shape (m,)
        Row floors, ``z >= 0`` with ``sum z <= 1 <= e^eps sum z``.
    epsilon : number or PureDP
    method : {"newton", "sort"}
        Safeguarded Newton (default) or Algorithm 1's sort; the same root.
    shift0 : ndarray, shape (n,), optional
        Starting shifts for ``"newton"`` (e.g. those of the previous projection).
    return_shift : bool
        Also return the per-column shifts ``lambda``.

    Returns
    -------
    Q : ndarray, shape (m, n)
        The projection (columns sum to one up to round-off).

    Raises
    ------
    ArgumentError
        If the floors make the polytope empty.

    Examples
    --------
    >>> import numpy as np
    >>> Q = project(np.array([[2.0], [0.0]]), np.array([0.25, 0.25]), np.log(3))
    >>> np.round(Q.ravel(), 12).tolist()
    [0.75, 0.25]
    """
    R = np.asarray(R, dtype=float)
    z = np.asarray(z, dtype=float)
    if R.ndim != 2 or z.shape != (R.shape[0],):
        raise ShapeError(f"R must be m x n and z of length m, got {R.shape} and {z.shape}")
    e = math.exp(float(as_epsilon(epsilon)))
    lo_sum, hi_sum = float(z.sum()), float(e * z.sum())
    if (z < 0).any() or lo_sum > 1.0 + 1e-12 or hi_sum < 1.0 - 1e-12:
        raise ArgumentError(f"infeasible floors: sum z = {lo_sum!r}, e^eps sum z = {hi_sum!r}")
    up = e * z
    if method == "newton":
        lam = _newton_shifts(R, z, up, lo_sum, shift0)
    elif method == "sort":
        lam = _sorted_shifts(R, z, up, lo_sum)
    else:
        raise ArgumentError(f"method must be 'newton' or 'sort', got {method!r}")
    Q = np.clip(R + lam[None, :], z[:, None], up[:, None])
    return (Q, lam) if return_shift else Q


def _newton_shifts(
    R: np.ndarray, z: np.ndarray, up: np.ndarray, lo_sum: float, shift0: np.ndarray | None
) -> NDArray[np.float64]:
    m, n = R.shape
    zc, uc = z[:, None], up[:, None]
    V = np.subtract(zc, R)
    lo = V.min(axis=0)  # f(lo) = sum z <= 1
    np.subtract(uc, R, out=V)
    hi = V.max(axis=0)  # f(hi) = e^eps sum z >= 1
    if shift0 is not None and np.shape(shift0) == (n,):
        lam: NDArray[np.float64] = np.clip(np.asarray(shift0, dtype=float), lo, hi)
    else:
        lam = np.clip((1.0 - R.sum(axis=0)) / m, lo, hi)
    free = np.empty(R.shape, dtype=bool)
    below = np.empty(R.shape, dtype=bool)
    tol = 4.0 * m * np.finfo(float).eps  # round-off of a column sum
    for _ in range(200):
        # one pass over the matrix, in preallocated buffers (all columns at once)
        np.add(R, lam, out=V)
        np.greater(V, zc, out=free)
        np.less(V, uc, out=below)
        free &= below
        np.maximum(V, zc, out=V)
        np.minimum(V, uc, out=V)
        gap = 1.0 - V.sum(axis=0)
        slope = np.count_nonzero(free, axis=0)
        done = np.abs(gap) <= tol
        if done.all():
            break
        lo = np.where(gap > 0, lam, lo)
        hi = np.where(gap < 0, lam, hi)
        step = lam + gap / np.maximum(slope, 1)
        bad = (slope == 0) | (step <= lo) | (step >= hi)
        lam = np.where(done, lam, np.where(bad, 0.5 * (lo + hi), step))
    return lam


def _sorted_shifts(
    R: np.ndarray, z: np.ndarray, up: np.ndarray, lo_sum: float
) -> NDArray[np.float64]:
    m, n = R.shape
    # breakpoints, one column per type, sorted along axis 1 of the transposed array
    t = np.concatenate([z[None, :] - R.T, up[None, :] - R.T], axis=1)  # (n, 2m)
    sign = np.concatenate([np.ones(m), -np.ones(m)])
    order = np.argsort(t, axis=1)
    ts = np.take_along_axis(t, order, axis=1)
    ss = sign[order]
    slope = np.cumsum(ss, axis=1)  # slope just after each breakpoint
    f = lo_sum + ts * slope - np.cumsum(ss * ts, axis=1)  # f at each breakpoint
    j = np.argmax(f >= 1.0, axis=1)  # first breakpoint at or above one
    j = np.where((f >= 1.0).any(axis=1), j, 2 * m - 1)
    rows = np.arange(n)
    prev = np.maximum(j - 1, 0)
    s_prev = slope[rows, prev]
    f_prev = f[rows, prev]
    lam: NDArray[np.float64] = np.where(
        (j > 0) & (s_prev > 0),
        ts[rows, prev] + (1.0 - f_prev) / np.where(s_prev > 0, s_prev, 1.0),
        ts[rows, j],
    )
    return lam
