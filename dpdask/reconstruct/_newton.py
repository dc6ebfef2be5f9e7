"""Projected Newton with conjugate-residual inner solves for ``min 1/2 u^T G u - c^T u, u >= 0``.

The variables are Jacobi-scaled (``diag G = 1`` where non-zero), so a gradient entry
and a variable are in the same units (noise units when the measurements are
inverse-variance weighted; see :mod:`dpdask.reconstruct.nnls`).

Each iteration (after Bertsekas' projected Newton, 1982):

1. *Binding set*: variables at most ``eps = max(tol, min(1e-2, ||u - P(u - g)||))``
   above zero whose gradient is positive (Bertsekas' epsilon-active set: with a tiny
   ``tol`` a rank-deficient ``G`` otherwise stalls on variables just above zero; a
   larger floor than ``1e-2`` costs 2-4x more products on the CPH domain). They are
   moved to zero; the others are *free*.
2. *Newton direction on the free set*: a few conjugate-residual (CR) iterations on
   ``G_FF d = -g_F``. CR minimises the residual, which is the reduced gradient and
   what the stopping rule measures; on an ill-conditioned ``G`` (a Kronecker
   strategy's Gram has condition numbers of 1e10 on the CPH domain) it reaches a
   gradient tolerance several times sooner than conjugate gradients.
3. *Projected step*: ``u1 = max(u + d, 0)``. The full step is taken when it decreases
   the objective (Armijo test along ``s = u1 - u``, which lets many variables reach
   zero at once), else the exact minimiser along ``s`` (the objective is quadratic,
   so ``G s`` gives it without another product). If ``s`` is not a descent direction
   ``d`` is halved (back along the projection arc, no product needed to test it) up to
   8 times, and only then does the projected gradient step replace it.

The free set is what changes between iterations; on a sparse histogram (99% zero
cells) it shrinks to the support of the solution within a few dozen iterations.
Arrays are ``(k, n)``, a row per right-hand side (geography); each has its own free
set, step and stopping test; all are advanced by the same products. Products may be
approximate (float32): the inner solves then run in float32 too (a direction needs no
more), and before stopping the gradient is recomputed with the exact product and the
iteration goes on with exact products if the test no longer holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpdask.reconstruct._report import ConvergenceReport

__all__ = ["projected_newton"]

_GAMMA = 1e-4  # sufficient-decrease constant of the full projected step
_REFRESH = 20  # recompute G u from scratch every this many iterations
_INNER = 10  # CR iterations per Newton direction
_INNER_RTOL = 0.05  # ... or until the reduced residual has fallen by this factor
_EPS = 1e-2  # the epsilon-active threshold is at least min(this, ||projected gradient||)
_APPROX_FLOOR = 1e-5  # approximate products stop at this fraction of rms(c)
_ARC = 8  # halvings of the Newton step along the projection arc before a gradient step
_ARC_SEARCH = 3  # further halvings, each with a product, when the full step fails Armijo
_RELEASE = 0.0  # a variable at zero is freed when its gradient is below -this x rms

Product = Callable[[np.ndarray], np.ndarray]
Restrict = Callable[[np.ndarray, type], Callable[[np.ndarray], np.ndarray]]


def _rowdot(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``sum_j A_ij B_ij`` per row, in float64 (one BLAS dot per row)."""
    return np.array([np.dot(a, b) for a, b in zip(A, B, strict=True)], dtype=float)


def _axpy(a: np.ndarray, X: np.ndarray, Y: np.ndarray) -> None:
    """``Y_i += a_i X_i`` per row, in place."""
    for ai, x, y in zip(a, X, Y, strict=True):
        if ai != 0:
            y += y.dtype.type(ai) * x


def _scale_add(beta: np.ndarray, P: np.ndarray, R: np.ndarray) -> None:
    """``P_i = R_i + beta_i P_i`` per row, in place."""
    P *= beta.astype(P.dtype)[:, None]
    P += R


def _conjugate_residual(gmv: Product, free: np.ndarray, B: np.ndarray, iters: int) -> np.ndarray:
    """Approximately solve ``G_FF D = B`` (``B`` zero off ``free``) row by row.

    ``B`` and ``free`` (0/1) have the products' precision; so has the result.
    """
    D = np.zeros_like(B)
    R = B.copy()
    P = R.copy()
    AR = gmv(R)
    AR *= free
    AP = AR.copy()
    rar = _rowdot(R, AR)
    stop = np.sqrt(_rowdot(B, B)) * _INNER_RTOL
    live = rar > 0
    for _ in range(iters):
        app = _rowdot(AP, AP)
        a = np.divide(rar, app, out=np.zeros_like(rar), where=live & (app > 0))
        _axpy(a, P, D)
        _axpy(-a, AP, R)
        live &= np.sqrt(_rowdot(R, R)) > stop
        if not live.any():
            break
        AR = gmv(R)
        AR *= free
        rar_new = _rowdot(R, AR)
        beta = np.divide(rar_new, rar, out=np.zeros_like(rar), where=live & (rar > 0))
        rar = rar_new
        _scale_add(beta, P, R)
        _scale_add(beta, AP, AR)
    return D


def _conjugate_residual_one(
    gmv: Product, free: np.ndarray, b: np.ndarray, iters: int, restrict: Restrict | None
) -> np.ndarray:
    """:func:`_conjugate_residual` for one right-hand side, on the free entries only.

    The vectors are held compressed to the free set (on a sparse histogram a few
    percent of the cells); the product is ``restrict(free_indices, dtype)`` when
    given (a product that exploits the sparsity), else a full product scattered and
    gathered.
    """
    idx = np.flatnonzero(free)
    if restrict is not None:
        op = restrict(idx, b.dtype)
    else:
        full = np.zeros((1, b.size), dtype=b.dtype)

        def op(v: np.ndarray) -> np.ndarray:
            full[0, idx] = v
            return gmv(full)[0, idx]

    r = b[idx]
    d = np.zeros_like(r)
    p = r.copy()
    ar = op(r)
    ap = ar.copy()
    rar = float(np.dot(r, ar))
    stop = float(np.linalg.norm(r)) * _INNER_RTOL
    for _ in range(iters if rar > 0 else 0):
        app = float(np.dot(ap, ap))
        if app <= 0:
            break
        a = rar / app
        d += r.dtype.type(a) * p
        r -= r.dtype.type(a) * ap
        if float(np.linalg.norm(r)) <= stop:
            break
        ar = op(r)
        rar_new = float(np.dot(r, ar))
        beta = r.dtype.type(rar_new / rar) if rar > 0 else r.dtype.type(0)
        rar = rar_new
        p *= beta
        p += r
        ap *= beta
        ap += ar
    out = np.zeros_like(b)
    out[idx] = d
    return out[None, :]


def _rms_projected_gradient(U: np.ndarray, Gr: np.ndarray) -> np.ndarray:
    PG = np.maximum(U - Gr, 0.0)
    np.subtract(U, PG, out=PG)
    return np.sqrt(_rowdot(PG, PG) / U.shape[1])


def projected_newton(
    gmv: Product,
    C: np.ndarray,
    U0: np.ndarray,
    *,
    tol: float,
    maxiter: int,
    exact: Product | None = None,
    restrict: Restrict | None = None,
) -> tuple[np.ndarray, ConvergenceReport]:
    """Minimise ``1/2 u^T G u - c^T u`` over ``u >= 0`` for every row of ``C``.

    Parameters
    ----------
    gmv : callable
        Maps a ``(k, n)`` array (a right-hand side per row) to ``G`` applied to each row,
        possibly in reduced precision (then the inner solves run in that precision).
    C, U0 : ndarray
        ``(k, n)`` linear terms and starting points.
    tol : float
        Stop a row when its root-mean-square projected gradient is at most ``tol``.
    maxiter : int
        Newton iterations (each a few products).
    exact : callable, optional
        The exact (float64) product, when ``gmv`` is approximate.
    restrict : callable, optional
        ``restrict(idx, dtype)`` returns ``v -> G[idx, idx] v`` in ``dtype``: used by
        the inner solves of a single right-hand side (``details["restricted"]`` counts
        these cheaper products).

    Returns
    -------
    ndarray, ConvergenceReport
        The solutions ``(k, n)`` and the report (``details["products"]``: applications
        of ``G`` to one right-hand side, summed over them).
    """
    k = C.shape[0]
    products = [0]

    restricted = [0]
    if restrict is not None:
        plain = restrict

        def restrict(idx: np.ndarray, dtype: type) -> Product:
            op = plain(idx, dtype)

            def run(v: np.ndarray) -> np.ndarray:
                restricted[0] += 1
                return op(v)

            return run

    def counted(f: Product) -> Product:
        def run(V: np.ndarray) -> np.ndarray:
            products[0] += V.shape[0]
            return f(V)

        return run

    fast = counted(gmv)
    exact_mv = counted(exact) if exact is not None else None
    mv = fast
    inner = np.float32 if exact is not None else np.float64
    U = np.maximum(U0, 0.0)
    GU = np.asarray(mv(U), dtype=float)
    rel = np.full(k, np.inf)
    verified = exact_mv is None
    it = 0
    fallbacks = 0
    # what approximate products can resolve: the gradient's rounding error is about
    # 1e-7 of the size of G u, which is about that of c
    floor = np.maximum(tol, _APPROX_FLOOR * np.sqrt(_rowdot(C, C) / C.shape[1]))
    while True:
        Gr = GU - C
        rel = _rms_projected_gradient(U, Gr)
        done = rel <= (tol if verified else floor)
        if done.all() and not verified:
            # the products were approximate: go on in full precision (when the floor was
            # above tol) or check before stopping
            mv, verified, inner = exact_mv, True, np.float64
            GU = mv(U)
            continue
        if done.all() or it >= maxiter:
            if not verified:  # report the exact projected gradient
                GU = exact_mv(U)
                rel = _rms_projected_gradient(U, GU - C)
            break
        it += 1
        act = slice(None) if not done.any() else np.flatnonzero(~done)
        Ua, Ga = U[act], Gr[act]
        # Bertsekas' epsilon-active set: eps shrinks with the projected gradient
        eps = np.maximum(tol, np.minimum(_EPS, rel[act] * np.sqrt(Ua.shape[1])))[:, None]
        binding = (Ua <= eps) & (Ga > -_RELEASE * rel[act][:, None])
        free = (~binding).astype(inner)
        B = np.multiply(Ga, free, dtype=inner)
        np.negative(B, out=B)
        if B.shape[0] == 1:
            D = _conjugate_residual_one(mv, free[0] > 0, B[0], _INNER, restrict).astype(float)
        else:
            D = _conjugate_residual(mv, free, B, _INNER).astype(float)
        S = np.where(binding, 0.0, np.maximum(D + Ua, 0.0))
        S -= Ua
        gs = _rowdot(Ga, S)
        bad = gs >= 0
        for _ in range(_ARC) if bad.any() else ():
            # back along the projection arc P(u + alpha d): descent for small alpha
            D[bad] *= 0.5
            S[bad] = np.where(binding[bad], 0.0, np.maximum(D[bad] + Ua[bad], 0.0)) - Ua[bad]
            gs[bad] = _rowdot(Ga[bad], S[bad])
            bad = gs >= 0
            if not bad.any():
                break
        if bad.any():  # not a descent direction: the projected gradient step instead
            fallbacks += int(bad.sum())
            S[bad] = np.maximum(Ua[bad] - Ga[bad], 0.0) - Ua[bad]
            gs[bad] = _rowdot(Ga[bad], S[bad])
        GS = np.asarray(mv(S), dtype=float)
        sgs = _rowdot(S, GS)
        full = (gs + 0.5 * sgs <= _GAMMA * gs) | (sgs <= 0)
        # Armijo search along the projection arc: P(u + d/2), P(u + d/4), ... let the
        # variables that leave the free set reach zero exactly (a step along one
        # segment s stops them short, and the next iteration frees them again)
        retry = ~full & ~bad
        for _ in range(_ARC_SEARCH) if retry.any() else ():
            r = np.flatnonzero(retry)
            D[r] *= 0.5
            Sr = np.where(binding[r], 0.0, np.maximum(D[r] + Ua[r], 0.0)) - Ua[r]
            GSr = np.asarray(mv(Sr), dtype=float)
            gsr, sgsr = _rowdot(Ga[r], Sr), _rowdot(Sr, GSr)
            ok = (gsr < 0) & (gsr + 0.5 * sgsr <= _GAMMA * gsr)
            better = ok | (gsr + 0.5 * sgsr < gs[r] + 0.5 * sgs[r])
            rb = r[better]
            S[rb], GS[rb], gs[rb], sgs[rb] = Sr[better], GSr[better], gsr[better], sgsr[better]
            full[r[ok]] = True
            retry[r[ok]] = False
            if not retry.any():
                break
        tau = np.where(full, 1.0, np.clip(-gs / np.where(sgs > 0, sgs, 1.0), 0.0, 1.0))
        _axpy(tau, S, Ua)
        GUa = GU[act]
        _axpy(tau, GS, GUa)
        if it % _REFRESH == 0:
            GUa = np.asarray(mv(Ua), dtype=float)
        U[act], GU[act] = Ua, GUa
    report = ConvergenceReport(
        method="projected-newton",
        converged=bool((rel <= tol).all()),
        iterations=it,
        residual=float(rel.max(initial=0.0)),
        tolerance=tol,
        details={
            "products": products[0],
            "restricted": restricted[0],
            "gradient_fallbacks": fallbacks,
        },
    )
    return U, report
