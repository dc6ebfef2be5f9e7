"""Private truncation thresholds: the sparse vector technique and the recursive mechanism.

Both work on a histogram ``x`` of the records over bins whose records stand for the
representative values ``u`` (:class:`~dpdask.sums.NumericBins`), add or remove one
record being the neighbouring relation.

**SVT** (paper 004, section 3.1; AboveThreshold of Dwork and Roth 2014, Alg. 1). The
candidates form the exponential grid ``c_i = s c^(i-1)``, ``i = 1, 2, ...`` up to the
first ``c_i >= max(u)``; the query at ``c_i`` compares ``F_i``, the number of records
of value ``<= c_i``, with the SVT threshold ``r N``. ``N`` is not public under add/remove
neighbours, so the query is ``f_i = F_i - r N`` against threshold 0 (the same comparison);
written with ``r = p / q`` as the integer ``q F_i - p N`` its sensitivity is
``Delta = max(p, q - p)`` (a record of value ``v`` moves ``f_i`` by ``q - p`` if
``v <= c_i``, else by ``-p``). AboveThreshold adds ``Lap(2 Delta / eps)`` to the threshold
and ``Lap(4 Delta / eps)`` to every query and returns the first candidate whose noisy
query reaches the noisy threshold: ``eps``-DP for any number of candidates. If none
does, there is no truncation (``theta = inf``).

**Recursive mechanism** (Chen and Zhou 2013, the threshold of its first stage). Sort the
values decreasingly, ``v_(1) >= v_(2) >= ...``, and let
``g(v) = ceil(ln(max(v, theta0) / theta0) / beta)``. The statistic
``L = min(N, min_k [k + g(v_(k+1))])`` -- drop ``k`` records, pay 1 per record and
``1 / beta`` per unit of log value of the largest one kept -- has sensitivity 1
(adding a record raises no term and lowers the ``k``-th term to at most the
``(k-1)``-th plus 1). The threshold is ``Delta_hat = theta0 exp(mu + beta (L + Y))`` with
``Y`` Laplace of scale ``1 / eps``: ``eps``-DP, and ``ln Delta_hat`` carries
``Lap(beta / eps)`` noise as in Chen and Zhou (default ``beta = 2 eps / 5``,
``mu = 0.5``, the paper's settings). Its second stage,
``min_i H_i + (N - i) Delta_hat`` with ``H_i`` the sum of the ``i`` smallest values, is
the truncated sum (paper 004, appendix A.5; :func:`recursive_sum`), so truncating
at ``Delta_hat`` and adding ``Lap(Delta_hat / eps_2)`` *is* its second stage.

Noise: exact discrete Laplace on the integer statistics by default (no floating-point
Laplace on a private value); ``unsafe_float=True`` uses float Laplace, for benchmarks.
``size`` runs the mechanism that many times independently (one threshold each), which
is what SQM (one threshold per query) and the benchmarks need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, DataError, PlanError
from dpdask.noise import KeyedRNG
from dpdask.privacy import PureDP, as_fraction

__all__ = [
    "ThresholdResult",
    "exponential_grid",
    "recursive_margin",
    "recursive_statistic",
    "recursive_sum",
    "recursive_threshold",
    "recursive_truncation_bound",
    "svt_threshold",
    "svt_truncation_bound",
]


_MIN_DISCRETE_SCALE = Fraction(1, 10**6)


@dataclass(frozen=True)
class ThresholdResult:
    """Private truncation threshold(s) and what they cost.

    Attributes
    ----------
    theta : numpy.ndarray
        The threshold of every run (shape ``(size,)``; ``inf`` means no truncation).
    method : str
        ``"svt"`` or ``"recursive"``.
    privacy : PureDP
        The budget of *one* run (runs on the same data compose: ``size`` runs cost
        ``size`` times this).
    sensitivity : float
        Sensitivity of the noisy statistic (for the ledger charge).
    noise_scale : float
        The smallest Laplace scale used (the threshold noise for SVT).
    params : dict
        The mechanism's parameters (JSON-safe).
    """

    theta: np.ndarray
    method: str
    privacy: PureDP
    sensitivity: float
    noise_scale: float
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        """The threshold of a single run."""
        if self.theta.size != 1:
            raise ArgumentError(f"{self.theta.size} thresholds; use .theta")
        return float(self.theta[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record (published next to the answers)."""
        th = [None if not math.isfinite(t) else float(t) for t in self.theta.tolist()]
        return {
            "method": self.method,
            "theta": th[0] if len(th) == 1 else th,
            "epsilon": str(self.privacy.epsilon),
            "params": dict(self.params),
        }


def exponential_grid(s: float, c: float, top: float) -> np.ndarray:
    """``s c^(i-1)`` for ``i = 1, 2, ...`` up to and including the first value ``>= top``.

    Raises
    ------
    ArgumentError
        If ``s <= 0``, ``c <= 1`` or the grid would exceed 10,000 points.
    """
    s, c, top = float(s), float(c), float(top)
    if not (s > 0 and math.isfinite(s)):
        raise ArgumentError(f"the first candidate s must be positive, got {s!r}")
    if not (c > 1 and math.isfinite(c)):
        raise ArgumentError(f"the growth rate c must exceed 1, got {c!r}")
    k = 1 if s >= top else math.ceil(math.log(top / s) / math.log(c) - 1e-12) + 1
    if k > 10_000:
        raise ArgumentError(f"the grid s c^(i-1) needs {k} points to reach {top}; raise s or c")
    grid = s * c ** np.arange(k, dtype=float)
    if grid[-1] < top:  # rounding
        grid = np.append(grid, grid[-1] * c)
    return grid


def _check_hist(counts: Any, values: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(counts)
    u = np.asarray(values, dtype=float).ravel()
    if x.ndim != 1 or x.shape != u.shape:
        raise DataError(f"counts {x.shape} and values {u.shape} must be 1-D of the same length")
    if not np.issubdtype(x.dtype, np.integer):
        xf = np.asarray(x, dtype=float)
        if not (np.isfinite(xf).all() and (xf == np.round(xf)).all()):
            raise DataError("counts must be integers")
        x = xf.astype(np.int64)
    if (x < 0).any():
        raise DataError("counts must be non-negative")
    if not np.isfinite(u).all() or (u <= 0).any():
        raise ArgumentError("representative values must be positive and finite")
    return x.astype(np.int64), u


def _check_epsilon(epsilon: Any) -> Fraction:
    eps = as_fraction(epsilon, "epsilon")
    if eps <= 0:
        raise PlanError(f"the threshold budget epsilon must be positive, got {epsilon!r}")
    return eps


def _laplace(rng: KeyedRNG, scale: Fraction, shape: tuple[int, ...], unsafe: bool) -> np.ndarray:
    if unsafe:
        return rng.laplace(float(scale), shape, unsafe_float=True)
    if scale < _MIN_DISCRETE_SCALE:
        raise PlanError(
            f"discrete Laplace scale {float(scale):.3g} is below {float(_MIN_DISCRETE_SCALE)}: "
            "epsilon is too large for this threshold mechanism"
        )
    return rng.discrete_laplace(scale, shape).astype(float)


def svt_threshold(
    counts: Any,
    values: Any,
    epsilon: Any,
    rng: KeyedRNG,
    *,
    r: Any = "0.998",
    s: float,
    c: float = 1.2,
    size: int = 1,
    unsafe_float: bool = False,
) -> ThresholdResult:
    """Choose ``theta`` by AboveThreshold over the grid ``s c^(i-1)`` (see the module notes).

    Parameters
    ----------
    counts : array_like of int
        The histogram ``x`` of the records over the bins.
    values : array_like of float
        The representative value of every bin.
    epsilon : number
        The budget of one run (``rho * epsilon`` in paper 004).
    rng : KeyedRNG
        The noise stream (the threshold measurement's own identity).
    r : number
        The fraction of the records that should not be truncated (paper: 0.998);
        taken as an exact fraction ``p / q``.
    s, c : float
        The first candidate and the growth rate of the grid (paper: ``c = 1.2``).
    size : int
        Independent runs.
    unsafe_float : bool
        Float Laplace noise on ``F_i - r N`` instead of discrete Laplace on ``q F_i - p N``.

    Returns
    -------
    ThresholdResult
    """
    x, u = _check_hist(counts, values)
    eps = _check_epsilon(epsilon)
    rf = as_fraction(r, "r")
    if not 0 < rf < 1:
        raise ArgumentError(f"r must lie strictly between 0 and 1, got {r!r}")
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ArgumentError(f"size must be a positive integer, got {size!r}")
    grid = exponential_grid(s, c, float(u.max()))
    order = np.argsort(u, kind="stable")
    cum = np.concatenate([[0], np.cumsum(x[order])])
    F = cum[np.searchsorted(u[order], grid, side="right")]  # records of value <= c_i
    n = int(x.sum())
    p, q = rf.numerator, rf.denominator
    if unsafe_float:
        f = F.astype(float) - float(rf) * n
        sens = Fraction(max(p, q - p), q)
    else:
        f = (q * F - p * n).astype(float)
        sens = Fraction(max(p, q - p))
    shape = (int(size),)
    rho_hat = _laplace(rng, 2 * sens / eps, shape, unsafe_float)
    nu = _laplace(rng, 4 * sens / eps, (int(size), grid.size), unsafe_float)
    above = f[None, :] + nu >= rho_hat[:, None]
    first = above.argmax(axis=1)
    theta = np.where(above.any(axis=1), grid[first], np.inf)
    return ThresholdResult(
        theta=theta,
        method="svt",
        privacy=PureDP(eps),
        sensitivity=float(sens),
        noise_scale=float(2 * sens / eps),
        params={"r": str(rf), "s": float(s), "c": float(c), "candidates": int(grid.size)},
    )


def svt_truncation_bound(result: ThresholdResult, beta: float = 0.05) -> tuple[float, float]:
    """``(1 - r, alpha / q)``: with probability ``>= 1 - beta`` at most
    ``(1 - r) N + alpha / q`` of the ``N`` records lie above an SVT threshold.

    ``r = p / q`` and ``alpha = (8 Delta / eps) ln(4 K / beta)`` (``K`` candidates,
    ``Delta = max(p, q - p)``, ``eps`` one run's budget): if the threshold noise and every
    query noise are below ``alpha / 2`` in absolute value (the tail ``P(|X| >= t) <=
    2 exp(-t / s)`` of a Laplace or discrete Laplace of scale ``s``, a union bound over the
    ``K + 1`` draws: failure probability ``<= beta (K + 1) / (2 K) <= beta``), the chosen
    candidate's ``q F - p N`` is at least ``-alpha`` (Dwork and Roth 2014, Theorem 3.24),
    so ``N - F <= (1 - r) N + alpha / q``. With no candidate chosen nothing is truncated.
    For the integer statistic ``q F - p N`` (the default, exact noise); a run with
    ``unsafe_float`` measured ``F - r N`` with ``Delta / q``, the same bound.

    Raises
    ------
    ArgumentError
        If ``result`` is not an SVT threshold or ``beta`` is not in ``(0, 1)``.
    """
    if result.method != "svt":
        raise ArgumentError(f"the bound holds for SVT thresholds, not {result.method!r}")
    b = float(beta)
    if not 0 < b < 1:
        raise ArgumentError(f"beta must lie in (0, 1), got {beta!r}")
    r = Fraction(result.params["r"])
    p, q = r.numerator, r.denominator
    k = int(result.params["candidates"])
    alpha = 8 * max(p, q - p) / float(result.privacy.epsilon) * math.log(4 * k / b)
    return float(1 - r), alpha / q


def recursive_statistic(counts: Any, values: Any, beta: float, theta0: float) -> int:
    """``L = min(N, min_k [k + g(v_(k+1))])`` of the module notes (sensitivity 1), exactly.

    Examples
    --------
    >>> recursive_statistic([0, 2, 1], [1.0, 2.0, 100.0], beta=1.0, theta0=1.0)
    2
    """
    x, u = _check_hist(counts, values)
    beta, theta0 = float(beta), float(theta0)
    if not (beta > 0 and theta0 > 0):
        raise ArgumentError("beta and theta0 must be positive")
    g = np.ceil(np.log(np.maximum(u, theta0) / theta0) / beta - 1e-9)
    g = np.maximum(g, 0.0)
    order = np.argsort(-u, kind="stable")
    above = np.concatenate([[0], np.cumsum(x[order])[:-1]])  # records of larger value
    terms = above + g[order]
    n = int(x.sum())
    return int(min(n, terms.min())) if n else 0


def recursive_threshold(
    counts: Any,
    values: Any,
    epsilon: Any,
    rng: KeyedRNG,
    *,
    theta0: float,
    beta: float | None = None,
    mu: float = 0.5,
    grid: np.ndarray | None = None,
    size: int = 1,
    unsafe_float: bool = False,
) -> ThresholdResult:
    """The recursive mechanism's threshold ``Delta_hat`` (see the module notes).

    Parameters
    ----------
    counts, values : array_like
        The histogram and the representative values.
    epsilon : number
        The budget of one run.
    rng : KeyedRNG
        The noise stream.
    theta0 : float
        The smallest threshold scale (paper: the same as SVT's ``s``).
    beta : float, optional
        Default ``2 epsilon / 5``.
    mu : float
        Shift of ``ln Delta_hat`` (paper: 0.5).
    grid : array, optional
        Round the threshold *down* to this increasing public grid (post-processing;
        fewer distinct thresholds, e.g. to cache strategies); below the grid, its
        first point.
    size : int
        Independent runs.
    unsafe_float : bool
        Float Laplace noise instead of discrete Laplace.

    Returns
    -------
    ThresholdResult
    """
    eps = _check_epsilon(epsilon)
    b = float(2 * eps / 5) if beta is None else float(beta)
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ArgumentError(f"size must be a positive integer, got {size!r}")
    L = recursive_statistic(counts, values, b, theta0)
    y = _laplace(rng, 1 / eps, (int(size),), unsafe_float)
    theta = float(theta0) * np.exp(float(mu) + b * (L + y))
    if grid is not None:
        gr = np.asarray(grid, dtype=float)
        idx = np.searchsorted(gr, theta, side="right") - 1
        theta = gr[np.clip(idx, 0, gr.size - 1)]
    return ThresholdResult(
        theta=theta,
        method="recursive",
        privacy=PureDP(eps),
        sensitivity=1.0,
        noise_scale=float(1 / eps),
        params={
            "beta": b,
            "theta0": float(theta0),
            "mu": float(mu),
            "noise": "float" if unsafe_float else "discrete",
            "grid": grid is not None,
        },
    )


_SLACK = 1e-6  # covers the 1e-9 guard in g and the rounding of theta's logarithm


def _lower_tail(y: float, eps: float, discrete: bool) -> float:
    """``P(Y <= y)`` for ``Y`` Laplace of scale ``1 / eps`` (integer-valued if ``discrete``)."""
    if discrete:
        k, p = math.floor(y), math.exp(-eps)
        return p ** (-k) / (1 + p) if k <= 0 else 1 - p ** (k + 1) / (1 + p)
    return 0.5 * math.exp(eps * y) if y <= 0 else 1 - 0.5 * math.exp(-eps * y)


def recursive_margin(
    epsilon: float, beta: float, mu: float, failure: float, *, discrete: bool = True
) -> tuple[float, float]:
    """``(shift, fail)``: ``n_trunc <= (ln(theta / theta0) - mu) / beta + shift`` except
    with probability at most ``fail`` (see :func:`recursive_truncation_bound`).

    ``fail`` is ``failure`` when the event ``Y > -mu / beta`` can be afforded, else the
    larger ``P(Y <= -mu / beta)`` the bound cannot do without.
    """
    eps, b, mu, failure = float(epsilon), float(beta), float(mu), float(failure)
    if not (eps > 0 and b > 0 and 0 < failure < 1):
        raise ArgumentError("epsilon and beta must be positive and the failure in (0, 1)")
    a = mu / b - _SLACK  # the bound needs Y > -a
    if discrete:
        p = math.exp(-eps)  # P(Y <= -k) = p^k / (1 + p): the least t with P(Y < -t) <= failure
        t = max(0.0, math.ceil(math.log(1 / (failure * (1 + p))) / eps - 1e-12) - 1.0)
        y_lo = max(-t, math.floor(-a) + 1.0)  # Y >= y_lo: integers above -a and from -t
        return -y_lo, _lower_tail(y_lo - 1, eps, True)
    t = max(0.0, math.log(1 / (2 * failure)) / eps)
    if t < a:
        return t, failure
    return a, _lower_tail(-a, eps, False)


def recursive_truncation_bound(
    result: ThresholdResult, beta: float = 0.05
) -> tuple[np.ndarray, float]:
    """Per run, a bound on the records above a recursive threshold, and its failure chance.

    With ``a = mu / beta_r`` (``beta_r`` the mechanism's own ``beta``): if the threshold
    noise has ``Y > -a``, no more than ``L`` records lie above ``theta`` (had ``j > L``
    records values above ``theta``, every term of ``L`` with ``k < j`` would be at least
    ``g(v_(1)) >= ln(theta / theta0) / beta_r = L + Y + a``, and every other term at least
    ``j``), and ``L = (ln(theta / theta0) - mu) / beta_r - Y``. So on ``{Y >= -t} and
    {Y > -a}``, ``n_trunc <= (ln(theta / theta0) - mu) / beta_r + t``: a public number,
    computed from the published threshold. ``t`` is the least with ``P(Y < -t) <= beta``
    if that ``t`` is below ``a``; otherwise the bound holds only with probability
    ``1 - P(Y <= -a)`` (raise ``mu`` to afford more), and that is what is returned. The
    event ``Y <= -a`` cannot be excluded: when every record has one value, it truncates
    them all.

    Parameters
    ----------
    result : ThresholdResult
        A recursive threshold (not rounded to a grid).
    beta : float
        The failure probability wanted for each run.

    Returns
    -------
    bounds : numpy.ndarray
        Per run, the largest number of records that may lie above its threshold.
    failure : float
        An upper bound on the probability, per run, that its bound fails: at most
        ``beta`` when ``mu`` affords it, else ``P(Y <= -mu / beta_r)``.

    Raises
    ------
    ArgumentError
        For an SVT or grid-rounded threshold, or ``beta`` outside ``(0, 1)``.
    """
    if result.method != "recursive":
        raise ArgumentError(f"the bound holds for recursive thresholds, not {result.method!r}")
    if result.params.get("grid", True):
        raise ArgumentError("no bound is derived for a threshold rounded down to a grid")
    pr = result.params
    shift, fail = recursive_margin(
        float(result.privacy.epsilon), pr["beta"], pr["mu"], beta,
        discrete=pr.get("noise") == "discrete",
    )  # fmt: skip
    log_ratio = np.log(np.asarray(result.theta, dtype=float) / pr["theta0"])
    bounds = np.floor((log_ratio - pr["mu"]) / pr["beta"] + shift + _SLACK)
    return np.maximum(bounds, 0.0), fail


def recursive_sum(data: Any, delta_hat: float) -> float:
    """The recursive mechanism's second-stage statistic ``min_i H_i + (N - i) Delta_hat``.

    ``H_i`` is the sum of the ``i`` smallest values. Equal to ``sum(min(v, Delta_hat))``
    (paper 004, appendix A.5); computed here from its definition, for checking.
    """
    v = np.sort(np.asarray(data, dtype=float).ravel())
    H = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(v.size + 1)
    return float((H + (v.size - i) * float(delta_hat)).min())
