"""Square roots of Gram matrices: a compact operator with the same ``A^T A``.

For Gaussian noise, measuring ``y = A x + N(0, s^2 I)`` and measuring
``y' = B x + N(0, s^2 I)`` with ``B^T B = A^T A`` are equivalent: both have the same
L2 sensitivity (the column norms are the square roots of the Gram's diagonal, so
the same privacy) and their least-squares estimates ``x + N(0, s^2 (A^T A)^+)`` have
the same distribution. ``B`` has only ``n`` rows where a p-Identity strategy has
``n + p`` per attribute (32 times the cells for HDMM on the Census CPH domain), so
a release measures far fewer numbers. (Laplace noise has no such equivalence.)
"""

from __future__ import annotations

import numpy as np

from dpdask.linalg._base import LinearQuery
from dpdask.linalg._explicit import Dense
from dpdask.linalg._kron import Kron
from dpdask.linalg._primitives import Identity

__all__ = ["gram_root"]


def gram_root(A: LinearQuery) -> LinearQuery:
    """An operator ``B`` with ``B^T B = A^T A`` and at most ``n`` rows.

    Kronecker products are rooted factor by factor (``(A_1 (x) A_2)^T (A_1 (x) A_2) =
    A_1^T A_1 (x) A_2^T A_2``); an identity stays itself; anything else through its
    dense Gram (Cholesky when positive definite, else the eigen-decomposition, keeping
    only the positive part).

    Examples
    --------
    >>> from dpdask.linalg import Identity, Kron, Ones, VStack
    >>> A = VStack([Identity(3), Ones(3)])
    >>> B = gram_root(A)
    >>> B.shape, bool(np.allclose(B.T.dense() @ B.dense(), A.gram().dense()))
    ((3, 3), True)
    """
    if isinstance(A, Identity):
        return A
    if isinstance(A, Kron):
        return Kron([gram_root(f) for f in A.factors])
    G = A.gram().dense()
    try:
        return Dense(np.linalg.cholesky(G).T)
    except np.linalg.LinAlgError:
        w, V = np.linalg.eigh(G)
        keep = w > w.max() * G.shape[0] * np.finfo(float).eps
        return Dense(np.sqrt(w[keep])[:, None] * V[:, keep].T)
