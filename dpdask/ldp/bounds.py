"""The SVD lower bound on the error of any local factorization mechanism (section 5.3).

Derivation (rebuilt; the paper's proof, appendix B, maps the problem to the matrix
mechanism's SVD bound of Li and Miklau). For an ``epsilon``-LDP ``Q`` put ``A = D^-1/2 Q``,
so that ``A^T A = X = Q^T D^-1 Q`` and the objective is ``tr[X^+ G]``. For any PSD ``X``
whose range holds ``G``'s, Cauchy-Schwarz gives ``tr[X^+ G] tr[X] >= (tr G^1/2)^2`` (the
SVD bound: ``tr G^1/2`` is the sum of ``W``'s singular values). What the privacy
constraint adds is a ceiling on ``tr X = sum_o (sum_u Q_ou^2) / s_o``: each row with sum
``s_o`` contributes ``s_o rho_o`` with ``rho_o = sum_u Q_ou^2 / s_o^2``, a quasi-convex
function of each entry, so over a row whose entries lie in ``[a, a e^eps]`` it is largest
at a vertex (``k`` entries high, ``n - k`` low):
``rho_max = max_k (k e^2eps + n - k) / (k e^eps + n - k)^2``. As the row sums add up to
``n``, ``tr X <= c = n rho_max``.

A sharper form uses ``X 1 = 1`` (columns of ``Q`` sum to one): ``X = 11^T / n + X_perp``
with ``tr X_perp = tr X - 1``, so ``tr[X^+ G] >= 1^T G 1 / n + (tr (P G P)^1/2)^2 / (c - 1)``
(``P`` the projector orthogonal to ``1``). :func:`lower_bound` returns the larger of the
two. On the histogram with ``n = 2`` it equals randomized response's objective (which is
optimal there), a check in the tests.

The reference implementation's ``lower_bound`` is not used: it is not a valid bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpdask.ldp.strategy import as_epsilon, workload_gram

__all__ = ["lower_bound", "objective_lower_bound", "trace_ceiling"]


def trace_ceiling(n: int, epsilon: Any) -> float:
    """``c = n max_k (k e^2eps + n - k) / (k e^eps + n - k)^2 >= tr[Q^T D^-1 Q]`` for LDP ``Q``."""
    e = float(np.exp(float(as_epsilon(epsilon))))
    k = np.arange(0, n + 1, dtype=float)
    rho = (k * e * e + n - k) / (k * e + n - k) ** 2
    return float(n * rho.max())


def _sqrt_trace(G: np.ndarray) -> float:
    lam = np.linalg.eigvalsh((G + G.T) / 2)
    # round-off eigenvalues of a singular G would add sqrt(1e-16) = 1e-8 each: drop them
    lam = np.where(lam > 1e-12 * max(float(lam.max()), 0.0), lam, 0.0)
    return float(np.sqrt(lam).sum())


def objective_lower_bound(W: Any, epsilon: Any) -> float:
    """Lower bound on ``tr[(Q^T D^-1 Q)^+ W^T W]`` over every ``epsilon``-LDP ``Q``."""
    G = workload_gram(W)
    n = G.shape[0]
    c = trace_ceiling(n, epsilon)
    plain = _sqrt_trace(G) ** 2 / c
    one = np.ones(n)
    P = np.eye(n) - np.outer(one, one) / n
    GP = P @ G @ P
    if c - 1 <= 0:  # epsilon = 0: only constant columns; any non-constant query is unbounded
        sharp = float(one @ G @ one) / n + (np.inf if _sqrt_trace(GP) > 1e-12 else 0.0)
    else:
        sharp = float(one @ G @ one) / n + _sqrt_trace(GP) ** 2 / (c - 1)
    return float(max(plain, sharp))


def lower_bound(W: Any, epsilon: Any, alpha: float | None = None) -> float:
    """Lower bound on the worst-case variance per person of any factorization mechanism.

    ``worst >= average = (tr[X^+ G] - tr G) / n >= (bound - tr G) / n`` (Corollary 5.3).

    Parameters
    ----------
    W : LinearQuery or ndarray
        The workload.
    epsilon : number or PureDP
    alpha : float, optional
        If given, return instead the lower bound on the sample complexity at normalised
        variance ``alpha`` (the bound divided by ``p alpha``, ``p`` the number of queries).

    Examples
    --------
    >>> import numpy as np
    >>> round(lower_bound(np.eye(2), np.log(3)), 6)  # RR is optimal here: 2e/(e-1)^2 = 1.5
    1.5
    """
    G = workload_gram(W)
    n = G.shape[0]
    per_person: float = max((objective_lower_bound(W, epsilon) - float(np.trace(G))) / n, 0.0)
    if alpha is None:
        return per_person
    return per_person / (int(W.shape[0]) * float(alpha))
