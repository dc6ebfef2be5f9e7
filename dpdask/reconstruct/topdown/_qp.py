"""A small convex quadratic program with bounds and equalities, by a primal-dual interior point.

:func:`solve_qp` minimises ``1/2 v^T P v + c^T v`` subject to ``M v = b`` and
``l <= v <= u`` (entries of ``l`` may be ``-inf``, of ``u`` ``+inf``), ``P`` symmetric
positive semi-definite. It is the core of the constrained family fit
(:mod:`dpdask.reconstruct.topdown._constrained`): bounds generalise the non-negativity of
the simplex solvers, and linear inequalities on queries become equalities with a bounded
slack variable.

**Method.** Mehrotra's predictor-corrector (Nocedal and Wright, *Numerical
Optimization*, 2006, ch. 16.6), primal iterates kept strictly inside the bounds,
equalities reached along the way. Each iteration factors the KKT matrix
``[[P + D, M^T], [M, 0]]`` (``D`` the bounds' barrier terms ``z_l / (v - l) + z_u / (u -
v)``) once (the predictor's and the corrector's directions); should the complementarity
not halve in 8 iterations (Mehrotra's corrector can cycle), the iteration goes on
without the corrector, centring by at least ``sigma = 0.2``. The matrix is
regularised by ``delta = 1e-11`` on the primal block and ``-delta`` on the dual one
(redundant equalities, such as a parent's invariant that the cells' sums imply, and
flat directions of a singular ``P``); the regularisation changes the Newton steps only,
not the point they converge to. The objective is scaled by ``1 / max(diag P)`` first.

**Polish.** Where the solution is degenerate (a bound active with a zero multiplier, as
when the noise is off and the truth is returned) the interior iterates approach it only
as the square root of the barrier. So the variables within a relative ``1e-9``, ...,
``1e-3`` of a bound are fixed there and the equality-constrained problem on the others
solved directly (least squares on its KKT system); the first such point that is feasible
and no worse in the objective replaces the interior one.

**Stopping rule.** Scaled primal residual ``||M v - b||_inf / (1 + ||b||_inf)``, dual
residual ``||P v + c - M^T y - z_l + z_u||_inf / (1 + ||c||_inf)`` and the mean
complementarity, all at most ``tol`` (``1e-10``). A problem whose primal residual stops
falling while the barrier shrinks, or whose dual multipliers diverge, is infeasible:
:class:`~dpdask.errors.PlanError`.

**Linear algebra.** With ``blocks`` (a family's block-diagonal Hessian, one block per
child) each KKT system is solved by a Schur complement on the equalities
(:class:`~dpdask.reconstruct.topdown._qp_blocks.BlockKKT`), every solve checked against
the system itself; otherwise, and wherever that fails, by one LU: dense up to
:data:`DENSE_KKT` rows, sparse above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from dpdask.errors import PlanError, ShapeError
from dpdask.reconstruct.topdown._qp_blocks import BlockKKT

__all__ = ["QPResult", "solve_qp"]

_STEP = 0.995  # fraction of the way to the boundary
_REG = 1e-11
DENSE_KKT = 600
"""KKT systems of at most this many rows are factored densely; larger ones by a sparse LU
(a family's Hessian is block diagonal, one block per child)."""
_CYCLE = 8  # the complementarity must halve every this many iterations, else ...
_SAFE_SIGMA = 0.2  # ... plain Newton steps towards this fraction of it, no corrector
_POLISH = (1e-9, 1e-7, 1e-5, 1e-3)  # relative distances to a bound taken as active


@dataclass(frozen=True)
class QPResult:
    """The solution of :func:`solve_qp`.

    Attributes
    ----------
    v : ndarray
        The minimiser (within the bounds exactly: clipped to them).
    y : ndarray
        The equalities' multipliers.
    iterations : int
        Interior-point iterations.
    residual : float
        The largest of the scaled primal, dual and complementarity residuals.
    objective : float
        ``1/2 v^T P v + c^T v`` (unscaled).
    """

    v: np.ndarray
    y: np.ndarray
    iterations: int
    residual: float
    objective: float


def _start(
    lower: np.ndarray, upper: np.ndarray, M: np.ndarray | sp.csr_array, b: np.ndarray
) -> np.ndarray:
    """A point strictly inside the bounds near the equalities: the middle of each finite
    interval (one unit inside a single bound, zero for a free variable) moved to the
    nearest point meeting ``M v = b``, then pushed back inside the bounds by a tenth of
    its size (at least one unit, at most half an interval)."""
    v = np.zeros(lower.shape)
    lo_f, hi_f = np.isfinite(lower), np.isfinite(upper)
    both = lo_f & hi_f
    v[both] = 0.5 * (lower[both] + upper[both])
    v[lo_f & ~both] = lower[lo_f & ~both] + 1.0
    v[hi_f & ~both] = upper[hi_f & ~both] - 1.0
    if M.shape[0]:
        r = b - M @ v
        if sp.issparse(M):
            v = v + spla.lsqr(M, r, atol=1e-12, btol=1e-12)[0]
        else:
            v = v + sla.lstsq(M, r, check_finite=False)[0]
    push = np.maximum(1.0, 0.1 * np.abs(v))
    half = np.where(both, 0.5 * (upper - lower), np.inf)
    push = np.minimum(push, half)
    v = np.where(lo_f, np.maximum(v, lower + push), v)
    v = np.where(hi_f, np.minimum(v, upper - push), v)
    return v


def _max_step(x: np.ndarray, dx: np.ndarray) -> float:
    """The largest ``alpha <= 1`` with ``x + alpha dx >= 0`` (``x > 0``)."""
    neg = dx < 0
    if not neg.any():
        return 1.0
    return float(min(1.0, np.min(-x[neg] / dx[neg])))


@dataclass(frozen=True)
class _System:
    """One iteration's factored KKT system and the quantities its directions need."""

    solve: Callable[[np.ndarray], np.ndarray]
    rd: np.ndarray
    rp: np.ndarray
    L: np.ndarray
    U: np.ndarray
    sl: np.ndarray
    su: np.ndarray
    zl: np.ndarray
    zu: np.ndarray
    rl: np.ndarray
    ru: np.ndarray

    def direction(self, rcl: np.ndarray, rcu: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(dv, dy, dsl, dsu, dzl, dzu)`` for the complementarity targets ``rcl``,
        ``rcu``."""
        L, U, sl, su, zl, zu = self.L, self.U, self.sl, self.su, self.zl, self.zu
        N = self.rd.size
        rhs1 = -self.rd.copy()
        rhs1[L] += (rcl - zl * self.rl) / sl
        rhs1[U] -= (rcu - zu * self.ru) / su
        sol = self.solve(np.concatenate([rhs1, -self.rp]))
        dv, dy = sol[:N], -sol[N:]
        dsl = dv[L] + self.rl
        dsu = self.ru - dv[U]
        return dv, dy, dsl, dsu, (rcl - zl * dsl) / sl, (rcu - zu * dsu) / su

    def step(self, d: tuple[np.ndarray, ...]) -> float:
        """The largest step ``<= 1`` keeping slacks and multipliers non-negative."""
        return min(
            _max_step(self.sl, d[2]), _max_step(self.su, d[3]),
            _max_step(self.zl, d[4]), _max_step(self.zu, d[5]),
        )  # fmt: skip


def solve_qp(
    P: np.ndarray | sp.sparray,
    c: np.ndarray,
    M: np.ndarray | sp.sparray,
    b: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    *,
    tol: float = 1e-10,
    maxiter: int = 200,
    blocks: Sequence[np.ndarray] | None = None,
) -> QPResult:
    """Minimise ``1/2 v^T P v + c^T v`` subject to ``M v = b``, ``lower <= v <= upper``.

    Parameters
    ----------
    P : ndarray or sparse array
        ``(N, N)`` symmetric positive semi-definite.
    c : ndarray
        ``(N,)``.
    M : ndarray or sparse array
        ``(E, N)`` equality rows (``E`` may be 0). Dense or sparse either way: systems of
        more than :data:`DENSE_KKT` rows are factored sparse.
    b : ndarray
        ``(E,)``.
    lower, upper : ndarray
        ``(N,)`` bounds, ``-inf`` / ``+inf`` where there is none, ``lower < upper``
        (fix a variable by removing it).
    tol : float
        The stopping rule's tolerance (module notes).
    maxiter : int
        Iterations before the problem is declared infeasible or too ill-conditioned.
    blocks : sequence of ndarray, optional
        The dense diagonal blocks of ``P`` when it is block diagonal (the variables after
        the last block with a zero Hessian): the systems are then solved by a Schur
        complement on the equalities (:class:`~._qp_blocks.BlockKKT`), the LU (dense or
        sparse by size) only where that fails.

    Returns
    -------
    QPResult

    Raises
    ------
    PlanError
        If the constraints admit no point (or the iteration limit is reached).

    Examples
    --------
    >>> r = solve_qp(np.eye(2), np.array([-2.0, 0.0]), np.ones((1, 2)), np.array([1.0]),
    ...              np.zeros(2), np.full(2, np.inf))
    >>> np.round(r.v, 8).tolist()
    [1.0, 0.0]
    """
    N = c.size
    if P.shape != (N, N) or M.shape[1:] != (N,) or b.shape != (M.shape[0],):
        raise ShapeError("solve_qp: P, c, M and b do not fit together")
    if (lower >= upper).any():
        raise ShapeError("solve_qp: every variable needs lower < upper (remove fixed ones)")
    E = M.shape[0]
    sparse = N + E > DENSE_KKT
    kkt = BlockKKT(blocks, sp.csr_array(M)) if blocks is not None else None
    if sparse:
        P, M = sp.csr_array(P), sp.csr_array(M)
    else:
        P = _dense(P)
        M = _dense(M)
    scale = float(np.max(np.abs(P.diagonal()), initial=0.0))
    scale = scale if scale > 0 else 1.0
    Ps, cs = P / scale, c / scale
    L = np.flatnonzero(np.isfinite(lower))
    U = np.flatnonzero(np.isfinite(upper))
    v = _start(lower, upper, M, b)
    y = np.zeros(E)
    zl = np.ones(L.size)
    zu = np.ones(U.size)
    nb = 1.0 + float(np.max(np.abs(b), initial=0.0))
    nc = 1.0 + float(np.max(np.abs(cs), initial=0.0))
    n_comp = max(L.size + U.size, 1)
    best_primal, stall = np.inf, 0
    mus: list[float] = []
    safe = False
    res = np.inf
    # the slacks are kept as variables (recomputed from v they round to zero near a bound)
    sl = v[L] - lower[L]
    su = upper[U] - v[U]
    for it in range(maxiter + 1):
        rd = Ps @ v + cs - M.T @ y
        rd[L] -= zl
        rd[U] += zu
        rp = M @ v - b
        mu = (float(sl @ zl) + float(su @ zu)) / n_comp
        primal = float(np.max(np.abs(rp), initial=0.0)) / nb
        dual = float(np.max(np.abs(rd), initial=0.0)) / nc
        res = max(primal, dual, mu / nc)
        if res <= tol:
            break
        if it == maxiter:
            break
        mus.append(mu)
        if not safe and len(mus) > _CYCLE and mu > 0.5 * mus[-1 - _CYCLE]:
            safe = True
        if primal < 0.5 * best_primal:
            best_primal, stall = primal, 0
        else:
            stall += 1
        if stall > 30 and primal > 1e3 * tol and mu < 1e-6 * primal:
            break  # the barrier is gone but the equalities are not met: infeasible
        D = np.zeros(N)
        D[L] += zl / sl
        D[U] += zu / su
        try:
            lu = partial(_factor, Ps, D, M, _REG)
            solve = _block_factor(kkt, scale, D, lu) or lu()
        except (ValueError, RuntimeError, np.linalg.LinAlgError) as e:  # pragma: no cover
            raise PlanError(f"the constrained fit's KKT system is singular ({e})") from e

        # the slacks' own residuals (kept as variables: recomputed from v near a bound
        # they round to zero): d sl = dv + rl, d su = -dv + ru
        sys = _System(
            solve, rd, rp, L, U, sl, su, zl, zu, v[L] - lower[L] - sl, upper[U] - v[U] - su
        )
        d = sys.direction(-sl * zl, -su * zu)
        a = sys.step(d)
        mu_aff = (
            float((sl + a * d[2]) @ (zl + a * d[4])) + float((su + a * d[3]) @ (zu + a * d[5]))
        ) / n_comp
        sigma = min((mu_aff / mu) ** 3, 1.0) if mu > 0 else 0.0
        if safe:  # plain centred Newton steps (the corrector cycled)
            sigma = max(sigma, _SAFE_SIGMA)
            d = sys.direction(sigma * mu - sl * zl, sigma * mu - su * zu)
        else:
            d = sys.direction(
                sigma * mu - sl * zl - d[2] * d[4], sigma * mu - su * zu - d[3] * d[5]
            )
        a = min(_STEP * sys.step(d), 1.0)
        v = v + a * d[0]
        y = y + a * d[1]
        sl = sl + a * d[2]
        su = su + a * d[3]
        zl = zl + a * d[4]
        zu = zu + a * d[5]
        if not (np.isfinite(v).all() and np.isfinite(y).all()):
            break
        if float(np.max(np.abs(y), initial=0.0)) > 1e14 * nc:
            break  # multipliers diverging: an infeasible system of equalities
    if not res <= tol:
        primal = float(np.max(np.abs(M @ v - b), initial=0.0)) / nb if E else 0.0
        if primal > 1e-6 or not np.isfinite(v).all():
            raise PlanError(
                "the constraints admit no solution (the constrained fit's equalities "
                f"stay {primal:.3g} from being met)"
            )
        if res > 1e-6:
            raise PlanError(
                f"the constrained fit did not converge (residual {res:.3g} after {it} iterations)"
            )
    v = np.clip(v, lower, upper)
    objective = float(0.5 * v @ (P @ v) + c @ v)
    polished = _polish(P, c, M, b, lower, upper, v, objective, nb)
    if polished is not None:
        v, objective = polished
    return QPResult(v, y, it, float(res), objective)


def _block_factor(
    kkt: BlockKKT | None, scale: float, D: np.ndarray,
    fallback: Callable[[], Callable[[np.ndarray], np.ndarray]],
) -> Callable[[np.ndarray], np.ndarray] | None:  # fmt: skip
    """The Schur-complement solver of a block-diagonal ``P`` (None: none, or its
    factorisation failed and the sparse LU takes over; an inaccurate solve is redone by
    ``fallback()``'s)."""
    if kkt is None:
        return None
    try:
        return kkt.factor(scale, D, _REG, fallback)
    except np.linalg.LinAlgError:
        return None


def _dense(A: np.ndarray | sp.sparray) -> np.ndarray:
    """``A`` as a dense float64 array."""
    if isinstance(A, np.ndarray):
        return np.asarray(A, dtype=float)
    out: np.ndarray = sp.csr_array(A).toarray()
    return out


def _factor(
    P: np.ndarray | sp.csr_array, D: np.ndarray, M: np.ndarray | sp.csr_array, delta: float
) -> Callable[[np.ndarray], np.ndarray]:
    """A solver of the regularised KKT system ``[[P + D + delta I, M^T], [M, -delta I]]``.

    Sparse systems are factored in their natural order: a family's variables come child
    by child (``P`` block diagonal) and its equalities last, so the elimination works
    block by block and leaves a dense system only on the equalities (the parent's cells),
    ten times faster than a fill-reducing ordering on P.L. 94 families."""
    N, E = P.shape[0], M.shape[0]
    if not sp.issparse(P):
        K = np.zeros((N + E, N + E))
        K[:N, :N] = P
        K[np.arange(N), np.arange(N)] += D + delta
        K[:N, N:] = M.T
        K[N:, :N] = M
        K[np.arange(N, N + E), np.arange(N, N + E)] = -delta
        lu = sla.lu_factor(K, check_finite=False)
        return lambda rhs: sla.lu_solve(lu, rhs, check_finite=False)
    top = sp.csr_array(P) + sp.diags_array(D + delta)
    if E:
        Ks = sp.block_array([[top, M.T], [M, sp.diags_array(np.full(E, -delta))]], format="csc")
    else:
        Ks = sp.csc_array(top)
    slu = spla.splu(Ks, permc_spec="NATURAL", diag_pivot_thresh=0.01)
    return lambda rhs: np.asarray(slu.solve(rhs))


def _polish(
    P: np.ndarray | sp.csr_array, c: np.ndarray, M: np.ndarray | sp.csr_array, b: np.ndarray,
    lower: np.ndarray, upper: np.ndarray, v: np.ndarray, objective: float, nb: float,
) -> tuple[np.ndarray, float] | None:  # fmt: skip
    """The interior point's guess of the active bounds, solved exactly (module notes):
    for thresholds from tight to loose, the variables within the threshold of a bound
    are fixed there and the equality-constrained problem on the others solved; the
    first feasible solution no worse in the objective is returned (None if none)."""
    tried: tuple[np.ndarray, np.ndarray] | None = None
    for theta in _POLISH:
        at_lo = np.isfinite(lower) & (v - lower <= theta * (1.0 + np.abs(lower)))
        at_hi = ~at_lo & np.isfinite(upper) & (upper - v <= theta * (1.0 + np.abs(upper)))
        fix = at_lo | at_hi
        same = tried is not None and np.array_equal(at_lo, tried[0])
        if not fix.any() or (same and tried is not None and np.array_equal(at_hi, tried[1])):
            continue  # nothing fixed, or the same as a tighter threshold's, which failed
        tried = (at_lo, at_hi)
        x = np.where(at_lo, lower, np.where(at_hi, upper, 0.0))
        F = np.flatnonzero(~fix)
        sol = _equality_solve(P, M, F, -(c[F] + (P @ x)[F]), b - M @ x)
        if sol is None:
            continue
        cand = x.copy()
        cand[F] = sol[: F.size]
        slack = 1e-12 * (1.0 + np.abs(cand))
        if (cand < lower - slack).any() or (cand > upper + slack).any():
            continue
        if float(np.max(np.abs(M @ cand - b), initial=0.0)) > 1e-11 * nb:
            continue
        cand = np.clip(cand, lower, upper)
        obj = float(0.5 * cand @ (P @ cand) + c @ cand)
        if obj <= objective + 1e-12 * (1.0 + abs(objective)):
            return cand, obj
    return None


def _equality_solve(
    P: np.ndarray | sp.csr_array, M: np.ndarray | sp.csr_array, F: np.ndarray,
    r1: np.ndarray, r2: np.ndarray,
) -> np.ndarray | None:  # fmt: skip
    """The free variables ``F`` of ``[[P_FF, M_F^T], [M_F, 0]] [x; y] = [r1; r2]``: dense,
    by least squares (singular systems included); sparse, by the regularised system
    refined against the exact one (None if that fails)."""
    E = M.shape[0]
    rhs = np.concatenate([r1, r2])
    if not sp.issparse(P):
        K = np.zeros((F.size + E, F.size + E))
        K[: F.size, : F.size] = P[np.ix_(F, F)]
        K[: F.size, F.size :] = M[:, F].T
        K[F.size :, : F.size] = M[:, F]
        sol = sla.lstsq(K, rhs, check_finite=False, lapack_driver="gelsy")[0]
        out: np.ndarray = sol[: F.size]
        return out
    if F.size == 0:
        return np.zeros(0)
    PF = sp.csr_array(P)[F][:, F]
    MF = sp.csc_array(M)[:, F]
    K0 = sp.block_array([[PF, MF.T], [MF, None]], format="csc") if E else sp.csc_array(PF)
    try:
        solve = _factor(
            PF, np.zeros(F.size), MF, _REG * max(1.0, float(np.abs(PF.data).max(initial=0.0)))
        )
    except RuntimeError:
        return None
    sol = np.asarray(solve(rhs), dtype=float)
    for _ in range(3):  # iterative refinement against the exact system
        sol = sol + solve(rhs - K0 @ sol)
    if not np.isfinite(sol).all():
        return None
    free: np.ndarray = sol[: F.size]
    return free
