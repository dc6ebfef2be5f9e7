"""Projected Newton for the children's fit, over the product of the cells' simplices.

The problem (:mod:`dpdask.reconstruct.topdown`), in the Jacobi-scaled variables ``U``
``(K, |S|)`` of one parent's support: minimise ``f(U) = 1/2 sum_c u_c^T H u_c - <C, U>``
(``H = G~[S, S]``, unit diagonal; the Hessian is ``I_K (x) H``) over ``U >= 0`` with
``sum_c u_cj = t_j`` for every cell ``j``. Each iteration (after Bertsekas' projected
Newton, 1982, on the cells' simplices):

1. **Free and binding children.** In each cell the multiplier ``nu_j`` is estimated by
   the mean gradient of its children above ``eps = max(tol, min(1e-2, ||U - P(U -
   grad)||))`` (the largest child always counts); ``r_cj = grad_cj - nu_j`` is the
   reduced gradient (at a KKT point ``r = 0`` where ``u > 0`` and ``r >= 0`` where
   ``u = 0``). Children above ``eps``, and positive ones with ``r <= 0``, are *free*; a
   positive child at most ``eps`` with ``r > 0`` is *binding* and moved to zero (its
   mass to the cell's largest child); a child at zero is freed when ``r`` is below
   ``-2 x`` the root-mean-square KKT residual and the violations left at zero exceed
   half the stopping rule's budget (:func:`dpdask.reconstruct._newton._freeing_threshold`:
   freeing every slightly negative one makes the free set flip).
2. **Newton direction** on the free set ``F``, subject to the cells' sums:
   ``min g_F^T d + 1/2 d^T (I (x) H)_FF d`` with ``sum_{c in F_j} d_cj = 0``. Eliminating a
   dependent child ``c*`` per cell (``d_c*j = -sum_{c != c*} d_cj``, ``d = Z v``) gives on
   a cell where all ``K`` children are free the reduced Hessian ``Z^T (I (x) H) Z =
   (I_{K-1} + 1 1^T) (x) H``, whose condition number is ``K`` times ``H``'s; instead the
   direction is sought in the same null space with an orthonormal basis: conjugate
   residuals on ``P (I (x) H)_FF P``, ``P`` the orthogonal projection that removes each
   cell's mean over its free children (its spectrum on the range of ``P`` lies within
   ``H``'s). A cell with one free child is fixed for the step (``P`` zeroes it) and
   left out of the inner solves: most cells of a sparse family are. The products are
   ``H[F_c, F_c]`` per child, restricted to its free children
   (:meth:`~dpdask.reconstruct._kron_gram.ScaledKronGram.restricted`, a fraction of a
   full product on a sparse child; for a union Gram the ``K`` children's vectors in
   one product of ``K`` rows on the whole domain), in float32, with
   :mod:`dpdask.reconstruct._newton`'s iteration budget (10, doubled up to 40 while
   they stagnate). A second pass sets the free children the direction sends below
   zero aside (their move to zero, the cell's largest child taking their mass, becomes
   part of the direction, so a short step moves them a little) and solves again for
   the others from the gradient after that move (one more product): without it the
   next iteration finds the rest of the cell overshot and frees the clipped children
   again, and the KKT residual alternates for dozens of iterations.
3. **Step** along the arc ``U + alpha D + M`` (``D`` the direction, ``M`` the binding
   children's move to zero; both keep every cell's sum) with negative entries set to
   zero and their excess taken from the cell's largest child (a cell whose largest child
   would then fall below zero is projected onto its simplex). Along the step ``s`` of
   an ``alpha`` the move is ``tau s``: ``tau = 1`` when it passes the Armijo test, else
   the exact minimiser of the quadratic ``f`` along ``s``. ``alpha = 1`` first; if it is
   no descent direction ``alpha`` is halved (no product) up to 8 times; if ``tau < 1``,
   up to three halvings more (a product each), keeping the largest decrease of ``f``.
   When no arc step decreases ``f``, the projected gradient step (with its ``tau``)
   replaces it.
4. **Safeguard.** Every 20 iterations the KKT residual must have fallen to half its
   value 20 iterations before; otherwise the method stops, marked ``stalled``, and
   :mod:`dpdask.reconstruct.topdown` finishes with FISTA from there (globally
   convergent). A nearly singular ``H`` on the free set (a rank-deficient strategy) can
   make the directions almost orthogonal to the gradient, the steps then tiny.

``U H`` is updated by the steps' products (float32 for a Kronecker or union Gram) and
recomputed in float64 every 20 iterations and before stopping; after three exact checks
that fail, the steps' products are float64 too. The stopping rule is FISTA's
(:mod:`dpdask.reconstruct.topdown`): the root-mean-square KKT residual
``||U - P(U - grad)|| / sqrt(K |S|)`` from a float64 gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpdask.reconstruct._newton import _conjugate_residual, _freeing_threshold, _inner_budget
from dpdask.reconstruct.topdown._fista import project_threshold
from dpdask.reconstruct.topdown._level import SupportGram

__all__ = ["kkt_residual", "simplex_newton"]

_GAMMA = 1e-4  # sufficient decrease
_REFRESH = 20  # recompute U H in float64 every this many iterations
_INNER = 10  # conjugate-residual iterations per direction, at first
_EPS = 1e-2  # the epsilon-active threshold is at least min(this, ||projected gradient||)
_THETA = 2.0  # a child at zero is freed when its reduced gradient is below -this x rms
_ARC = 8  # halvings of the Newton step (no product) before a gradient step
_ARC_SEARCH = 3  # halvings with a product when the full step fails Armijo
_STALL = 20  # every this many iterations the KKT residual must have shrunk
_STALL_RATIO = 0.5  # by this factor, else the method stops (stalled) for FISTA
_CHECKS = 3  # exact checks that fail before the steps' products are taken in float64

Product = Callable[[np.ndarray, bool], np.ndarray]


@dataclass
class _Counts:
    products: int = 0  # products of K rows with H (float64 or fast)
    inner: int = 0  # inner iterations (a product restricted to the free children each)
    fallbacks: int = 0  # projected gradient steps


def kkt_residual(U: np.ndarray, grad: np.ndarray, t: np.ndarray) -> float:
    """The root-mean-square KKT residual ``||U - P(U - grad)|| / sqrt(U.size)``, ``P`` the
    projection onto the cells' simplices with sums ``t``."""
    P, _ = project_threshold(U - grad, t)
    return float(np.linalg.norm(U - P) / np.sqrt(U.size))


class _FreeSet:
    """The free children of the cells with more than one as a flat vector (child by
    child), with the projection that removes each cell's mean over them."""

    def __init__(self, free: np.ndarray, gram: SupportGram, dtype: npt.DTypeLike):
        K, S = free.shape
        many = free.sum(axis=0) > 1
        self.flat = np.flatnonzero(free & many)
        child, self.cell = np.divmod(self.flat, S)
        self.bounds = np.searchsorted(child, np.arange(K + 1))
        self.count = np.maximum(np.bincount(self.cell, minlength=S), 1).astype(float)
        self.S, self.dtype = S, dtype
        pairs = list(zip(self.bounds[:-1], self.bounds[1:], strict=True))
        self.batch = gram.batched([self.cell[a:b] for a, b in pairs], dtype)
        self.ops = (
            [gram.sub(self.cell[a:b], dtype) if b > a else None for a, b in pairs]
            if self.batch is None
            else []
        )

    def project(self, v: np.ndarray) -> np.ndarray:
        mean = np.bincount(self.cell, weights=v, minlength=self.S) / self.count
        out: np.ndarray = (v - mean[self.cell]).astype(self.dtype)
        return out

    def hessian(self, counts: _Counts) -> Callable[[np.ndarray], np.ndarray]:
        """``v -> P (I (x) H)_FF v`` for ``v`` in the range of ``P``."""

        def op(v: np.ndarray) -> np.ndarray:
            counts.inner += 1
            if self.batch is not None:
                return self.project(self.batch(v))
            out = np.empty_like(v)
            for c, f in enumerate(self.ops):
                if f is not None:
                    a, b = self.bounds[c], self.bounds[c + 1]
                    out[a:b] = f(v[a:b])
            return self.project(out)

        return op

    def scatter(self, d: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        D = np.zeros(shape)
        D.ravel()[self.flat] = d
        return D


def _absorb(M: np.ndarray, top: np.ndarray) -> np.ndarray:
    """``M`` with each cell's largest child taking what the others give up."""
    cols = np.arange(M.shape[1])
    M[top, cols] = 0.0
    M[top, cols] = -M.sum(axis=0)
    return M


def _arc(
    U: np.ndarray, D: np.ndarray, M: np.ndarray, t: np.ndarray, top: np.ndarray, alpha: float
) -> np.ndarray:
    """The step to ``U + alpha D + M`` with negative entries set to zero and their
    excess taken from the cell's largest child; a cell whose largest child would then
    fall below zero is projected onto its simplex."""
    V = U + alpha * D
    V += M
    cols = np.arange(U.shape[1])
    neg = np.minimum(V, 0.0).sum(axis=0)
    np.maximum(V, 0.0, out=V)
    V[top, cols] += neg
    bad = np.flatnonzero(V[top, cols] < 0)
    if bad.size:
        W = U[:, bad] + alpha * D[:, bad] + M[:, bad]
        V[:, bad] = project_threshold(W, t[bad])[0]
    step: np.ndarray = V - U
    return step


def _sets(
    U: np.ndarray, grad: np.ndarray, rms: float, tol: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The free children (a mask), the binding children's move to zero ``M`` (the
    cells' largest children ``top`` taking their mass), and ``top``."""
    S = U.shape[1]
    eps = max(tol, min(_EPS, rms * np.sqrt(U.size)))
    top = np.argmax(U, axis=0)
    big = U > eps
    big[top, np.arange(S)] = True
    nu = np.where(big, grad, 0.0).sum(axis=0) / big.sum(axis=0)
    red = grad - nu
    zero = U <= 0
    gz = red[zero & (red <= 0)]
    budget = U.size * tol * tol
    threshold = _freeing_threshold(gz, np.ones(gz.size, bool), _THETA * rms, budget)
    free = big | ((red <= 0) & ~zero) | (zero & (red <= -threshold))
    moved = ~big & ~zero & (red > 0)
    return free, _absorb(np.where(moved, -U, 0.0), top), top


def _direction(
    gram: SupportGram, U: np.ndarray, grad: np.ndarray,
    sets: tuple[np.ndarray, np.ndarray, np.ndarray], budget: int,
    product: Product, counts: _Counts, dtype: npt.DTypeLike,
) -> tuple[np.ndarray, np.ndarray, float]:  # fmt: skip
    """The Newton direction ``D`` and the binding move ``M`` (two passes, module notes),
    and what the last inner solve left of its residual."""
    free, M, top = sets
    g = grad
    clip = None
    for second in (False, True):
        fs = _FreeSet(free, gram, dtype)
        d, left = _conjugate_residual(fs.hessian(counts), fs.project(-g.ravel()[fs.flat]), budget)
        D = fs.scatter(d, U.shape)
        if second:
            break
        clipped = free & (U + D + M < 0)
        clipped[top, np.arange(U.shape[1])] = False
        if not clipped.any():
            break
        # the clipped children's move to zero is part of the direction (scaled with the
        # step along the arc), not of the binding move: a short step moves them a little
        clip = _absorb(np.where(clipped, -U, 0.0), top)
        free = free & ~clipped
        g = grad + product(M + clip, False)
    return (D if clip is None else D + clip), M, left


def _best_step(gs: float, sHs: float) -> tuple[float, float]:
    """The step ``tau`` in ``(0, 1]`` along ``s`` (``gs = <grad, s> < 0``, ``sHs = <s, H
    s>``): the full step when it passes the Armijo test, else the exact minimiser of the
    quadratic along ``s``; and the decrease of ``f`` it gives."""
    if sHs <= 0 or gs + 0.5 * sHs <= _GAMMA * gs:
        tau = 1.0
    else:
        tau = min(1.0, -gs / sHs)
    return tau, -(tau * gs + 0.5 * tau * tau * sHs)


def simplex_newton(
    gram: SupportGram,
    C: np.ndarray,
    t: np.ndarray,
    U0: np.ndarray,
    tol: float,
    maxiter: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Projected Newton on ``1/2 <U, U H> - <C, U>`` over the product of the cells'
    simplices ``{u >= 0, sum_c u_cj = t_j}`` (module notes).

    Parameters
    ----------
    gram : SupportGram
        ``H`` on the parent's support.
    C : ndarray
        ``(K, S)`` linear terms.
    t : ndarray
        ``(S,)`` positive cell sums.
    U0 : ndarray
        ``(K, S)`` feasible start.
    tol : float
        Stop when the root-mean-square KKT residual is at most ``tol``.
    maxiter : int
        Newton iterations.

    Returns
    -------
    ndarray, ndarray, dict
        The last iterate, ``U H`` there (float64), and counters (``iterations``,
        ``residual``, ``products``, ``inner``, ``fallbacks``).
    """
    counts = _Counts()
    fast = gram.fast_rows is not gram.rows
    inner = np.float32 if fast else np.float64
    exact_steps = not fast

    def product(V: np.ndarray, exact: bool) -> np.ndarray:
        counts.products += 1
        return gram.rows(V) if exact or exact_steps else gram.fast_rows(V)

    U = U0.copy()
    GU = product(U, True)
    approx = False  # U H holds float32 products of steps
    checks = it = 0
    checkpoint, stalled = np.inf, False
    budget = _INNER
    while True:
        grad = GU - C
        # a constant per cell changes nothing on the simplices (the steps keep every
        # cell's sum): centred, <grad, s> does not cancel large multipliers
        grad -= grad.mean(axis=0)
        res = kkt_residual(U, grad, t)
        if (res <= tol or it >= maxiter) and approx:  # check with an exact gradient
            GU, approx = product(U, True), False
            checks += 1
            exact_steps = exact_steps or checks >= _CHECKS
            continue
        if res <= tol or it >= maxiter:
            break
        if it % _STALL == 0:  # progress check: the residual must shrink
            if it and res > _STALL_RATIO * checkpoint:
                stalled = True
                break
            checkpoint = res
        it += 1
        sets = _sets(U, grad, res, tol)
        D, M, left = _direction(gram, U, grad, sets, budget, product, counts, inner)
        budget = _inner_budget(budget, left)
        top = sets[2]
        alpha = 1.0
        s = _arc(U, D, M, t, top, alpha)
        gs = float(np.vdot(grad, s))
        for _ in range(_ARC):
            if gs < 0:
                break
            alpha *= 0.5  # back along the arc: a descent direction for small alpha
            s = _arc(U, D, M, t, top, alpha)
            gs = float(np.vdot(grad, s))
        dec = 0.0
        if gs < 0:
            Hs = product(s, False)
            sHs = float(np.vdot(s, Hs))
            tau, dec = _best_step(gs, sHs)
            for _ in range(_ARC_SEARCH if tau < 1.0 else 0):
                alpha *= 0.5
                s2 = _arc(U, D, M, t, top, alpha)
                gs2 = float(np.vdot(grad, s2))
                if gs2 >= 0:
                    continue
                Hs2 = product(s2, False)
                sHs2 = float(np.vdot(s2, Hs2))
                tau2, dec2 = _best_step(gs2, sHs2)
                if dec2 > dec:
                    s, Hs, gs, sHs, tau, dec = s2, Hs2, gs2, sHs2, tau2, dec2
                if tau2 >= 1.0:
                    break
        if gs >= 0 or dec <= 0:  # no descent along the arc: the projected gradient step
            counts.fallbacks += 1
            s = project_threshold(U - grad, t)[0] - U
            gs = float(np.vdot(grad, s))
            if gs >= 0 and not exact_steps:  # float32 steps: on with exact ones
                GU, approx, exact_steps = product(U, True), False, True
                continue
            if gs >= 0:
                break  # no descent left at this precision
            Hs = product(s, False)
            tau, dec = _best_step(gs, float(np.vdot(s, Hs)))
        U = np.maximum(U + tau * s, 0.0)
        GU = GU + tau * Hs
        approx = approx or not exact_steps
        if it % _REFRESH == 0:
            GU, approx = product(U, True), False
    info: dict[str, Any] = {
        "iterations": it,
        "residual": res,
        "products": counts.products,
        "stalled": stalled,
    }
    info.update(inner=counts.inner, fallbacks=counts.fallbacks)
    return U, GU, info
