"""Strategy optimisation for local DP: projected gradient (Algorithm 2, paper 002).

Problem 3.3: minimise ``L(Q) = tr[(Q^T D^-1 Q)^+ G]`` (``G = W^T W``, ``D = diag(Q 1)``)
over ``epsilon``-LDP ``Q``, written with row floors ``z`` as
``z <= Q[:, u] <= e^eps z``, ``1^T Q = 1^T``. The workload enters only through ``G``.

Gradient (rebuilt): with ``P = D^-1 Q``, ``X = Q^T P`` and ``Y = X^-1 G X^-1``,

    dL/dQ = -2 P Y + r 1^T,    r_o = p_o^T Y p_o

(the second term from ``D`` depending on ``Q``). Each step moves ``Q`` along the negative
gradient and ``z`` along the gradient of ``L(Pi_z(R))`` through the projection (a floor
``z_o`` moves the entries clipped at it, ``e^eps`` times for those clipped at the ceiling,
and the free entries absorb the change through the shift), the ``z`` step being the
smaller, then projects (:func:`dpdask.ldp.projection.project`). The step size is searched:
a step that does not lower ``L`` is halved, an accepted one grows by a quarter.

:func:`optimize` runs several starts (random, as in the paper, and each baseline mixed
with 1% of a random strategy) as Dask tasks, continues the best one, and returns the
strategy of least *worst-case* variance among every start and every baseline, so the
result is never worse than the best baseline.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from dask.base import compute
from dask.delayed import delayed
from numpy.typing import NDArray
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from threadpoolctl import threadpool_limits

from dpdask.errors import PlanError
from dpdask.ldp.baselines import baselines as make_baselines
from dpdask.ldp.projection import feasible_floors, project
from dpdask.ldp.strategy import LocalStrategy, as_epsilon, workload_gram

__all__ = ["objective", "objective_gradient", "optimize", "pgd", "random_start"]


def _normalised_rows(Q: np.ndarray) -> NDArray[np.float64]:
    s = Q.sum(axis=1)
    P: NDArray[np.float64] = np.divide(Q, s[:, None], out=np.zeros_like(Q), where=s[:, None] > 0)
    return P


def objective(Q: np.ndarray, G: np.ndarray) -> float:
    """``tr[(Q^T D^-1 Q)^-1 G]`` (``inf`` when ``Q^T D^-1 Q`` is singular)."""
    P = _normalised_rows(Q)
    try:
        c = cho_factor(Q.T @ P, check_finite=False)
    except LinAlgError:
        return math.inf
    f = float(np.trace(cho_solve(c, G, check_finite=False)))
    return f if math.isfinite(f) and f > 0 else math.inf


def objective_gradient(Q: np.ndarray, G: np.ndarray) -> tuple[float, np.ndarray | None]:
    """The objective and its gradient ``-2 P Y + r 1^T`` (see the module docstring)."""
    P = _normalised_rows(Q)
    try:
        c = cho_factor(Q.T @ P, check_finite=False)
    except LinAlgError:
        return math.inf, None
    XiG = cho_solve(c, G, check_finite=False)
    f = float(np.trace(XiG))
    if not (math.isfinite(f) and f > 0):
        return math.inf, None
    Y = cho_solve(c, XiG.T, check_finite=False)
    Y = (Y + Y.T) / 2
    PY = P @ Y
    r = np.einsum("ou,ou->o", PY, P)
    return f, r[:, None] - 2.0 * PY


def _floor_gradient(Q: np.ndarray, z: np.ndarray, e: float, g: np.ndarray) -> NDArray[np.float64]:
    """Gradient of ``L(Pi_z(R))`` in ``z`` at ``Q = Pi_z(R)``, by the chain rule."""
    lower = Q <= z[:, None] * (1 + 1e-9)
    upper = Q >= e * z[:, None] * (1 - 1e-9)
    free = ~(lower | upper)
    nfree = free.sum(axis=0)
    gbar = np.where(nfree > 0, (g * free).sum(axis=0) / np.maximum(nfree, 1), 0.0)
    coef = lower + e * upper
    grad: NDArray[np.float64] = (coef * (g - gbar[None, :])).sum(axis=1)
    return grad


def random_start(m: int, n: int, epsilon: Any, rng: np.random.Generator) -> np.ndarray:
    """The paper's start: ``U[0, 1]`` entries projected with floors ``2 / (m (1 + e^eps))``."""
    e = math.exp(float(as_epsilon(epsilon)))
    z = np.full(m, 2.0 / (m * (1.0 + e)))
    return np.asarray(project(rng.uniform(size=(m, n)), z, epsilon))


def pgd(
    Q0: np.ndarray,
    G: np.ndarray,
    epsilon: Any,
    iters: int = 200,
    *,
    floor_ratio: float = 0.1,
    tol: float = 1e-7,
) -> dict[str, Any]:
    """Projected gradient descent from ``Q0`` (an ``epsilon``-LDP float strategy).

    Parameters
    ----------
    Q0 : ndarray, shape (m, n)
    G : ndarray, shape (n, n)
        The workload's Gram matrix.
    epsilon : number or PureDP
    iters : int
        Gradient evaluations (accepted steps plus rejected trials count once each).
    floor_ratio : float
        Step on ``z`` relative to the step on ``Q`` (each scaled to its own gradient).
    tol : float
        Stop when a step lowers the objective by less than this (relative) ten times running.

    Returns
    -------
    dict
        ``Q`` (the best iterate), ``objective``, ``history`` (objective per accepted step),
        ``evaluations``.
    """
    e = math.exp(float(as_epsilon(epsilon)))
    Q = np.array(Q0, dtype=float)
    z = feasible_floors(Q.min(axis=1), epsilon)
    Q, lam = project(Q, z, epsilon, return_shift=True)
    f, g = objective_gradient(Q, G)
    if g is None:
        raise PlanError("the start does not support the workload (Q^T D^-1 Q is singular)")
    unit = float(np.linalg.norm(Q)) / max(float(np.linalg.norm(g)), 1e-300)
    alpha, kappa = 0.05 * unit, None
    history = [f]
    evaluations, stall = 1, 0
    while evaluations < iters and stall < 10:
        # Q step at fixed floors, then the floors along the gradient of L(Pi_z(R)) with
        # the active sets of that step (entries pushed against a bound stay clipped)
        R = Q - alpha * g
        Q1, lam1 = project(R, z, epsilon, shift0=lam, return_shift=True)
        gz = _floor_gradient(Q1, z, e, g)
        if kappa is None:
            kappa = (
                floor_ratio
                * float(np.linalg.norm(z))
                / max(float(np.linalg.norm(gz)), 1e-300)
                / alpha
            )
        z_new = feasible_floors(z - kappa * alpha * gz, epsilon)
        Q_new, lam_new = project(R, z_new, epsilon, shift0=lam1, return_shift=True)
        f_new, g_new = objective_gradient(Q_new, G)
        evaluations += 1
        if f_new < f:
            kappa *= 1.1
        else:  # the floors moved too far for their active sets: the Q step alone
            kappa *= 0.5
            z_new, Q_new, lam_new = z, Q1, lam1
            f_new, g_new = objective_gradient(Q_new, G)
            evaluations += 1
        if not f_new < f or g_new is None:
            alpha *= 0.5
            if alpha < 1e-12 * unit:
                break
            continue
        stall = stall + 1 if f - f_new < tol * f else 0
        Q, z, lam, f, g = Q_new, z_new, lam_new, f_new, g_new
        history.append(f)
        alpha *= 1.25
    return {"Q": Q, "objective": f, "history": history, "evaluations": evaluations}


def _mix_start(Qb: np.ndarray, epsilon: Any, rng: np.random.Generator, w: float) -> np.ndarray:
    m, n = Qb.shape
    return (1.0 - w) * Qb + w * random_start(m, n, epsilon, rng)


def _run_start(
    kind: str, Qb: np.ndarray | None, G: np.ndarray, epsilon: Any, m: int, iters: int, seed: int
) -> dict[str, Any]:
    with threadpool_limits(limits=1):
        return _run_start_1(kind, Qb, G, epsilon, m, iters, seed)


def _run_start_1(
    kind: str, Qb: np.ndarray | None, G: np.ndarray, epsilon: Any, m: int, iters: int, seed: int
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)  # strategy search only: public, never noise
    n = G.shape[0]
    t0 = time.perf_counter()
    Q0 = random_start(m, n, epsilon, rng) if Qb is None else _mix_start(Qb, epsilon, rng, 0.01)
    try:
        out = pgd(Q0, G, epsilon, iters)
    except ValueError:
        return {"start": kind, "objective": math.inf, "Q": None, "history": [], "evaluations": 0}
    out["start"] = kind
    out["wall_time_s"] = time.perf_counter() - t0
    return out


def default_iterations(n: int) -> tuple[int, int]:
    """(evaluations per random start, extra ones for the best start) by domain size.

    Starts from a baseline get a quarter of a random start's evaluations (at least 10).
    Sized so that larger domains stay within a minute on two cores; ``dpdask bench ldp``
    reports the times.
    """
    if n <= 64:
        return 300, 300
    if n <= 256:
        return 50, 30
    if n <= 512:
        return 40, 30
    return 20, 12


def optimize(
    W: Any,
    epsilon: Any,
    *,
    m: int | None = None,
    starts: int = 1,
    iters: int | None = None,
    polish: int | None = None,
    seed: int = 0,
    use_baselines: bool = True,
    matrix_mechanism: bool = True,
    scheduler: str | None = None,
    alpha: float = 0.01,
) -> LocalStrategy:
    """Optimise an ``epsilon``-LDP strategy for the workload ``W``.

    Parameters
    ----------
    W : LinearQuery or ndarray
        The workload (only ``G = W^T W`` is used).
    epsilon : number or PureDP
    m : int, optional
        Outputs of the random starts (default ``4 n``, the paper's choice).
    starts : int
        Random starts (besides one start from each baseline strategy).
    iters, polish : int, optional
        Gradient evaluations per start and extra ones for the best start
        (default :func:`default_iterations`).
    seed : int
        Seed of the random starts (the result is a function of the inputs and the seed).
    use_baselines : bool
        Start from each baseline too and keep the baselines as candidates.
    matrix_mechanism : bool
        Include the local matrix mechanism among the baselines compared.
    scheduler : str, optional
        Dask scheduler for the starts (default: Dask's configured one).
    alpha : float
        Normalised variance for the sample complexities in ``info``.

    Returns
    -------
    LocalStrategy
        The candidate of least worst-case variance; ``info`` holds every candidate's
        worst-case variance and sample complexity, the winner, and the optimisation
        history.
    """
    eps = as_epsilon(epsilon)
    t0 = time.perf_counter()
    G = workload_gram(W)
    n = G.shape[0]
    m = 4 * n if m is None else int(m)
    it0, it1 = default_iterations(n)
    iters = it0 if iters is None else int(iters)
    polish = it1 if polish is None else int(polish)
    with threadpool_limits(limits=1 if n < 512 else None):
        base = make_baselines(W, eps, matrix_mech=matrix_mechanism) if use_baselines else {}
    specs: list[tuple[str, np.ndarray | None]] = [(f"random{i}", None) for i in range(starts)]
    specs += [(k, np.array(b.Q)) for k, b in base.items() if b.Q is not None]
    seeds = np.random.SeedSequence(seed).generate_state(len(specs) + 1)
    tasks = [
        delayed(_run_start)(
            k,
            Qb,
            G,
            eps,
            m,
            iters if Qb is None else max(iters // 4, 10),
            int(s),
            dask_key_name=f"ldp-start-{k}",
        )
        for (k, Qb), s in zip(specs, seeds[: len(specs)], strict=True)
    ]
    t_base = time.perf_counter() - t0
    runs = list(compute(*tasks, scheduler=scheduler))  # type: ignore[no-untyped-call]
    t_starts = time.perf_counter() - t0 - t_base
    finite = [r for r in runs if r["Q"] is not None and math.isfinite(r["objective"])]
    if not finite and not base:
        raise PlanError("no start supports the workload")
    cands: dict[str, Any] = dict(base)
    starts_report = {r["start"]: r["objective"] for r in runs}
    history: list[float] = []
    if finite:
        # the starts compete on the objective they optimise; the best is continued and
        # then competes with every baseline on the worst-case variance
        best = min(finite, key=lambda r: r["objective"])
        more = best
        if polish > 0:
            try:
                with threadpool_limits(limits=1 if n < 512 else None):
                    more = pgd(best["Q"], G, eps, polish)
            except ValueError:  # re-projected, a near-singular optimum can lose support
                more = best
        history = [float(v) for v in best["history"] + more["history"][1:]]
        try:
            cands[f"optimized:{best['start']}"] = LocalStrategy.from_probabilities(
                more["Q"], eps, name="optimized", info={"start": best["start"], "history": history}
            )
        except ValueError:
            pass
    t_polish = time.perf_counter() - t0 - t_base - t_starts
    with threadpool_limits(limits=1 if n < 512 else None):
        report = {k: c.summary(W, alpha) for k, c in cands.items()}
    winner = min(report, key=lambda k: report[k].get("worst_variance", math.inf))
    chosen = cands[winner]
    if chosen.Q is None:  # the local matrix mechanism has no finite Q: best finite one
        winner = min(
            (k for k in report if cands[k].Q is not None),
            key=lambda k: report[k].get("worst_variance", math.inf),
        )
        chosen = cands[winner]
    result = LocalStrategy(chosen.counts, eps, name="optimized", info=dict(chosen.info))
    result.info.update(
        {
            "winner": winner,
            "candidates": report,
            "baselines": sorted(base),
            "m": m,
            "starts": starts,
            "iters": iters,
            "polish": polish,
            "seed": int(seed),
            "wall_time_s": time.perf_counter() - t0,
            "baselines_s": t_base,
            "starts_s": t_starts,
            "polish_s": t_polish,
            "history": history,
            "start_objectives": starts_report,
        }
    )
    return result
