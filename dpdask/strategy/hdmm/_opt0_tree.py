"""OPT_0 for large interval workloads: a p-Identity fitted on a hierarchical support first.

Pure DP on a large attribute (prefix, all-range and their weighted sums, ``n`` above
:data:`TREE_MIN_N`): HDMM's ``p = n / 16`` from a random start needs thousands of
iterations of ``O(n p^2)`` each. The optimum is sparse (a few per cent of ``Theta``
is nonzero) and close to a weighted hierarchy of intervals, so here ``Theta`` starts
as that hierarchy: row per block of a binary tree of ``L`` levels (the whole domain,
its halves, quarters, ...; ``p = 2^L - 1``, :func:`tree_levels`), every entry
:data:`TREE_SCALE`. It is fitted first on that support alone (the other entries held
at zero), then on all of ``Theta`` (:func:`opt_0_tree`): the second stage starts near
its optimum and takes few iterations, and what it returns is a local optimum of the
whole p-Identity template, as OPT_0's is.

Evaluation (:func:`pidentity_loss_large`): the loss and gradient of
:func:`._pidentity.pidentity_loss` rearranged so that every product with ``Theta`` is
sparse while it is (:data:`SPARSE_DENSITY`), and ``M^-1 Z = Y Gt`` is one more
structured Gram product (``O(n p)``) instead of a dense ``p x p`` by ``p x n`` one::

    Y = M^-1 Theta,  Z = Theta Gt,  f = tr(Gt) - <Z, Y>,
    V = M^-1 (Z - (Z Theta^T) Y) = Y Gt - K Theta,  K = M^-1 (Z Theta^T) M^-1.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpdask.errors import ArgumentError
from dpdask.strategy._gram import Gram
from dpdask.strategy.hdmm._optimize import _checked_loss, minimize
from dpdask.strategy.hdmm._pidentity import _CANCELLATION, column_scale

__all__ = [
    "SPARSE_DENSITY",
    "TREE_MAX_LEVELS",
    "TREE_MIN_N",
    "TREE_SCALE",
    "opt_0_tree",
    "pidentity_loss_large",
    "tree_levels",
    "tree_start",
    "uses_tree",
]

TREE_MIN_N = 1025
"""Smallest attribute (pure DP, interval workloads) fitted by :func:`opt_0_tree`."""

TREE_MAX_LEVELS = 8
"""Most levels of the hierarchy (``p = 255``): beyond, ``O(p^3)`` grows and error does not
fall (deeper supports were tried on prefix workloads of 4096 and 8192 values)."""

TREE_SCALE = 0.25
"""Every entry of the starting hierarchy (each cell is then in ``L`` rows of weight 1/4)."""

SPARSE_DENSITY = 0.25
"""``Theta`` is multiplied as a sparse matrix while at most this fraction is nonzero."""


def uses_tree(G: Gram, norm: int) -> bool:
    """Whether OPT_0 on ``G`` is fitted by :func:`opt_0_tree` (when ``p`` is not given).

    Pure DP, more than :data:`TREE_MIN_N` - 1 values, and a Gram matrix of the interval
    workloads (prefix or all-range terms, possibly with identity and total terms).
    """
    if norm != 1 or G.n < TREE_MIN_N or not G.is_structured:
        return False
    return any(kind in ("prefix", "allrange") for _, kind, _ in G.terms())


def tree_levels(n: int) -> int:
    """Levels ``L`` of the hierarchy for ``n`` values: ``p = 2^L - 1`` at most ``n / 16``
    (HDMM's ``p``), and ``L`` at most :data:`TREE_MAX_LEVELS`."""
    return max(1, min(TREE_MAX_LEVELS, (max(n, 32) // 16).bit_length() - 1))


def tree_start(n: int, levels: int, scale: float = TREE_SCALE) -> np.ndarray:
    """``Theta`` of the hierarchy: level ``k`` splits the ``n`` values into ``2^k`` blocks
    of near-equal size (:func:`numpy.array_split`), one row of ``scale`` per block."""
    if levels < 1 or (1 << (levels - 1)) > n:
        raise ArgumentError(f"cannot split {n} values into {levels} levels")
    rows = []
    for k in range(levels):
        for block in np.array_split(np.arange(n), 1 << k):
            row = np.zeros(n)
            row[block] = scale
            rows.append(row)
    return np.array(rows)


def pidentity_loss_large(
    params: np.ndarray,
    p: int,
    G: Gram,
    gdiag: np.ndarray,
    norm: int = 1,
    sparse: sp.csr_array | None = None,
) -> tuple[float, np.ndarray]:
    """``f(Theta)`` and its gradient, as :func:`._pidentity.pidentity_loss`, for large ``Theta``.

    Parameters
    ----------
    params : ndarray
        ``Theta`` flattened (``p * n`` values).
    p : int
        Rows of ``Theta``.
    G : Gram
        The workload Gram matrix.
    gdiag : ndarray
        ``diag(G)``.
    norm : {1, 2}
        Column normalisation.
    sparse : scipy.sparse.csr_array, optional
        ``Theta`` as a sparse matrix, when the caller has it; otherwise ``Theta`` is
        made sparse when at most :data:`SPARSE_DENSITY` of it is nonzero.
    """
    n = gdiag.size
    T = params.reshape(p, n)
    d = column_scale(T, norm)
    Ts = sparse
    if Ts is None and np.count_nonzero(T) <= SPARSE_DENSITY * T.size:
        Ts = sp.csr_array(T)
    M = (Ts @ Ts.T).toarray() if Ts is not None else T @ T.T
    M[np.diag_indices(p)] += 1.0
    Minv = np.linalg.inv(M)  # eigenvalues >= 1: accurate (see pidentity_loss)
    Y = (Ts.T @ Minv).T if Ts is not None else Minv @ T
    Z = (d[:, None] * G.matmat(d[:, None] * T.T)).T
    gt_diag = d * d * gdiag
    ZY = (Z * Y).sum(axis=0)
    trace = float(gt_diag.sum())
    f = trace - float(ZY.sum())
    if not f > _CANCELLATION * trace:
        return np.inf, np.zeros_like(params)
    ZT = (Ts @ Z.T).T if Ts is not None else Z @ T.T
    MZ = (d[:, None] * G.matmat(d[:, None] * Y.T)).T if G.is_structured else Minv @ Z
    K = Minv @ ZT @ Minv
    V = MZ - ((Ts.T @ K.T).T if Ts is not None else K @ T)
    dgc = gt_diag - ZY
    if norm == 1:
        grad = (2.0 * dgc / d)[None, :] - 2.0 * V
    else:
        grad = (2.0 * dgc / (d * d))[None, :] * T - 2.0 * V
    return f, grad.ravel()


def opt_0_tree(
    G: Gram,
    levels: int | None = None,
    *,
    ftol: float = 1e-5,
    maxiter: int = 5000,
    full: bool = True,
) -> tuple[np.ndarray, float, int]:
    """OPT_0 (pure DP) from the hierarchy of :func:`tree_start`: on its support, then on all.

    Parameters
    ----------
    G : Gram
        The workload's Gram matrix.
    levels : int, optional
        Levels of the hierarchy (default :func:`tree_levels`); ``p = 2^levels - 1``.
    ftol : float
        Relative tolerance of each stage (as in :func:`._optimize.opt_0`).
    maxiter : int
        Iteration limit of each stage.
    full : bool
        Run the second stage, over all of ``Theta``.

    Returns
    -------
    theta : ndarray, shape (p, n)
    loss : float
        ``tr(G (A^T A)^-1)`` at ``theta``, checked as :func:`._optimize.opt_0` checks it.
    nit : int
        Iterations of both stages.
    """
    n = G.n
    T0 = tree_start(n, tree_levels(n) if levels is None else int(levels))
    p = T0.shape[0]
    gdiag = G.diag()
    mask = T0.ravel() > 0
    # the support as a sparse matrix whose stored entries (row-major, as the mask's)
    # take the values of each point
    support = sp.csr_array(T0)
    whole = np.zeros(T0.size)

    def on_support(x: np.ndarray) -> tuple[float, np.ndarray]:
        whole[mask] = x
        support.data = x
        f, g = pidentity_loss_large(whole, p, G, gdiag, 1, support)
        return f, g[mask]

    x, f, nit = minimize(on_support, T0.ravel()[mask], True, ftol, maxiter)
    theta = np.zeros(T0.size)
    theta[mask] = x
    if full:

        def everywhere(y: np.ndarray) -> tuple[float, np.ndarray]:
            return pidentity_loss_large(y, p, G, gdiag, 1)

        theta, f, nit2 = minimize(everywhere, theta, True, ftol, maxiter)
        nit += nit2
    theta_pn = theta.reshape(p, n)
    return theta_pn, _checked_loss(theta_pn, 1, G, f), nit
