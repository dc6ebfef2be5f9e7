"""Consistency across geography levels by inverse-variance weighting on the tree.

Each level ``l`` of a geography hierarchy has an unbiased estimate ``x_hat_u`` for
every unit ``u`` with variance ``v_u`` (a scalar per unit, or per level). The
consistent estimate, in which every parent equals the sum of its children, is the
generalised least-squares fit over the tree, computed in two passes (Hay et al.,
2010, generalised to unequal variances and fan-outs):

* **bottom-up**: ``z_u`` is the best estimate of ``u`` from the measurements in its
  subtree: ``z_u = (x_hat_u / v_u + s_u / w_u) / (1 / v_u + 1 / w_u)`` where
  ``s_u`` and ``w_u`` are the sums of the children's ``z`` and variances, and the
  variance of ``z_u`` is ``1 / (1 / v_u + 1 / w_u)``;
* **top-down**: the root keeps ``z``; each child ``c`` of a unit with final value
  ``f_u`` receives its share of the disagreement in proportion to its variance:
  ``f_c = z_c + (var z_c / w_u) (f_u - s_u)``.

When every level measures with the same strategy (so the covariance of each unit's
estimate is a scalar multiple of one matrix), applying the passes cell by cell to
whole vectors is the exact generalised least-squares solution; otherwise it is the
inverse-variance weighting of per-level average variances.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from dpdask.errors import ArgumentError, ShapeError

__all__ = [
    "children_sum",
    "down_variances",
    "project_children",
    "tree_consistent",
    "up_weights",
]


def up_weights(
    variances: np.ndarray | float, child_variances: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bottom-up pass's weights for one level (module notes).

    Parameters
    ----------
    variances : float or ndarray
        ``v_u``, the variance of each unit's own estimate (``inf``: not measured).
    child_variances : ndarray
        ``w_u``, the sum of the variances of the children's ``z`` (per unit).

    Returns
    -------
    a, b, var_z : ndarray
        ``z_u = a_u x_hat_u + b_u s_u`` (``a_u = 0`` for an unmeasured unit) and
        ``var z_u = 1 / (1 / v_u + 1 / w_u)``.
    """
    w = np.asarray(child_variances, dtype=float)
    v = np.broadcast_to(np.asarray(variances, dtype=float), w.shape)
    inv_v = np.where(np.isinf(v), 0.0, 1.0 / v)
    prec = inv_v + 1.0 / w
    return inv_v / prec, 1.0 / (w * prec), 1.0 / prec


def down_variances(
    var_z: np.ndarray, child_variances: np.ndarray, parent_final: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The top-down pass's shares and final variances for one level (module notes).

    Parameters
    ----------
    var_z : ndarray
        ``var z_c`` of each child.
    child_variances : ndarray
        ``w`` of each child's parent (the sum of its children's ``var z``).
    parent_final : ndarray
        The final variance of each child's parent.

    Returns
    -------
    share, final : ndarray
        ``f_c = z_c + share_c (f_u - s_u)`` and
        ``var f_c = v_c - v_c^2 / w + share_c^2 var f_u`` (``v_c = var z_c``).
    """
    share = var_z / child_variances
    return share, var_z - var_z**2 / child_variances + share**2 * parent_final


def children_sum(values: np.ndarray, parent: np.ndarray, n_parents: int) -> np.ndarray:
    """Sum the rows of ``values`` into their parents: ``out[p] = sum_{parent[i] = p} values[i]``."""
    parent = np.asarray(parent)
    S = sp.csr_array(
        (np.ones(parent.size), (parent, np.arange(parent.size))), shape=(n_parents, parent.size)
    )
    return np.asarray(S @ values)


def tree_consistent(
    estimates: Sequence[np.ndarray],
    variances: Sequence[np.ndarray | float],
    parents: Sequence[np.ndarray],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Make per-level estimates consistent over a geography tree.

    Parameters
    ----------
    estimates : sequence of ndarray
        For each level, coarsest first, an array ``(n_units, ...)`` of estimates.
    variances : sequence of float or ndarray
        For each level, the variance of each unit's estimate (scalar or ``(n_units,)``);
        ``inf`` marks a level that was not measured.
    parents : sequence of ndarray
        For each level but the coarsest, the index of each unit's parent in the level above.

    Returns
    -------
    consistent : list of ndarray
        Estimates in which each parent is exactly the sum of its children.
    final_variances : list of ndarray
        The variance of each unit's consistent estimate (per unit).
    """
    L = len(estimates)
    if len(variances) != L or len(parents) != L - 1:
        raise ShapeError("need one estimate and one variance per level and L - 1 parent arrays")
    est = [np.asarray(e, dtype=float) for e in estimates]
    var = [
        np.broadcast_to(np.asarray(v, dtype=float), (e.shape[0],))
        for v, e in zip(variances, est, strict=True)
    ]
    for lvl, v in enumerate(var):
        if (v <= 0).any() or np.isnan(v).any():
            raise ShapeError(f"level {lvl}: variances must be positive (inf for unmeasured)")
    if np.isinf(var[-1]).any():
        raise ShapeError("every unit of the finest level needs a finite variance")

    z: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    vz: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    child_z: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    child_v: list[np.ndarray] = [None] * L  # type: ignore[list-item]
    z[-1], vz[-1] = est[-1], var[-1].copy()
    for lvl in range(L - 2, -1, -1):
        n = est[lvl].shape[0]
        s = children_sum(z[lvl + 1].reshape(z[lvl + 1].shape[0], -1), parents[lvl], n)
        s = s.reshape((n, *est[lvl].shape[1:]))
        w = children_sum(vz[lvl + 1][:, None], parents[lvl], n)[:, 0]
        a, b, vz[lvl] = up_weights(var[lvl], w)
        z[lvl] = _bshape(a, est[lvl]) * np.nan_to_num(est[lvl]) + _bshape(b, s) * s
        child_z[lvl], child_v[lvl] = s, w

    final = [z[0]]
    final_var = [vz[0]]
    for lvl in range(1, L):
        p = parents[lvl - 1]
        share, fv = down_variances(vz[lvl], child_v[lvl - 1][p], final_var[lvl - 1][p])
        resid = final[lvl - 1] - child_z[lvl - 1]
        final.append(z[lvl] + _bshape(share, z[lvl]) * resid[p])
        final_var.append(fv)
    return final, final_var


def _bshape(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``v`` (one value per unit) shaped to broadcast against the rows of ``e``."""
    return v.reshape((-1,) + (1,) * (e.ndim - 1))


def project_children(children: np.ndarray, parent: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Non-negative children that add up exactly to their parents, cell by cell.

    For every parent ``p`` and every cell, the values of ``p``'s children are replaced
    by their Euclidean projection onto ``{v >= 0, sum(v) = totals[p]}`` (the scaled
    simplex): ``v_i = max(c_i - tau, 0)`` with the threshold ``tau`` that makes them
    sum to the total. Children already non-negative and consistent are unchanged.

    Parameters
    ----------
    children : ndarray
        ``(n_children, ...)`` estimates.
    parent : ndarray
        Index of each child's parent, non-decreasing (children of a parent contiguous).
    totals : ndarray
        ``(n_parents, ...)`` non-negative parent values.
    """
    children = np.asarray(children, dtype=float)
    totals = np.asarray(totals, dtype=float)
    if (totals < 0).any():
        raise ArgumentError(
            "parent totals must be non-negative to split into non-negative children"
        )
    out = np.empty_like(children)
    starts = np.flatnonzero(np.r_[True, parent[1:] != parent[:-1]])
    ends = np.r_[starts[1:], parent.size]
    for a, b in zip(starts, ends, strict=True):
        out[a:b] = _simplex(children[a:b], totals[parent[a]])
    return out


def _simplex(c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Project each column ``c[:, j]`` onto ``{v >= 0, sum v = s[j]}`` (Held et al., 1974)."""
    k = c.shape[0]
    u = -np.sort(-c, axis=0)  # descending
    css = np.cumsum(u, axis=0) - s
    j = np.arange(1, k + 1).reshape((-1,) + (1,) * (c.ndim - 1))
    cond = u - css / j > 0
    rho = k - np.argmax(cond[::-1], axis=0)  # last index where cond holds (1-based)
    tau = np.take_along_axis(css, (rho - 1)[None], axis=0)[0] / rho
    # a zero total: the condition never holds and every child is zero
    tau = np.where(cond.any(axis=0), tau, u[0])
    out: np.ndarray = np.maximum(c - tau, 0.0)
    return out
