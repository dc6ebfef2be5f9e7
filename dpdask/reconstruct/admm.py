"""Maximum-likelihood reconstruction under constraints by ADMM (Lee, Wang and Kifer; paper 001).

Measurements ``y = A x + noise`` with Laplace noise have log-likelihood
``-sum_i |(A x - y)_i| / b_i``, so the maximum-likelihood estimate under what is
known about the data -- counts are non-negative, published totals ``E x = d`` are
exact, a tree of counts adds up -- is a constrained L1 problem (7). The elastic
net ``alpha |r| + (1 - alpha) r^2`` (23) makes the solution unique, and
``1/2 r^2`` gives constrained least squares (section 4.6). All three are solved by
the alternating direction method of multipliers with scaled duals:

**Matrix-mechanism form** (Algorithms 1, 2 and 4; any implicit strategy ``A``)::

    s <- prox_{phi/rho}(A x - y + u)                  residual, closed form (13), (14)
    z <- P_{x >= 0}(x + v)                            projection (12); z <- x + v if unconstrained
    x <- (A^T A + I + E^T E)^-1 (A^T (y + s - u) + (z - v) + E^T (d - w))
    u <- u + A x - y - s;  v <- v + x - z;  w <- w + E x - d

For ``A = I`` this is exactly Algorithm 1/2 (``A^T A + I = 2 I``). The linear system
is factored once (:mod:`._admm_system`): by the eigendecomposition of every factor's
Gram matrix for a Kronecker strategy, with the equality constraints added by the
Woodbury identity; by a dense Cholesky factor when ``n`` is small; otherwise by
conjugate gradients warm-started from the previous iterate.

**Tree form** (Algorithm 3; ``tree=HierarchicalTree``). The variables are the node
counts of a hierarchical histogram; consistency is the least-squares tree
projection ``H_tree`` and non-negativity a clip, each a separate split::

    s <- prox(x - y + mu);  z <- H_tree(x + nu);  w <- (x + eta)_+
    x <- ((s + y - mu) + (z - nu) + (w - eta)) / 3;  then the dual updates

Stopping rule (section 4.4): the primal residuals (every constraint's violation)
and the dual residual ``rho * ||x_k+1 - x_k||`` (through ``A`` where it appears in
a constraint) must both fall below ``tol * (sqrt(dim) + size)``, the absolute and
relative tolerance of Boyd et al. (section 3.3.1), checked per right-hand side.

Scale: ``rho`` works best when the residuals are of order one. Given the Laplace
scale ``b`` of the measurements (``scale=``), the problem is solved in units of
``b`` -- rows divided by ``b_i``, the unknowns by a common ``c = min b`` -- which is
also the maximum-likelihood weighting when the scales differ. Without ``scale`` the
objective is the paper's, on raw counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, ShapeError
from dpdask.linalg import (
    Identity,
    LinearQuery,
    aslinearquery,
)
from dpdask.reconstruct._admm_system import x_solver
from dpdask.reconstruct._inputs import as_batch, row_weighted
from dpdask.reconstruct._report import ConvergenceReport, Estimate, warn_at_limit
from dpdask.reconstruct.tree import HierarchicalTree

__all__ = ["admm"]

LOSSES = ("l1", "enet", "l2")


# -- proximal operators ---------------------------------------------------------------
def prox(loss: str, alpha: float, rho: float) -> Callable[[np.ndarray], np.ndarray]:
    """``v -> argmin_s phi(s) + rho/2 ||s - v||^2`` for the loss ``phi``.

    ``l1``: soft thresholding at ``1/rho`` (13); ``enet``, ``phi = alpha |s| + (1 - alpha)
    s^2``: the thresholding operator ``Theta_{alpha,rho}`` (14); ``l2``, ``phi = s^2 / 2``:
    ``rho v / (1 + rho)``.
    """
    if loss == "l1":
        t = 1.0 / rho
        return lambda v: np.sign(v) * np.maximum(np.abs(v) - t, 0.0)
    if loss == "enet":
        t, shrink = alpha / rho, rho / (2.0 * (1.0 - alpha) + rho)
        return lambda v: np.sign(v) * np.maximum(np.abs(v) - t, 0.0) * shrink
    if loss == "l2":
        shrink = rho / (1.0 + rho)
        return lambda v: shrink * v
    raise ArgumentError(f"unknown loss {loss!r}; expected one of {LOSSES}")


# -- argument handling ------------------------------------------------------------
def _row_scale(scale: np.ndarray | float | None, m: int) -> tuple[np.ndarray | None, float]:
    """Per-row Laplace scales (None if all equal) and the common unit ``c``."""
    if scale is None:
        return None, 1.0
    b = np.asarray(scale, dtype=float)
    if b.ndim != 0 and b.shape != (m,):
        raise ShapeError(f"scale has shape {b.shape}; expected a scalar or ({m},)")
    if not np.isfinite(b).all() or (b <= 0).any():
        raise ArgumentError("scale must be positive and finite")
    if b.ndim == 0 or np.all(b == b.flat[0]):
        return None, float(b.flat[0])
    return b, float(b.min())


def _check_tree(A: LinearQuery, tree: HierarchicalTree) -> None:
    if not isinstance(tree, HierarchicalTree):
        raise ArgumentTypeError(f"tree must be a HierarchicalTree, got {type(tree).__name__}")
    if A.shape != tree.shape:
        raise ShapeError(f"strategy has shape {A.shape} but the tree's strategy is {tree.shape}")
    probe = np.sin(np.arange(1.0, tree.n + 1.0))  # a fixed, generic test vector
    if not np.allclose(A @ probe, tree.answers(probe), rtol=1e-9, atol=1e-9 * tree.n):
        raise ArgumentError("the strategy does not answer the tree's nodes in breadth-first order")


# -- the iterations -----------------------------------------------------------------
def admm(
    A: LinearQuery,
    y: np.ndarray,
    loss: str = "l1",
    alpha: float = 0.9,
    rho: float = 2.0,
    equality: tuple[LinearQuery | np.ndarray, np.ndarray] | None = None,
    nonneg: bool = True,
    tree: HierarchicalTree | None = None,
    *,
    scale: np.ndarray | float | None = None,
    x0: np.ndarray | None = None,
    tol: float = 1e-3,
    maxiter: int = 10_000,
    check_every: int = 5,
) -> Estimate:
    """Maximum-likelihood estimate of ``x`` from ``y = A x + noise`` under constraints.

    Minimises ``sum_i phi((A x - y)_i / b_i)`` subject to ``E x = d`` (``equality``),
    ``x >= 0`` (``nonneg``) and, in the tree form, consistency of a hierarchical
    histogram, by ADMM (see the module docstring for the iterations).

    Parameters
    ----------
    A : LinearQuery
        The strategy, ``m x n``, implicit.
    y : ndarray
        Noisy answers, ``(m,)`` or ``(g, m)`` for ``g`` geographies (solved together).
    loss : {"l1", "enet", "l2"}
        ``phi(r) = |r|`` (Laplace maximum likelihood), ``alpha |r| + (1 - alpha) r^2``
        (elastic net, a unique solution), or ``r^2 / 2`` (least squares).
    alpha : float
        Elastic-net mixing in ``[0, 1]``; 0.9 as in the paper.
    rho : float
        ADMM penalty (> 0); 2.0 as in the paper.
    equality : (E, d), optional
        Known linear statistics ``E x = d``: ``E`` a ``p x n`` operator or array, ``d`` of
        shape ``(p,)`` or ``(g, p)``. Matrix-mechanism form only.
    nonneg : bool
        Constrain ``x >= 0``; the returned estimate is then exactly non-negative.
    tree : HierarchicalTree, optional
        Use the tree form (Algorithm 3): ``A`` must be ``tree.strategy()`` (checked).
    scale : float or ndarray, optional
        The Laplace scale ``b`` of every measurement (scalar or ``(m,)``): the objective
        is then in units of ``b`` (see the module docstring).
    x0 : ndarray, optional
        Starting estimate ``(n,)`` or ``(g, n)``. Default: ``y`` for ``A = I`` and the
        tree form (as in the paper), otherwise the ridge solution of the x-update.
    tol : float
        Absolute and relative tolerance of the stopping rule (in units of ``scale``).
    maxiter : int
        Iteration limit; a batch that has not converged is reported, not hidden
        (``report.converged`` is False and a :class:`~dpdask.errors.ConvergenceWarning`
        is emitted).
    check_every : int
        Evaluate the stopping rule every this many iterations.

    Returns
    -------
    Estimate
        ``x`` of shape ``(n,)`` or ``(g, n)`` and the report (``method="admm-<loss>"``;
        ``details`` holds the form, the linear solver and the final residuals).

    Raises
    ------
    ValueError
        On an unknown loss, bad parameters, shapes that do not match, or a tree that
        is not the strategy.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total
    >>> y = np.array([3.0, -1.0, 4.0])  # noisy counts whose total is known to be 6
    >>> x, report = admm(Identity(3), y, "enet", equality=(Total(3), np.array([6.0])), tol=1e-9)
    >>> np.round(x, 4).tolist(), report.converged
    ([2.5, 0.0, 3.5], True)
    """
    if loss not in LOSSES:
        raise ArgumentError(f"unknown loss {loss!r}; expected one of {LOSSES}")
    if not 0.0 <= alpha <= 1.0:
        raise ArgumentError(f"alpha must lie in [0, 1], got {alpha!r}")
    if not rho > 0 or not math.isfinite(rho):
        raise ArgumentError(f"rho must be positive and finite, got {rho!r}")
    if not tol > 0 or maxiter < 1 or check_every < 1:
        raise ShapeError("tol must be positive and maxiter, check_every at least 1")
    A = aslinearquery(A)
    m, n = A.shape
    Y, single = as_batch(y, m, "measurements")
    b_rows, c = _row_scale(scale, m)
    ctl = _Control(loss, alpha, rho, Y.shape[0], tol, maxiter, check_every)
    if tree is not None:
        if equality is not None:
            raise ArgumentError(
                "equality constraints are not supported in the tree form; "
                "pass the strategy without tree= to use the matrix-mechanism form"
            )
        _check_tree(A, tree)
        b_nodes = np.full(m, c) if b_rows is None else b_rows
        start = None if x0 is None else as_batch(x0, n, "starting values")[0]
        X, details = _tree_form(tree, Y / b_nodes, b_nodes, nonneg, start, ctl)
    else:
        Aw = A if b_rows is None else row_weighted(A, (c / b_rows) ** 2)
        Ys = Y / (c if b_rows is None else b_rows)
        E, D = None, None
        if equality is not None:
            E = aslinearquery(equality[0])
            if E.shape[1] != n:
                raise ShapeError(f"equality operator has {E.shape[1]} columns; expected {n}")
            D, _ = as_batch(equality[1], E.shape[0], "equality values")
            D = np.broadcast_to(D, (Y.shape[0], E.shape[0])) / c
        start = None if x0 is None else as_batch(x0, n, "starting values")[0] / c
        X, details = _matrix_form(Aw, Ys, E, D, nonneg, start, ctl)
        X = X * c
    report = ctl.report(f"admm-{loss}", details)
    warn_at_limit(report, maxiter)
    Xt = X.T
    return Estimate(Xt[0] if single else Xt, report)


class _Control:
    """The stopping rule and the bookkeeping of the right-hand sides still iterating."""

    def __init__(
        self, loss: str, alpha: float, rho: float, k: int, tol: float, maxiter: int,
        check_every: int,
    ) -> None:  # fmt: skip
        self.step = prox(loss, alpha, rho)
        self.rho = rho
        self.tol, self.maxiter, self.check_every = tol, maxiter, check_every
        self.active = np.arange(k)
        self.out: np.ndarray | None = None
        self.iterations = np.zeros(k, dtype=np.int64)
        self.pri = np.full(k, np.inf)
        self.dual = np.full(k, np.inf)
        self.converged = np.zeros(k, dtype=bool)

    def due(self, it: int) -> bool:
        return it % self.check_every == 0 or it == self.maxiter

    def check(
        self, it: int, pri: np.ndarray, dual: np.ndarray, size_pri: np.ndarray,
        size_dual: np.ndarray, dims_pri: float, dims_dual: float, out: np.ndarray,
    ) -> np.ndarray:  # fmt: skip
        """Apply the stopping rule; return which of the active columns keep running."""
        tol = self.tol
        eps_pri = tol * (dims_pri + size_pri)
        eps_dual = tol * (dims_dual + self.rho * size_dual)
        pri_n, dual_n = pri / eps_pri, dual / eps_dual  # converged when both <= 1
        done = (pri_n <= 1.0) & (dual_n <= 1.0)
        idx = self.active
        if self.out is None:
            self.out = np.zeros((out.shape[0], idx.size))
        self.pri[idx], self.dual[idx] = pri_n * tol, dual_n * tol
        self.iterations[idx] = it
        self.out[:, idx[done]] = out[:, done]
        self.converged[idx[done]] = True
        keep = ~done
        self.active = idx[keep]
        return keep

    def report(self, method: str, details: dict[str, Any]) -> ConvergenceReport:
        worst = np.maximum(self.pri, self.dual)
        return ConvergenceReport(
            method=method,
            converged=bool(self.converged.all()),
            iterations=int(self.iterations.max(initial=0)),
            residual=float(worst.max(initial=0.0)),
            tolerance=self.tol,
            details={
                **details,
                "primal_residual": float(self.pri.max(initial=0.0)),
                "dual_residual": float(self.dual.max(initial=0.0)),
                "not_converged": int((~self.converged).sum()),
            },
        )

    def result(self, running: np.ndarray) -> np.ndarray:
        """All columns: finished ones as recorded, still-running ones from ``running``."""
        assert self.out is not None
        if self.active.size:
            self.out[:, self.active] = running
        return self.out


def _colnorm(*arrays: np.ndarray) -> np.ndarray:
    norms: np.ndarray = np.sqrt(sum(np.einsum("ij,ij->j", a, a) for a in arrays))
    return norms


def _matrix_form(
    A: LinearQuery,
    Y: np.ndarray,
    E: LinearQuery | None,
    D: np.ndarray | None,
    nonneg: bool,
    X0: np.ndarray | None,
    ctl: _Control,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithms 1, 2 and 4 on all columns of ``Y.T`` at once (unknowns in units of ``c``)."""
    m, n = A.shape
    p = 0 if E is None else E.shape[0]
    solver = x_solver(A, E)
    Yt = Y.T.copy()
    Dt = np.zeros((0, Yt.shape[1])) if D is None else D.T.copy()
    k = Yt.shape[1]
    if X0 is not None:
        X = np.broadcast_to(X0, (k, n)).T.copy()
    elif isinstance(A, Identity):
        X = Yt.copy()
    else:
        R = A._rmatmat(Yt) + (0.0 if E is None else E._rmatmat(Dt))
        X = solver.solve(R, None)
    AX = A._matmat(X)
    U, V, W = np.zeros((m, k)), np.zeros((n, k)), np.zeros((p, k))
    Z = np.maximum(X, 0.0) if nonneg else X.copy()
    EX = rE = np.zeros((p, k))
    dims_pri, dims_dual = math.sqrt(m + n + p), math.sqrt(n)
    for it in range(1, ctl.maxiter + 1):
        S = ctl.step(AX - Yt + U)
        Z = np.maximum(X + V, 0.0) if nonneg else X + V
        R = A._rmatmat(Yt + S - U) + (Z - V)
        if E is not None:
            R += E._rmatmat(Dt - W)
        Xn = solver.solve(R, X)
        AXn = A._matmat(Xn)
        rA, rZ = AXn - Yt - S, Xn - Z
        U += rA
        V += rZ
        if E is not None:
            EX = E._matmat(Xn)
            rE = EX - Dt
            W += rE
        if ctl.due(it):
            pri = _colnorm(rA, rZ, rE)
            dual = ctl.rho * _colnorm(AXn - AX, Xn - X)
            size_pri = np.maximum(_colnorm(AXn, Xn, EX), _colnorm(Yt + S, Z, Dt))
            size_dual = _colnorm(A._rmatmat(U) + V + (0.0 if E is None else E._rmatmat(W)))
            keep = ctl.check(it, pri, dual, size_pri, size_dual, dims_pri, dims_dual,
                                Z if nonneg else Xn)  # fmt: skip
            if not keep.any():
                break
            if not keep.all():
                Xn, AXn, Z, U, V, W, Yt, Dt, EX, rE = (
                    a[:, keep] for a in (Xn, AXn, Z, U, V, W, Yt, Dt, EX, rE)
                )
        X, AX = Xn, AXn
    details: dict[str, Any] = {"form": "matrix", "solver": solver.kind}
    if solver.inner_iterations:
        details["inner_cg_iterations"] = int(sum(solver.inner_iterations))
    return ctl.result(Z if nonneg else X), details


def _tree_form(
    tree: HierarchicalTree,
    Yn: np.ndarray,
    b_nodes: np.ndarray,
    nonneg: bool,
    X0: np.ndarray | None,
    ctl: _Control,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithm 3 in node space, in units of each node's scale; returns the leaves ``(n, k)``."""
    m = tree.m
    project_raw = tree.projector(b_nodes**2)  # GLS projection of node counts
    bcol = b_nodes[:, None]

    def project(Un: np.ndarray) -> np.ndarray:  # Euclidean projection in standardised units
        projected: np.ndarray = project_raw(Un * bcol) / bcol
        return projected

    Yt = Yn.T.copy()
    k = Yt.shape[1]
    X = Yt.copy() if X0 is None else np.broadcast_to(tree.answers(X0.T) / bcol, (m, k)).copy()
    Mu, Nu, Eta = np.zeros((m, k)), np.zeros((m, k)), np.zeros((m, k))
    W = X
    dims_pri, dims_dual = math.sqrt(3 * m), math.sqrt(m)
    for it in range(1, ctl.maxiter + 1):
        S = ctl.step(X - Yt + Mu)
        Z = project(X + Nu)
        W = np.maximum(X + Eta, 0.0) if nonneg else X + Eta
        Xn = ((S + Yt - Mu) + (Z - Nu) + (W - Eta)) / 3.0
        r1, r2, r3 = Xn - S - Yt, Xn - Z, Xn - W
        Mu += r1
        Nu += r2
        Eta += r3
        if ctl.due(it):
            pri = _colnorm(r1, r2, r3)
            dual = ctl.rho * math.sqrt(3.0) * _colnorm(Xn - X)
            size_pri = np.maximum(math.sqrt(3.0) * _colnorm(Xn), _colnorm(S + Yt, Z, W))
            size_dual = _colnorm(Mu + Nu + Eta)
            out = W if nonneg else Z
            keep = ctl.check(it, pri, dual, size_pri, size_dual, dims_pri, dims_dual, out)
            if not keep.any():
                break
            if not keep.all():
                Xn, Mu, Nu, Eta, Yt, W, Z = (a[:, keep] for a in (Xn, Mu, Nu, Eta, Yt, W, Z))
        X = Xn
    nodes = ctl.result(W if nonneg else Z) * bcol
    return tree.leaves(nodes), {"form": "tree", "solver": "tree"}
