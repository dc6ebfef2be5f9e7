"""p-Identity strategies ``A(Theta) = [I; Theta] D`` and their error objective (HDMM's OPT_0).

``Theta`` is a ``p x n`` parameter matrix and ``D = diag(1 / d)`` scales every
column to unit norm: ``d = 1 + 1^T Theta`` (``Theta >= 0``) for the L1 norm of
pure DP, ``d = sqrt(1 + 1^T (Theta * Theta))`` for the L2 norm of zCDP. So the
sensitivity is 1 by construction, ``A`` has full column rank (it contains a
scaled identity), and the expected error is proportional to

    f(Theta) = ||W A^+||_F^2 = tr(G (A^T A)^-1) = tr(Gt C),

with ``G = W^T W``, ``Gt = diag(d) G diag(d)`` and ``C = (I + Theta^T Theta)^-1``.

Evaluation without ``n x n`` matrices (Woodbury, ``M = I_p + Theta Theta^T``):
``C = I - Theta^T M^-1 Theta`` and ``Theta C = M^-1 Theta``. With
``Z = Theta Gt`` (``p`` applications of ``G``; ``O(n p)`` for prefix and all-range)
and ``Y = M^-1 Theta``::

    f = tr(Gt) - <Z, Y>
    diag(Gt C) = diag(Gt) - colsum(Z * Y)

Gradient: ``C`` contributes ``-2 Theta C Gt C = -2 M^-1 (Z - (Z Theta^T) Y)``; ``d``
contributes ``2 diag(Gt C)_k / d_k`` to every entry of column ``k`` (L1) or
``2 diag(Gt C)_k Theta_ik / d_k^2`` (L2). One evaluation costs ``O(n p^2 + p^3)``
plus the ``p`` Gram products, against ``O(n^2 p)`` for the direct formula.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery, NormTerms, register_operator
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import InverseGram

__all__ = ["PIdentity", "pidentity_loss"]

_CANCELLATION = 1e-8


def column_scale(theta: np.ndarray, norm: int) -> np.ndarray:
    """``d``: the column norms of ``[I; Theta]`` (L1 for ``norm=1``, L2 for ``norm=2``)."""
    out: np.ndarray
    if norm == 1:
        out = 1.0 + np.abs(theta).sum(axis=0)
    else:
        out = np.sqrt(1.0 + (theta * theta).sum(axis=0))
    return out


class PIdentity(LinearQuery):
    """The p-Identity strategy ``[I; Theta] diag(1/d)`` with unit column norms.

    Parameters
    ----------
    theta : array_like, shape (p, n)
        The ``p`` extra queries, before column scaling. Non-negative for ``norm=1``.
    norm : {1, 2}
        Which column norm is made 1: L1 (Laplace / pure DP) or L2 (Gaussian).

    Examples
    --------
    >>> A = PIdentity([[1.0, 1.0, 0.0]])
    >>> A.dense()
    array([[0.5, 0. , 0. ],
           [0. , 0.5, 0. ],
           [0. , 0. , 1. ],
           [0.5, 0.5, 0. ]])
    >>> A.sensitivity(1)
    1.0
    """

    def __init__(self, theta: np.ndarray, norm: int = 1):
        T = np.asarray(theta, dtype=float)
        if T.ndim != 2:
            raise ShapeError(f"PIdentity needs a 2-D parameter matrix, got shape {T.shape}")
        if norm not in (1, 2):
            raise ArgumentError(f"norm must be 1 or 2, got {norm!r}")
        if not np.isfinite(T).all():
            raise ArgumentError("PIdentity parameters must be finite")
        if norm == 1 and (T < 0).any():
            raise ArgumentError("an L1-normalised PIdentity needs non-negative parameters")
        self.theta = T
        self.norm = norm
        self.p, self.n = T.shape
        self.d = column_scale(T, norm)
        self.shape = (self.n + self.p, self.n)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        Xs = np.asarray(X, dtype=float) / self.d[:, None]
        return np.concatenate([Xs, self.theta @ Xs], axis=0)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        n = self.n
        out: np.ndarray = (Y[:n] + self.theta.T @ Y[n:]) / self.d[:, None]
        return out

    def _norm_terms(self, p: int) -> NormTerms:
        return NormTerms.single((1.0 + (np.abs(self.theta) ** p).sum(axis=0)) / self.d**p)

    def _params(self) -> tuple[object, ...]:
        return (self.theta, self.norm)

    def _rounding(self) -> tuple[float, float]:
        # one division per cell, then a product of length n (dpdask.linalg._rounding)
        from dpdask.linalg import UNIT_ROUNDOFF, gamma

        M = max(float(np.max(1.0 / self.d)), float(np.max(np.abs(self.theta) / self.d)))
        return (1.0 + UNIT_ROUNDOFF) * (1.0 + gamma(self.n)) - 1.0, M

    def _inverse_gram(self) -> InverseGram:
        M = np.eye(self.p) + self.theta @ self.theta.T
        L = np.linalg.cholesky(M)
        R = sla.solve_triangular(L, self.theta * self.d, lower=True)
        return InverseGram(self.d**2, R, -1)

    def pinv(self) -> LinearQuery:
        """``A^+ = (A^T A)^-1 A^T``, implicit (``A`` has full column rank)."""
        pinv: LinearQuery = _SymLowRank(self._inverse_gram()) @ self.T
        return pinv

    def __repr__(self) -> str:
        return f"PIdentity(p={self.p}, n={self.n}, norm={self.norm})"


class _SymLowRank(LinearQuery):
    """``diag(e) + s R^T R`` as an operator."""

    def __init__(self, X: InverseGram):
        self.X = X
        self.shape = (X.n, X.n)

    def _matmat(self, V: np.ndarray) -> np.ndarray:
        X = self.X
        out: np.ndarray = X.e[:, None] * V + X.sign * (X.R.T @ (X.R @ V))
        return out

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:  # symmetric
        return self._matmat(Y)


def pidentity_loss(
    params: np.ndarray, p: int, G: Gram, gdiag: np.ndarray, norm: int = 1
) -> tuple[float, np.ndarray]:
    """``f(Theta) = tr(G (A^T A)^-1)`` and its gradient (see the module docstring).

    Parameters
    ----------
    params : ndarray
        ``Theta`` flattened (``p * n`` values).
    p : int
        Rows of ``Theta``.
    G : Gram
        The workload Gram matrix.
    gdiag : ndarray
        ``diag(G)`` (precomputed).
    norm : {1, 2}
        Column normalisation.
    """
    n = gdiag.size
    T = params.reshape(p, n)
    d = column_scale(T, norm)
    Z = (d[:, None] * G.matmat(d[:, None] * T.T)).T  # Theta Gt
    M = T @ T.T
    M[np.diag_indices(p)] += 1.0
    # M = I + Theta Theta^T has eigenvalues >= 1: its explicit inverse is accurate
    # and two matrix products beat triangular solves by a wide margin.
    Minv = np.linalg.inv(M)
    Y = Minv @ T
    gt_diag = d * d * gdiag
    ZY = (Z * Y).sum(axis=0)
    trace = float(gt_diag.sum())
    f = trace - float(ZY.sum())
    if not f > _CANCELLATION * trace:
        # tr(Gt) - <Z, Y> has lost most of its digits (Theta has run off to huge
        # values, where the true loss grows without bound): refuse the point.
        return np.inf, np.zeros_like(params)
    V = Minv @ (Z - (Z @ T.T) @ Y)
    dgc = gt_diag - ZY  # diag(Gt C)
    if norm == 1:
        grad = (2.0 * dgc / d)[None, :] - 2.0 * V
    else:
        grad = (2.0 * dgc / (d * d))[None, :] * T - 2.0 * V
    return f, grad.ravel()


register_operator(
    PIdentity,
    lambda o, w: {"theta": w.array(o.theta), "norm": o.norm},
    lambda d, r: PIdentity(r.array(d["theta"]), d["norm"]),
)
