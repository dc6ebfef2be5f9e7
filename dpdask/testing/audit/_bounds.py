"""The audit's statistics: Clopper-Pearson bounds on event probabilities, and from them
lower bounds on epsilon (at any delta) and on rho (see :mod:`dpdask.testing.audit`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import beta, norm

from dpdask.errors import ArgumentError, ShapeError

__all__ = [
    "TailCounts",
    "clopper_pearson",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "rho_lower_bound",
    "tail_counts",
    "thresholds",
]


_ALPHAS = np.exp(np.linspace(math.log(1.0005), math.log(1000.0), 400))


# -- binomial confidence bounds -------------------------------------------------------------
def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion.

    Parameters
    ----------
    k, n : int
        Successes and trials, ``0 <= k <= n``, ``n >= 1``.
    alpha : float
        Error probability, ``0 < alpha < 1``: the bound exceeds the true proportion
        with probability at most ``alpha``.

    Returns
    -------
    float
        The ``alpha`` quantile of ``Beta(k, n - k + 1)`` (0 when ``k == 0``).
    """
    k, n = _check_counts(k, n, alpha)
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial proportion.

    Parameters
    ----------
    k, n : int
        Successes and trials, ``0 <= k <= n``, ``n >= 1``.
    alpha : float
        Error probability: the bound is below the true proportion with probability at
        most ``alpha``.

    Returns
    -------
    float
        The ``1 - alpha`` quantile of ``Beta(k + 1, n - k)`` (1 when ``k == n``).
    """
    k, n = _check_counts(k, n, alpha)
    return 1.0 if k == n else float(beta.isf(alpha, k + 1, n - k))


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval (each side at ``(1 - confidence) / 2``).

    Examples
    --------
    >>> lo, hi = clopper_pearson(0, 10)
    >>> lo, round(hi, 4)
    (0.0, 0.3085)
    """
    a = (1.0 - float(confidence)) / 2.0
    return clopper_pearson_lower(k, n, a), clopper_pearson_upper(k, n, a)


def _check_counts(k: int, n: int, alpha: float) -> tuple[int, int]:
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ArgumentError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < float(alpha) < 1.0:
        raise ArgumentError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    return k, n


# -- from two samples of the statistic to bounds ---------------------------------------------
@dataclass(frozen=True)
class TailCounts:
    """The tested events and their Clopper-Pearson bounds.

    Attributes
    ----------
    a_upper : ndarray
        Per event, an upper bound on its probability under the dataset it disfavours.
    b_lower : ndarray
        Per event, a lower bound on its probability under the dataset it favours.
    k_favoured, k_other : ndarray
        The counts behind them.
    n : int
        Trials per dataset.
    alpha : float
        The error probability of each bound (Bonferroni share of ``1 - confidence``).
    """

    a_upper: np.ndarray
    b_lower: np.ndarray
    k_favoured: np.ndarray
    k_other: np.ndarray
    n: int
    alpha: float


def thresholds(n: int, m: int = 12) -> np.ndarray:
    """The ``m`` thresholds of the tests: upper normal quantiles of ``p`` log-spaced from
    1/2 down to ``1 / n`` (fixed before any trial)."""
    p = np.geomspace(0.5, 1.0 / max(int(n), 2), int(m))
    out: np.ndarray = norm.isf(p)
    return out


def tail_counts(
    z0: np.ndarray, z1: np.ndarray, shift: float, m: int = 12, confidence: float = 0.95
) -> TailCounts:
    """Count the audit's events in two samples of the standardised statistic.

    Parameters
    ----------
    z0, z1 : ndarray
        The statistic under ``D`` and under ``D'`` (as many trials each), standardised so
        that under the claim ``z0 ~ N(0, 1)`` and ``z1 ~ N(shift, 1)``.
    shift : float
        The claimed shift (mirrors the thresholds for the events likely under ``D``).
    m : int
        Thresholds per direction (:func:`thresholds`); ``2 m`` events in all.
    confidence : float
        Joint confidence of all ``4 m`` bounds (Bonferroni).

    Returns
    -------
    TailCounts
    """
    z0, z1 = np.asarray(z0, dtype=float).ravel(), np.asarray(z1, dtype=float).ravel()
    if z0.size != z1.size or z0.size == 0:
        raise ShapeError(f"need as many trials on both datasets, got {z0.size} and {z1.size}")
    n = z0.size
    t = thresholds(n, m)
    alpha = (1.0 - float(confidence)) / (4 * len(t))
    fav = np.concatenate([(z1[:, None] > t).sum(0), (z0[:, None] < shift - t).sum(0)])
    oth = np.concatenate([(z0[:, None] > t).sum(0), (z1[:, None] < shift - t).sum(0)])
    b = np.array([clopper_pearson_lower(k, n, alpha) for k in fav])
    a = np.array([clopper_pearson_upper(k, n, alpha) for k in oth])
    return TailCounts(a, b, fav, oth, n, alpha)


def epsilon_lower_bound(tails: TailCounts, delta: float = 0.0) -> float:
    """The largest ``log((b - delta) / a)`` over the events (0 if none is positive).

    If the release is (epsilon, delta)-DP and every Clopper-Pearson bound holds (jointly
    with the confidence of :func:`tail_counts`), epsilon is at least this, for every
    delta at once.
    """
    ok = tails.b_lower > delta
    if not ok.any():
        return 0.0
    eps = np.log((tails.b_lower[ok] - delta) / tails.a_upper[ok])
    return max(0.0, float(eps.max()))


def _renyi_bernoulli(b: float, a: float, alphas: np.ndarray) -> np.ndarray:
    """``D_alpha(Bern(b) || Bern(a))`` for every alpha (natural logarithm)."""
    terms = np.stack(
        [
            alphas * math.log(b) + (1 - alphas) * math.log(a),
            alphas * math.log1p(-b) + (1 - alphas) * math.log1p(-a),
        ]
    )
    out: np.ndarray = logsumexp(terms, axis=0) / (alphas - 1.0)
    return out


def rho_lower_bound(tails: TailCounts) -> float:
    """A lower bound on rho: the largest ``D_alpha(Bern(b) || Bern(a)) / alpha`` over the
    events and a grid of orders ``alpha > 1`` (0 if no event has ``b > a``).

    A rho-zCDP release has ``D_alpha <= alpha rho`` between its outputs on neighbours,
    and so (data processing) between the indicators of any event; the divergence grows
    with ``b`` and falls with ``a`` (for ``a < b``), so the Clopper-Pearson bounds give a
    valid bound with the confidence of :func:`tail_counts`.
    """
    best = 0.0
    for a, b in zip(tails.a_upper, tails.b_lower, strict=True):
        if 0.0 < a < b < 1.0:
            best = max(best, float((_renyi_bernoulli(b, a, _ALPHAS) / _ALPHAS).max()))
    return best
