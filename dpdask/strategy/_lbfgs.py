"""A vectorised limited-memory BFGS for the large p-Identity problems.

SciPy's L-BFGS-B spends ``O(N log N)`` per iteration on bound handling (the
generalised Cauchy point sorts breakpoints), which on large problems is more than
one evaluation of the OPT_0 objective and would dominate the run. For those
problems the optimisers call this routine instead: unconstrained L-BFGS (two-loop
recursion, ``O(m N)`` NumPy work per iteration) with a backtracking line search
enforcing the Armijo condition, and non-negativity by the reparametrisation
``Theta = phi^2`` in the caller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["LBFGSResult", "lbfgs"]


@dataclass
class LBFGSResult:
    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    message: str


def lbfgs(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    *,
    maxiter: int = 1000,
    ftol: float = 1e-4,
    gtol: float = 1e-10,
    memory: int = 10,
    nonneg: bool = False,
) -> LBFGSResult:
    """Minimise ``fun`` (returning value and gradient) from ``x0``.

    With ``nonneg=True`` the iterates stay in ``x >= 0``: variables at zero whose
    gradient points outward are held fixed for the step, the quasi-Newton
    direction is computed on the others, and the line search follows the
    projection ``max(x + t d, 0)`` (a projected quasi-Newton method in the
    manner of Kim, Sra and Dhillon, 2010).

    Stops when the relative decrease ``(f_k - f_{k+1}) / max(|f_k|, |f_{k+1}|, 1)``
    falls below ``ftol`` (SciPy's ``ftol`` convention), the largest gradient entry
    below ``gtol``, or after ``maxiter`` iterations.
    """
    x = np.array(x0, dtype=float)
    if nonneg:
        np.maximum(x, 0.0, out=x)
    f, g = fun(x)
    nfev = 1
    S: deque[np.ndarray] = deque(maxlen=memory)
    Yq: deque[np.ndarray] = deque(maxlen=memory)
    rho: deque[float] = deque(maxlen=memory)
    message = "maximum iterations reached"
    nit = 0
    for nit in range(1, maxiter + 1):
        gf = g
        if nonneg:
            gf = np.where((x <= 0) & (g > 0), 0.0, g)  # free part of the gradient
        gmax = float(np.abs(gf).max())
        if gmax <= gtol:
            message = "gradient below gtol"
            break
        d = _two_loop(gf, S, Yq, rho)
        if nonneg:
            d[gf == 0] = 0.0
        slope = float(gf @ d)
        if slope >= 0:  # not a descent direction: restart from steepest descent
            S.clear()
            Yq.clear()
            rho.clear()
            d = -gf
            slope = float(gf @ d)
        step = 1.0 if S else min(1.0, 1.0 / max(gmax, 1e-300))
        # never jump more than ten times the current scale of x in one step
        reach = step * float(np.abs(d).max())
        limit = 10.0 * max(1.0, float(np.abs(x).max()))
        if reach > limit:
            step *= limit / reach
        while True:
            x_new = x + step * d
            if nonneg:
                np.maximum(x_new, 0.0, out=x_new)
                slope_t = float(g @ (x_new - x))
            else:
                slope_t = step * slope
            f_new, g_new = fun(x_new)
            nfev += 1
            if np.isfinite(f_new) and f_new <= f + 1e-4 * slope_t:
                break
            step *= 0.5
            if step < 1e-20:
                return LBFGSResult(x, f, nit, nfev, "line search failed")
        s, y = x_new - x, g_new - g
        sy = float(s @ y)
        if sy > 1e-12 * math.sqrt(float(s @ s) * float(y @ y)):
            S.append(s)
            Yq.append(y)
            rho.append(1.0 / sy)
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, f, g = x_new, f_new, g_new
        if decrease <= ftol:
            message = "relative decrease below ftol"
            break
    return LBFGSResult(x, float(f), nit, nfev, message)


def _two_loop(
    g: np.ndarray, S: deque[np.ndarray], Y: deque[np.ndarray], rho: deque[float]
) -> np.ndarray:
    q = g.copy()
    alphas = []
    for s, y, r in zip(reversed(S), reversed(Y), reversed(rho), strict=True):
        a = r * float(s @ q)
        alphas.append(a)
        q -= a * y
    if S:
        s, y = S[-1], Y[-1]
        q *= float(s @ y) / float(y @ y)
    for (s, y, r), a in zip(zip(S, Y, rho, strict=True), reversed(alphas), strict=True):
        b = r * float(y @ q)
        q += (a - b) * s
    return -q
