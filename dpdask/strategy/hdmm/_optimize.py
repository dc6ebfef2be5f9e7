"""HDMM's optimisers: OPT_0 (one attribute), the budget split of OPT_+, the shared solver.

Every optimiser minimises ``||A||_p^2 ||W A^+||_F^2`` over a template of strategies
with unit sensitivity, so its loss is the expected total squared error per unit
of the mechanism's noise variance at sensitivity 1 (``2 / epsilon^2`` for Laplace,
``1 / (2 rho)`` for Gaussian noise under zCDP).

* OPT_0 fits a p-Identity strategy to one Gram matrix (:mod:`._pidentity`). For
  the L2 norm (Gaussian noise) and up to :data:`dpdask.strategy.convex.CONVEX_MAX_N` cells,
  :func:`opt_0_l2` solves it instead as the convex program over ``X = A^T A``
  (:mod:`dpdask.strategy.convex`), whose optimum is global and certified by a dual bound: a
  p-Identity with ``p = n`` reaches the same optimum by L-BFGS over ``n^2``
  parameters, at ``O(n^3)`` per iteration and hundreds of iterations, where the
  dual Newton method takes ``O(n^3)`` per iteration and about ten. Prefix and
  all-range workloads, of any size, are solved by :mod:`dpdask.strategy._tridiag` (the same
  program and certificate, ``O(n)`` per evaluation of the dual).
* OPT_x (a Kronecker product of factors) is in :mod:`._opt_kron`.
* OPT_+ fits one Kronecker strategy per group of terms and splits the budget:
  with group errors ``E_g`` at unit sensitivity, part weights ``c_g`` proportional
  to ``E_g^(1/3)`` (L1: sensitivity ``sum c_g``) or ``c_g^2`` to ``E_g^(1/2)`` (L2:
  sensitivity^2 ``sum c_g^2``) minimise the total, giving ``(sum_g E_g^(1/3))^3``
  and ``(sum_g E_g^(1/2))^2``.
* OPT_M (the weights of all ``2^d`` marginals) is in :mod:`._opt_marginals`.

Solver (:func:`minimize`). ``method="lbfgs"`` (the default, :data:`METHOD`) is the
vectorised projected L-BFGS of :mod:`dpdask.strategy._lbfgs`; ``method="scipy"`` is SciPy's
L-BFGS-B. Both use the analytic gradients and reach the same optima (tested);
SciPy's adds a fixed set-up cost per call and bound handling per iteration, which
dominate on the many small factor problems of OPT_x and, on the largest
p-Identity problems, exceed the cost of the objective itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import Bounds
from scipy.optimize import minimize as scipy_minimize

from dpdask.errors import ArgumentError
from dpdask.linalg import LinearQuery
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._lbfgs import lbfgs
from dpdask.strategy.hdmm._pidentity import PIdentity, pidentity_loss

__all__ = [
    "CONVEX_TOL",
    "budget_split",
    "default_p",
    "fit_0",
    "minimize",
    "opt_0",
    "opt_0_l2",
]

METHOD = "lbfgs"
"""Default solver: ``"lbfgs"`` (vectorised, :mod:`dpdask.strategy._lbfgs`) or
``"scipy"`` (L-BFGS-B)."""


def default_p(n: int, norm: int = 1) -> int:
    """Rows of ``Theta`` used when none are given.

    L1 (Laplace): ``n / 8`` (rounded up, at most 16) on small attributes, HDMM's
    ``n / 16`` for ``256 <= n <= 1024``, and 64 beyond: one evaluation costs
    ``O(n p^2)``, so at ``n = 4096`` HDMM's ``p = 256`` costs 16 times as much per
    evaluation as ``p = 64`` (and needs more iterations) for a small gain in error
    (BENCHMARKS.md). L2 (Gaussian): the optimum
    is close to ``(W^T W)^(1/4)``, which needs a full-rank ``Theta``: ``p = n`` up to
    1024, then ``n / 8``.
    """
    if norm == 1:
        if n < 256:
            return max(1, min(-(-n // 8), 16))
        return n // 16 if n <= 1024 else 64
    return n if n <= 1024 else max(1024, n // 8)


def minimize(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    nonneg: bool,
    ftol: float,
    maxiter: int,
    method: str | None = None,
) -> tuple[np.ndarray, float, int]:
    method = METHOD if method is None else method
    if method not in ("lbfgs", "scipy"):
        raise ArgumentError(f"method must be 'lbfgs' or 'scipy', got {method!r}")
    if method == "scipy":
        res = scipy_minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            bounds=Bounds(0.0, np.inf) if nonneg else None,
            options={"ftol": ftol, "gtol": 1e-12, "maxiter": maxiter},
        )
        return res.x, float(res.fun), int(res.nit)
    res = lbfgs(fun, x0, ftol=ftol, maxiter=maxiter, nonneg=nonneg)
    return res.x, res.fun, res.nit


def opt_0(
    G: Gram,
    p: int | None = None,
    *,
    norm: int = 1,
    seed: int = 0,
    theta0: np.ndarray | None = None,
    ftol: float = 1e-5,
    maxiter: int = 5000,
    method: str | None = None,
) -> tuple[np.ndarray, float, int]:
    """OPT_0: the p-Identity strategy minimising ``tr(G (A^T A)^-1)``.

    Parameters
    ----------
    G : Gram
        The workload's Gram matrix.
    p : int, optional
        Rows of ``Theta`` (default :func:`default_p`).
    norm : {1, 2}
        Sensitivity norm (1: Laplace, 2: Gaussian).
    seed : int
        Seed of the random start (``Theta`` uniform on ``[0, 1)``).
    theta0 : ndarray, optional
        A start to use instead (warm start).
    ftol : float
        Stop when one iteration improves the loss by less than this fraction.
    maxiter : int
        Iteration limit.
    method : {"lbfgs", "scipy"}, optional
        Solver (default :data:`METHOD`).

    Returns
    -------
    theta : ndarray, shape (p, n)
    loss : float
        ``tr(G (A^T A)^-1)`` at ``theta`` (the error at unit sensitivity), checked
        against an independent evaluation (:func:`_checked_loss`).
    nit : int
        Iterations used.
    """
    theta, f, nit = fit_0(
        G, p, norm=norm, seed=seed, theta0=theta0, ftol=ftol, maxiter=maxiter, method=method
    )
    return theta, _checked_loss(theta, norm, G, f), nit


def fit_0(
    G: Gram,
    p: int | None = None,
    *,
    norm: int = 1,
    seed: int = 0,
    theta0: np.ndarray | None = None,
    ftol: float = 1e-5,
    maxiter: int = 5000,
    method: str | None = None,
) -> tuple[np.ndarray, float, int]:
    """:func:`opt_0` without the independent check of the loss (for callers that
    recompute the error of ``theta`` themselves, as OPT_x's sweeps do)."""
    n = G.n
    if theta0 is None:
        p = default_p(n, norm) if p is None else int(p)
        x0 = np.random.default_rng(seed).random(p * n)
    else:
        p = theta0.shape[0]
        x0 = np.asarray(theta0, dtype=float).ravel().copy()
    gdiag = G.diag()

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        return pidentity_loss(x, p, G, gdiag, norm)

    x, f, nit = minimize(fun, x0, norm == 1, ftol, maxiter, method)
    return x.reshape(p, n), f, nit


CONVEX_TOL = 1e-4
"""Relative duality gap at which :func:`opt_0_l2` stops."""


def opt_0_l2(G: Gram, *, tol: float = CONVEX_TOL) -> tuple[LinearQuery, float, int, float]:
    """OPT_0 for the L2 norm: ``min tr(G X^+)`` over ``X = A^T A`` with ``diag(X) <= 1``.

    Parameters
    ----------
    G : Gram
        The workload's Gram matrix.
    tol : float
        Relative duality gap at which to stop.

    Returns
    -------
    strategy : Dense
        ``A`` with largest column L2 norm 1 (``r x n``, ``r`` the rank of ``G``).
    loss : float
        ``tr(G (A^T A)^+)``, the error at unit sensitivity.
    nit : int
        Newton iterations (evaluations of the dual for :mod:`dpdask.strategy._tridiag`).
    lower_bound : float
        The dual bound: no strategy has a loss below it.
    """
    from dpdask.strategy._tridiag import tridiagonal_ca
    from dpdask.strategy.convex import ca_solve_gram

    sol = tridiagonal_ca(G, tol=tol, max_iter=100) or ca_solve_gram(G.dense(), tol=tol)
    return sol.strategy, float(sol.error), int(sol.iterations), float(sol.lower_bound)


LOSS_RTOL = 1e-6
"""Largest relative gap between the optimiser's loss and the loss recomputed at its answer."""


def _checked_loss(theta: np.ndarray, norm: int, G: Gram, f: float) -> float:
    """The loss at ``theta``: the optimiser's ``f`` unless an independent evaluation disagrees.

    The objective's Woodbury form ``tr(Gt) - <Z, Y>`` loses digits where ``Theta`` runs
    off to huge values (``M = I + Theta Theta^T`` is then ill-conditioned), and the
    optimiser can end there on a value well below the true loss (on ``Prefix(12)``,
    55.1 reported for 67.4 actual). The loss is recomputed through the Cholesky
    factor of ``M`` (:func:`inverse_gram`, as every error analysis does) and that
    value is returned when the two differ by more than :data:`LOSS_RTOL`.
    """
    exact = float(inverse_gram(PIdentity(theta, norm)).trace(G))
    if not abs(exact - f) <= LOSS_RTOL * abs(exact):
        return exact
    return f


def budget_split(errors: Sequence[float], norm: int = 1) -> tuple[np.ndarray, float]:
    """Weights of the parts of a union and the union's loss.

    Parameters
    ----------
    errors : sequence of float
        ``E_g = ||W_g A_g^+||_F^2`` of each part at unit sensitivity.
    norm : {1, 2}
        Sensitivity norm.

    Returns
    -------
    weights : ndarray
        ``c_g`` with ``sum c_g = 1`` (L1) or ``sum c_g^2 = 1`` (L2).
    loss : float
        ``(sum E^(1/3))^3`` or ``(sum E^(1/2))^2``.
    """
    E = np.asarray(errors, dtype=float)
    if norm == 1:
        c = np.cbrt(E)
        total = c.sum()
        return c / total, float(total**3)
    c2 = np.sqrt(E)
    total = c2.sum()
    return np.sqrt(c2 / total), float(total**2)
