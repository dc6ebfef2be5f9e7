"""Projected Newton with conjugate-residual inner solves for ``min 1/2 u^T G u - c^T u, u >= 0``.

The variables are Jacobi-scaled (``diag G = 1`` where non-zero), so a gradient entry
and a variable are in the same units (noise units when the measurements are
inverse-variance weighted; see :mod:`dpdask.reconstruct.nnls`).

Each iteration (after Bertsekas' projected Newton, 1982):

1. *Binding set*: variables at most ``eps = max(tol, min(1e-2, ||u - P(u - g)||))``
   above zero whose gradient is positive (Bertsekas' epsilon-active set: with a tiny
   ``tol`` a rank-deficient ``G`` otherwise stalls on variables just above zero; a
   larger floor than ``1e-2`` costs more products). They are moved to zero; the others
   are *free*, except that a variable at zero is freed only when its gradient is below
   ``-2 x`` the root-mean-square projected gradient: freeing every variable with a
   slightly negative (float32) gradient can make the free set flip between two states
   for dozens of iterations (the threshold shrinks with the projected gradient, so
   every violation is eventually freed). Nor is it freed while the violations left at
   zero fit in half the stopping rule's budget (the sum of their squares at most
   ``n tol^2 / 2``, the smallest ones kept first): the stopping rule allows them, and
   near the end, freeing them all (thousands of cells at a hundredth of the noise)
   sends them back to zero at the next step, for hundreds of iterations on large
   geographies.
2. *Newton direction on the free set*: a few conjugate-residual (CR) iterations on
   ``G_FF d = -g_F``. CR minimises the residual, which is the reduced gradient and
   what the stopping rule measures; on an ill-conditioned ``G`` (a Kronecker
   strategy's Gram has condition numbers of 1e10 on the CPH domain) it reaches a
   gradient tolerance sooner than conjugate gradients. Ten iterations at first (or
   until the residual falls 20-fold); when they stagnate (the residual falls by less
   than half) the next direction gets twice as many, up to 40, and half as many after
   a solve that stopped early: on large geographies the reduced gradient ends up in
   the Gram's smallest eigenvalues, where ten iterations barely reduce it and Newton
   would creep.
3. *Projected step*: ``u1 = max(u + d, 0)``. The full step is taken when it decreases
   the objective (Armijo test along ``s = u1 - u``, which lets many variables reach
   zero at once), else up to three halvings along the projection arc
   ``max(u + d / 2^j, 0)``, each with a product, and then the exact minimiser along the
   best ``s`` (the objective is quadratic, so ``G s`` gives it without another
   product). If ``s`` is not a descent direction
   ``d`` is halved (back along the projection arc, no product needed to test it) up to
   8 times, and only then does the projected gradient step replace it.

The free set is what changes between iterations; on a sparse histogram it shrinks to
the support of the solution within a few dozen iterations. Right-hand sides
(geographies) are solved one at a time, each on its working set: the positive
variables, those with a negative gradient and the free set, held as index arrays, so
that apart from the products an iteration costs a few passes over the ``n`` cells
instead of a few dozen (a batch advanced in lockstep would take, for every row, the
iterations of the slowest). The inner solves see only the free set, through a product
restricted to it when the Gram provides one, and the product of a step (non-zero on the
working set only) is taken from its entries when the Gram can do that more cheaply than
a full product (with the last axis' factor applied only to the fibres the step
touches). Products may be approximate (float32): the inner solves then run in float32
(a direction needs no more), and ``G u`` is computed exactly at the start and every 20
iterations and updated by approximate products of the steps in between, whose rounding
errors are relative to ``G s``, about the change of the gradient, and shrink with it.
When the approximate gradient passes the test (or stops making progress) it is
recomputed exactly: the iteration stops if the test holds, and goes on otherwise, in
float32 from the exact gradient, or, after three such checks or a stall, with exact
gradients and steps (the inner solves staying float32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dpdask.reconstruct._report import ConvergenceReport

__all__ = ["projected_newton"]

_GAMMA = 1e-4  # sufficient-decrease constant of the full projected step
_REFRESH = 20  # recompute G u from scratch every this many iterations
_INNER = 10  # CR iterations per Newton direction, at first
_INNER_MAX = 40  # ... doubled up to this while they stagnate (see _inner_budget)
_STAGNANT = 0.5  # CR stagnates when it uses all its iterations and leaves more than this
_INNER_RTOL = 0.05  # ... or until the reduced residual has fallen by this factor
_EPS = 1e-2  # the epsilon-active threshold is at least min(this, ||projected gradient||)
_CHECKS = 3  # exact checks that fail before approximate gradients and steps are given up
_ARC = 8  # halvings of the Newton step along the projection arc before a gradient step
_THETA = 2.0  # a variable at zero is freed when its gradient is below -this x rms
_KEEP = 0.5  # ... and the violations left at zero fill this share of n tol^2 (0.8 stalls)
_ARC_SEARCH = 3  # further halvings, each with a product, when the full step fails Armijo

Product = Callable[[np.ndarray], np.ndarray]
Restrict = Callable[[np.ndarray, npt.DTypeLike], Callable[[np.ndarray], np.ndarray]]
Entries = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _conjugate_residual(op: Product, b: np.ndarray, iters: int) -> tuple[np.ndarray, float]:
    """At most ``iters`` conjugate-residual iterations on ``G_FF d = b`` (vectors of the
    free set), fewer once the residual has fallen by :data:`_INNER_RTOL`; returns ``d``
    and the residual left, relative to ``b`` (0 when CR stopped early)."""
    r = b.copy()
    d = np.zeros_like(r)
    p = r.copy()
    ar = op(r)
    ap = ar.copy()
    rar = float(np.dot(r, ar))
    if rar <= 0:
        return d, 0.0
    start = float(np.linalg.norm(r))
    for used in range(1, iters + 1):
        app = float(np.dot(ap, ap))
        if app <= 0:
            return d, 0.0
        a = r.dtype.type(rar / app)
        d += a * p
        r -= a * ap
        left = float(np.linalg.norm(r)) / start
        if left <= _INNER_RTOL:
            return d, 0.0
        if used == iters:  # the product for a next iteration would go unused
            return d, left
        ar = op(r)
        rar_new = float(np.dot(r, ar))
        beta = r.dtype.type(rar_new / rar)
        rar = rar_new
        p *= beta
        p += r
        ap *= beta
        ap += ar
    return d, 0.0


def _inner_budget(budget: int, left: float) -> int:
    """The CR iterations of the next Newton direction, after a solve that used ``budget``
    and left ``left`` of its residual (0: it stopped early): doubled (up to
    :data:`_INNER_MAX`) when CR stagnated (more than :data:`_STAGNANT` left), halved
    (down to :data:`_INNER`) when it stopped early, else kept."""
    if left > _STAGNANT:
        return min(2 * budget, _INNER_MAX)
    return max(budget // 2, _INNER) if left == 0 else budget


@dataclass
class _Counts:
    products: int = 0
    restricted: int = 0
    fallbacks: int = 0
    iterations: list[int] = field(default_factory=list)


def _arc(d: np.ndarray, uJ: np.ndarray, nf: int, scale: float) -> np.ndarray:
    """The step ``P(u + scale d) - u`` on the working set: the first ``nf`` entries free
    (moved by ``scale d``), the rest binding (moved to zero)."""
    sJ = np.empty_like(uJ)
    sJ[:nf] = np.maximum(scale * d + uJ[:nf], 0.0) - uJ[:nf]
    sJ[nf:] = -uJ[nf:]
    return sJ


def _sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The union of two sorted index arrays, sorted (a merge of two runs: no full sort)."""
    c = np.concatenate([a, b])
    c.sort(kind="stable")
    return c[np.r_[True, c[1:] != c[:-1]]] if c.size else c


def _rms_projected_gradient(u: np.ndarray, g: np.ndarray, pos: np.ndarray, gz: np.ndarray) -> float:
    """``||u - P(u - g)|| / sqrt(n)`` from the positive entries ``pos`` and the gradients
    ``gz`` of the entries at zero with ``g <= 0`` (elsewhere ``u = 0 <= g`` and the
    entry is zero)."""
    up, gp = u[pos], g[pos]
    a = up - np.maximum(up - gp, 0.0)
    return float(np.sqrt((np.dot(a, a) + np.dot(gz, gz)) / u.size))


def _freeing_threshold(gn: np.ndarray, at_zero: np.ndarray, floor: float, budget: float) -> float:
    """The gradient below minus which a variable at zero is freed: at least ``floor``,
    and high enough that the violations ``gn`` (non-positive gradients, ``at_zero``
    marking the variables at zero) left unfreed sum to at most ``_KEEP x budget`` in
    squares, the smallest kept first."""
    kept = gn[at_zero & (gn > -floor)]
    room = _KEEP * budget - float(np.dot(kept, kept))
    if room <= 0:
        return floor
    q = np.sort(np.square(gn[at_zero & (gn <= -floor)]))
    k = int(np.searchsorted(np.cumsum(q), room, side="right"))
    return max(floor, float(np.sqrt(q[k - 1]))) if k else floor


def _newton_row(
    mv: Product,
    exact: Product | None,
    restrict: Restrict | None,
    entries: Entries | None,
    c: np.ndarray,
    u0: np.ndarray,
    tol: float,
    maxiter: int,
    counts: _Counts,
) -> tuple[np.ndarray, float]:
    """One right-hand side of :func:`projected_newton`; returns ``u`` and its residual."""
    n = c.size
    verified = exact is None
    inner = np.float64 if verified else np.float32

    def apply(v: np.ndarray, op: Product) -> np.ndarray:
        counts.products += 1
        return np.asarray(op(v[None, :])[0], dtype=float)

    def restricted(idx: np.ndarray) -> Product:
        if restrict is not None:
            op = restrict(idx, inner)

            def run(v: np.ndarray) -> np.ndarray:
                counts.restricted += 1
                return op(v)

            return run
        full = np.zeros(n, dtype=inner)

        def scatter(v: np.ndarray) -> np.ndarray:
            full[idx] = v
            out: np.ndarray = apply(full, mv)[idx].astype(inner)
            return out

        return scatter

    def along(J: np.ndarray, sJ: np.ndarray) -> tuple[np.ndarray, float]:
        """``G s`` for the step ``s`` (``sJ`` on the entries ``J``), and ``s^T G s``."""
        if entries is not None and not verified:  # the approximate product of the entries
            counts.products += 1
            gsv = entries(J, sJ)
        else:
            s = np.zeros(n)
            s[J] = sJ
            gsv = apply(s, mv)
        return gsv, float(np.dot(sJ, gsv[J]))

    u = np.maximum(u0, 0.0)
    # the gradient G u - c is computed exactly (float64) at the start and every
    # _REFRESH iterations, and updated in between by approximate products of the steps,
    # whose rounding errors shrink with the steps (they are relative to G s, about the
    # change of gradient)
    exact_mv = exact or mv
    g = apply(u, exact_mv) - c
    best, best_it = np.inf, 0
    it = checks = 0
    checked = False  # g was just recomputed exactly
    budget = _INNER
    while True:
        pos = np.flatnonzero(u > 0)
        nonpos = np.flatnonzero(g <= 0)
        gn, at_zero = g[nonpos], u[nonpos] <= 0
        rel = _rms_projected_gradient(u, g, pos, gn[at_zero])
        if rel < 0.9 * best:
            best, best_it = rel, it
        stalled = it - best_it > _REFRESH  # approximate products no longer make progress
        if (rel <= tol or stalled) and not verified and not checked:
            # the gradient was approximate: check it exactly. After _CHECKS failed
            # checks, or a stall, the gradient and the steps go on in float64 (the
            # inner solves, a direction, stay approximate)
            g = apply(u, exact_mv) - c  # exact_mv is exact: not verified
            checks += 1
            if stalled or checks > _CHECKS:
                mv, verified = exact_mv, True
            else:
                checked, best, best_it = True, np.inf, it
            continue
        if checked and rel <= tol:
            break  # rel is exact
        checked = False
        if rel <= tol or it >= maxiter:
            if not verified:  # report the exact projected gradient
                g = apply(u, exact_mv) - c
                gz = g[(u <= 0) & (g < 0)]
                rel = _rms_projected_gradient(u, g, np.flatnonzero(u > 0), gz)
            break
        it += 1
        # Bertsekas' epsilon-active set: eps shrinks with the projected gradient. The
        # binding variables are those at most eps with a positive gradient; the free
        # ones are above eps or have a gradient <= 0
        eps = max(tol, min(_EPS, rel * np.sqrt(n)))
        up = u[pos]
        threshold = _freeing_threshold(gn, at_zero, _THETA * rel, n * tol * tol)
        free = _sorted_union(pos[up > eps], nonpos[gn <= -threshold])
        moved = pos[(up <= eps) & (g[pos] > 0)]  # binding but not yet at zero: to zero
        d, left = _conjugate_residual(restricted(free), (-g[free]).astype(inner), budget)
        budget = _inner_budget(budget, left)
        d = d.astype(float)
        J = np.concatenate([free, moved])
        uJ, gJ = u[J], g[J]
        nf = free.size

        alpha = 1.0
        sJ = _arc(d, uJ, nf, alpha)
        gs = float(np.dot(gJ, sJ))
        for _ in range(_ARC):
            if gs < 0:
                break
            # back along the projection arc P(u + alpha d): descent for small alpha
            alpha *= 0.5
            sJ = _arc(d, uJ, nf, alpha)
            gs = float(np.dot(gJ, sJ))
        if gs >= 0:  # not a descent direction: the projected gradient step instead
            counts.fallbacks += 1
            J = _sorted_union(pos, nonpos)
            uJ, gJ = u[J], g[J]
            sJ = np.maximum(uJ - gJ, 0.0) - uJ
            gs = float(np.dot(gJ, sJ))
            alpha = 0.0  # no arc search on this step
        gsv, sgs = along(J, sJ)
        full = gs + 0.5 * sgs <= _GAMMA * gs or sgs <= 0
        # Armijo search along the projection arc: P(u + d/2), P(u + d/4), ... lets the
        # variables that leave the free set reach zero exactly (a step along one
        # segment s stops them short, and the next iteration frees them again)
        for _ in range(_ARC_SEARCH if alpha > 0 and not full else 0):
            alpha *= 0.5
            sJ2 = _arc(d, uJ, nf, alpha)
            gsv2, sgs2 = along(J, sJ2)
            gs2 = float(np.dot(gJ, sJ2))
            ok = gs2 < 0 and gs2 + 0.5 * sgs2 <= _GAMMA * gs2
            if ok or gs2 + 0.5 * sgs2 < gs + 0.5 * sgs:
                sJ, gsv, gs, sgs = sJ2, gsv2, gs2, sgs2
            if ok:
                full = True
                break
        tau = 1.0 if full else min(1.0, max(0.0, -gs / sgs if sgs > 0 else 1.0))
        u[J] = np.maximum(uJ + tau * sJ, 0.0)
        g += tau * gsv
        if it % _REFRESH == 0:
            g = apply(u, exact_mv) - c
    counts.iterations.append(it)
    return u, rel


def projected_newton(
    gmv: Product,
    C: np.ndarray,
    U0: np.ndarray,
    *,
    tol: float,
    maxiter: int,
    exact: Product | None = None,
    restrict: Restrict | None = None,
    entries: Entries | None = None,
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
        Newton iterations per row (each a few products).
    exact : callable, optional
        The exact (float64) product, when ``gmv`` is approximate.
    restrict : callable, optional
        ``restrict(idx, dtype)`` returns ``v -> G[idx, idx] v`` in ``dtype``, for the
        inner solves (``details["restricted"]`` counts these cheaper products); else
        they scatter into a full product and gather.
    entries : callable, optional
        ``entries(idx, vals)`` returns ``G v`` (``(n,)``, in ``gmv``'s precision) for the
        ``v`` that is ``vals`` at the distinct entries ``idx`` and zero elsewhere: the
        approximate product of a step, cheaper than ``gmv`` when the step is sparse.

    Returns
    -------
    ndarray, ConvergenceReport
        The solutions ``(k, n)`` and the report (``iterations``: the most any row took;
        ``details["products"]``: full applications of ``G`` to one vector, summed over
        the rows).
    """
    counts = _Counts()
    U = np.empty(C.shape)
    rel = np.zeros(C.shape[0])
    for i in range(C.shape[0]):
        U[i], rel[i] = _newton_row(gmv, exact, restrict, entries, C[i], U0[i], tol, maxiter, counts)
    report = ConvergenceReport(
        method="projected-newton",
        converged=bool((rel <= tol).all()),
        iterations=max(counts.iterations, default=0),
        residual=float(rel.max(initial=0.0)),
        tolerance=tol,
        details={
            "products": counts.products,
            "restricted": counts.restricted,
            "gradient_fallbacks": counts.fallbacks,
        },
    )
    return U, report
