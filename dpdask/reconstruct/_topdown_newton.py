"""Projected Newton for the children's fit, over the product of the cells' simplices.

The problem (:mod:`dpdask.reconstruct.topdown`), in the Jacobi-scaled variables ``U``
``(K, |S|)`` of one parent's support: minimise ``f(U) = 1/2 sum_c u_c^T H u_c - <C, U>``
(``H = G~[S, S]``, unit diagonal; the Hessian is ``I_K (x) H``) over ``U >= 0`` with
``sum_c u_cj = t_j`` for every cell ``j``.

**Free and binding variables** (after Bertsekas' projected Newton, 1982). In each cell,
the multiplier ``nu_j`` is estimated as the mean gradient of the children above
``eps = max(tol, min(1e-2, ||projected gradient||))`` (the largest child always counts);
``g^_cj = g_cj - nu_j`` is the reduced gradient (at a KKT point ``g^ = 0`` where
``u > 0`` and ``g^ >= 0`` where ``u = 0``). A child above ``eps`` is *free*; one at most
``eps`` with ``g^ > 0`` is *binding* and moved to zero (its mass to the cell's largest
child); one at zero is freed when ``g^`` is below ``-2 x`` the root-mean-square KKT
residual (freeing every slightly negative one makes the free set flip, as in
:mod:`dpdask.reconstruct._newton`).

**The Newton direction** minimises the quadratic model on the free set ``F`` subject to
the cells' sums: ``min g_F^T d + 1/2 d^T (I (x) H)_FF d`` with ``sum_{c in F_j} d_cj = 0``.
Eliminating one child ``c*`` per cell (``d_c*j = -sum_{c != c*} d_cj``) would give, on a
cell where all children are free, the reduced Hessian ``(I_{K-1} + 1 1^T) (x) H``, whose
condition number is ``K`` times that of ``H``; instead the direction is found in the
null space of the sums with an orthonormal basis ``Z``: conjugate residuals on
``P (I (x) H)_FF P``, ``P`` the orthogonal projection that removes each cell's mean over
its free children, whose spectrum on the range of ``P`` lies inside ``H``'s (``Z^T (I
(x) H) Z``, with ``Z Z^T = P``). A cell with one free child is fixed for the step
(``P`` zeroes it); most cells of a sparse family are, so the inner solves see few
variables. The products are ``H[F_c, F_c]`` per child, restricted to its free set
(:meth:`~dpdask.reconstruct._kron_gram.ScaledKronGram.restricted`: a fraction of a full
product on a sparse child), in float32; the iteration counts and their adaptive budget
are :mod:`dpdask.reconstruct._newton`'s (10 conjugate-residual iterations, doubled up to
40 while they stagnate).

**The step** follows the projection arc ``P_Delta(U + alpha D)`` (``P_Delta`` the
projection onto the simplices, applied to the cells with a negative entry only: ``D``
keeps every cell's sum): the full step when it passes the Armijo test, else up to three
halvings, each with a product, then the exact minimiser along the best step (``f`` is
quadratic); if the step is not a descent direction ``alpha`` is halved (no product) up
to 8 times, and then the projected gradient step replaces it. ``U H`` is updated by the
steps' products (float32 for a Kronecker Gram) and recomputed in float64 every 20
iterations and before stopping.

**Stopping rule**: the KKT residual ``||U - P_Delta(U - grad)|| / sqrt(K |S|)``, as for
FISTA, computed from a float64 gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpdask.reconstruct._newton import _conjugate_residual, _freeing_threshold, _inner_budget
from dpdask.reconstruct._topdown_fista import project_threshold
from dpdask.reconstruct._topdown_level import SupportGram

__all__ = ["simplex_newton"]

import os
_FIXED = int(os.environ.get("TD_INNER", "0"))
_MU = float(os.environ.get("TD_MU", "0"))
_PASSES = int(os.environ.get("TD_PASSES", "1"))
_EXACT = bool(os.environ.get("TD_EXACT"))
_TRACE = bool(os.environ.get("TD_TRACE"))
def _f(U, GU, C):
    return float(0.5 * np.vdot(U, GU) - np.vdot(C, U))

_GAMMA = 1e-4  # sufficient decrease
_REFRESH = 20  # recompute U H in float64 every this many iterations
_INNER = 10  # conjugate-residual iterations per direction, at first
_EPS = 1e-2  # the epsilon-active threshold is at least min(this, ||projected gradient||)
_THETA = 2.0  # a child at zero is freed when its reduced gradient is below -this x rms
_ARC = 8  # halvings of the Newton step (no product) before a gradient step
_ARC_SEARCH = 3  # halvings with a product when the full step fails Armijo
_CHECKS = 3  # exact checks that fail before the steps' products are taken in float64


@dataclass
class _Counts:
    products: int = 0  # products of K rows with H (float64 or fast)
    inner: int = 0  # inner iterations (K restricted products each)
    fallbacks: int = 0  # projected gradient steps


def kkt_residual(U: np.ndarray, grad: np.ndarray, t: np.ndarray) -> tuple[float, np.ndarray]:
    """The root-mean-square KKT residual ``||U - P_Delta(U - grad)|| / sqrt(U.size)`` and
    the projection's thresholds ``tau`` (``-tau`` estimates the cells' multipliers)."""
    P, tau = project_threshold(U - grad, t)
    return float(np.linalg.norm(U - P) / np.sqrt(U.size)), tau


class _FreeSet:
    """The free variables of one iteration as a flat vector (child by child), with the
    projection that removes each cell's mean over its free children."""

    def __init__(self, free: np.ndarray, gram: SupportGram, dtype: type):
        K, S = free.shape
        self.flat = np.flatnonzero(free)
        self.child, self.cell = np.divmod(self.flat, S)
        self.bounds = np.searchsorted(self.child, np.arange(K + 1))
        self.count = np.bincount(self.cell, minlength=S).astype(float)
        self.count[self.count == 0] = 1.0
        self.S, self.dtype = S, dtype
        self.ops = [
            gram.sub(self.cell[a:b], dtype) if b > a else None
            for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)
        ]

    def project(self, v: np.ndarray) -> np.ndarray:
        mean = np.bincount(self.cell, weights=v, minlength=self.S) / self.count
        return (v - mean[self.cell]).astype(self.dtype)

    def hessian(self, counts: _Counts, mu: float = 0.0) -> Callable[[np.ndarray], np.ndarray]:
        """``v -> P ((I (x) H)_FF + mu I) v`` for ``v`` in the range of ``P``."""

        def op(v: np.ndarray) -> np.ndarray:
            counts.inner += 1
            out = mu * v if mu else np.empty_like(v)
            for c, f in enumerate(self.ops):
                if f is not None:
                    a, b = self.bounds[c], self.bounds[c + 1]
                    if mu:
                        out[a:b] += f(v[a:b])
                    else:
                        out[a:b] = f(v[a:b])
            return self.project(out)

        return op


def _arc(
    U: np.ndarray, D: np.ndarray, M: np.ndarray, t: np.ndarray, top: np.ndarray, alpha: float
) -> np.ndarray:
    """The step to ``U + alpha D + M`` with its negative entries set to zero and their
    excess taken from the cell's largest child ``top`` (``D``, the free children's
    direction, and ``M``, the binding children's move to zero, keep every cell's sum);
    the rare cell whose largest child then falls below zero is projected."""
    V = U + alpha * D
    V += M
    cols = np.arange(U.shape[1])
    neg = np.minimum(V, 0.0).sum(axis=0)
    np.maximum(V, 0.0, out=V)
    V[top, cols] += neg
    bad = np.flatnonzero(V[top, cols] < 0)
    if bad.size:
        V[:, bad] = project_threshold(U[:, bad] + alpha * D[:, bad] + M[:, bad], t[bad])[0]
    return V - U


def _sets(U: np.ndarray, grad: np.ndarray, rms: float, tol: float):
    """The free set (a mask), the binding children's move ``M`` and the reduced gradient."""
    S = U.shape[1]
    eps = max(tol, min(_EPS, rms * np.sqrt(U.size)))
    cols = np.arange(S)
    big = U > eps
    top = np.argmax(U, axis=0)
    big[top, cols] = True
    nu = np.where(big, grad, 0.0).sum(axis=0) / big.sum(axis=0)
    red = grad - nu
    zero = U <= 0
    gz = red[zero & (red <= 0)]
    thr = _freeing_threshold(gz, np.ones(gz.size, bool), _THETA * rms, U.size * tol * tol)
    free = big | ((red <= 0) & ~zero) | (zero & (red <= -thr))
    moved = ~big & (U > 0) & (red > 0)
    M = np.where(moved, -U, 0.0)
    M[top, cols] -= M.sum(axis=0)
    return free, M, top


def simplex_newton(
    gram: SupportGram,
    C: np.ndarray,
    t: np.ndarray,
    U0: np.ndarray,
    tol: float,
    maxiter: int,
) -> tuple[np.ndarray, np.ndarray, dict]:
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

    def product(V: np.ndarray, exact: bool) -> np.ndarray:
        counts.products += 1
        return gram.rows(V) if exact or not fast else gram.fast_rows(V)

    U = U0.copy()
    GU = product(U, True)
    exact_steps = not fast or _EXACT
    checks, it = 0, 0
    approx = False  # U H holds float32 products of steps
    budget = _FIXED or _INNER
    _prev_clip = None
    while True:
        grad = GU - C
        res, _ = kkt_residual(U, grad, t)
        if (res <= tol or it >= maxiter) and approx:  # check with an exact gradient
            GU = product(U, True)
            approx = False
            checks += 1
            exact_steps = exact_steps or checks >= _CHECKS
            continue
        if res <= tol or it >= maxiter:
            break
        it += 1
        free, M, top = _sets(U, grad, res, tol)
        cols = np.arange(U.shape[1])
        gm = grad
        for k in range(_PASSES):
            fs = _FreeSet(free, gram, inner)
            b = fs.project(-gm.ravel()[fs.flat])
            d, left = _conjugate_residual(fs.hessian(counts, _MU), b, budget)
            D = np.zeros_like(U)
            D.ravel()[fs.flat] = d
            if k == _PASSES - 1:
                break
            clip = free & (U + D + M < 0)
            clip[top, cols] = False
            if not clip.any():
                break
            M = M.copy()
            M[clip] = -U[clip]
            M[top, cols] = 0.0
            M[top, cols] = -M.sum(axis=0)
            free = free & ~clip
            gm = grad + product(M, exact_steps)
        budget = _inner_budget(budget, left) if not _FIXED else _FIXED
        alpha = 1.0
        s = _arc(U, D, M, t, top, alpha)
        gs = float(np.vdot(grad, s))
        for _ in range(_ARC):
            if gs < 0:
                break
            alpha *= 0.5
            s = _arc(U, D, M, t, top, alpha)
            gs = float(np.vdot(grad, s))
        if gs >= 0:  # not a descent direction: the projected gradient step
            counts.fallbacks += 1
            s = project_threshold(U - grad, t)[0] - U
            gs = float(np.vdot(grad, s))
            alpha = 0.0
            if gs >= 0:
                break  # no descent left at this precision
        Hs = product(s, exact_steps)
        sHs = float(np.vdot(s, Hs))
        full = gs + 0.5 * sHs <= _GAMMA * gs or sHs <= 0
        for _ in range(_ARC_SEARCH if alpha > 0 and not full else 0):
            alpha *= 0.5
            s2 = _arc(U, D, M, t, top, alpha)
            Hs2 = product(s2, exact_steps)
            gs2, sHs2 = float(np.vdot(grad, s2)), float(np.vdot(s2, Hs2))
            ok = gs2 < 0 and gs2 + 0.5 * sHs2 <= _GAMMA * gs2
            if ok or gs2 + 0.5 * sHs2 < gs + 0.5 * sHs:
                s, Hs, gs, sHs = s2, Hs2, gs2, sHs2
            if ok:
                full = True
                break
        tau = 1.0 if full else min(1.0, max(0.0, -gs / sHs if sHs > 0 else 1.0))
        if _TRACE:
            multi = int((np.bincount(fs.cell, minlength=U.shape[1]) > 1).sum())
            freed = int((free & (U <= 0)).sum())
            Pp = project_threshold(U - grad, t)[0] - U
            rpos = np.sqrt((Pp[U > 0] ** 2).sum() / U.size); rzero = np.sqrt((Pp[U <= 0] ** 2).sum() / U.size)
            reclaimed = int((free & (U <= 0) & _prev_clip).sum()) if _prev_clip is not None else -1
            _prev_clip = (U + alpha * D + M < 0)
            fixed = (~free) & (U > 0) & (M >= 0)
            rfix = np.sqrt((Pp[fixed] ** 2).sum() / U.size); rfree = np.sqrt((Pp[free & (U > 0)] ** 2).sum() / U.size)
            print(f"rfix {rfix:.3g} nfix {fixed.sum()} rfree {rfree:.3g} ", end="")
            print(f"rpos {rpos:.3g} rzero {rzero:.3g} reclaimed {reclaimed} clipped {int(_prev_clip.sum())} ", end="")
            print(f"it {it} res {res:.4g} free {fs.flat.size} multi {multi} moved {(M < 0).sum()} freed {freed} "
                  f"left {left:.3g} budget {budget} alpha {alpha} tau {tau:.3g} full {full} "
                  f"f {_f(U, GU, C):.8g} pos {(U > 0).sum()}")
        U = np.maximum(U + tau * s, 0.0)
        GU = GU + tau * Hs
        approx = approx or not exact_steps
        if it % _REFRESH == 0:
            GU = product(U, True)
            approx = False
    info = {
        "iterations": it,
        "residual": res,
        "products": counts.products,
        "inner": counts.inner,
        "fallbacks": counts.fallbacks,
    }
    return U, GU, info
