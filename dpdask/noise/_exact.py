"""Exact discrete samplers by integer arithmetic on uniform random integers (CKS 2020).

Canonne, Kamath and Steinke ("The discrete Gaussian for differential privacy",
2020; "CKS") sample the discrete Laplace and discrete Gaussian distributions
exactly from uniform random integers, with integer comparisons only. This module
vectorises their algorithms over a batch with masks (each loop runs until every
element of the batch has resolved). Every random draw is ``Generator.integers``
(Lemire's unbiased bounded integers on the keyed Philox stream); no floating
point number is ever formed.

* :func:`bernoulli_exp` -- ``Bernoulli(exp(-n/d))`` for integers ``n >= 0``,
  ``d >= 1`` (CKS Algorithm 1): for ``gamma = n/d`` in ``[0, 1]``, draw
  ``A_k ~ Bernoulli(gamma / k)`` for ``k = 1, 2, ...`` until the first ``A_k = 0``;
  the output is 1 iff that ``k`` is odd, which has probability
  ``sum_k (-1)**(k+1) gamma**(k-1) / (k-1)! * (1 - gamma/k) = exp(-gamma)``.
  ``Bernoulli(gamma / k)`` is ``[uniform{0..d-1} < n] and [uniform{0..k-1} = 0]``.
  For ``gamma > 1``, ``exp(-gamma) = exp(-1)**floor(gamma) * exp(-(gamma mod 1))``:
  ``floor(gamma)`` independent ``Bernoulli(exp(-1))`` trials and one of the rest.
* :func:`discrete_laplace_cks` -- CKS Algorithm 2 for the scale ``t/s``.
* :func:`discrete_gaussian_cks` -- CKS Algorithm 3 for ``sigma**2 = p/q``: a
  discrete Laplace candidate ``Y`` of scale ``T = floor(sigma) + 1``, accepted with
  probability ``exp(-(|Y| - sigma**2/T)**2 / (2 sigma**2))``
  ``= exp(-(|Y| q T - p)**2 / (2 p q T**2))``.

These are the reference samplers (the table samplers of :mod:`dpdask.noise._table`
are the fast production path and are exact too). Parameters are exact rationals
(:class:`fractions.Fraction`; a float is converted exactly). The integers must fit
in int64: :func:`discrete_gaussian_cks` needs ``2 p q T**2 < 2**62``, and
:func:`discrete_laplace_cks` needs ``t < 2**62``; otherwise they raise ``ValueError``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, PlanError

__all__ = [
    "as_rational",
    "bernoulli_exp",
    "bernoulli_exp_scalar",
    "discrete_gaussian_cks",
    "discrete_laplace_cks",
]

_LIMIT = 1 << 62


def as_rational(value: object, name: str = "scale") -> Fraction:
    """``value`` as an exact positive :class:`~fractions.Fraction` (floats converted exactly)."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a number, not a boolean")
    if isinstance(value, float | np.floating) and not math.isfinite(float(value)):
        raise PlanError(f"{name} must be finite, got {value!r}")
    try:
        # any other type is Fraction's to refuse (TypeError, re-raised below)
        r = Fraction(value) if not isinstance(value, np.floating) else Fraction(float(value))  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"{name} must be a rational number, got {value!r}") from exc
    if r <= 0:
        raise PlanError(f"{name} must be positive, got {value!r}")
    return r


def _uniform_below(gen: np.random.Generator, high: int, size: int) -> np.ndarray:
    """``size`` uniform integers in ``{0, ..., high - 1}`` (int64; ``1 <= high <= 2**62``)."""
    return gen.integers(0, high, size=size, dtype=np.int64)


def _bernoulli_exp1(gen: np.random.Generator, size: int) -> np.ndarray:
    """``size`` independent ``Bernoulli(exp(-1))`` (CKS Algorithm 1 with gamma = 1)."""
    out = np.zeros(size, dtype=bool)
    live = np.arange(size)
    k = 1
    while live.size:
        a = _uniform_below(gen, k, live.size) == 0  # Bernoulli(1/k)
        stop = live[~a]
        out[stop] = k % 2 == 1
        live = live[a]
        k += 1
    return out


def bernoulli_exp(gen: np.random.Generator, n: np.ndarray, d: int) -> np.ndarray:
    """Independent ``Bernoulli(exp(-n_i / d))`` for integers ``n_i >= 0`` and ``d >= 1``.

    Parameters
    ----------
    gen : numpy.random.Generator
        The stream (only ``integers`` is called).
    n : array_like of int
        Numerators (int64, non-negative).
    d : int
        The common denominator, ``1 <= d <= 2**62``.

    Returns
    -------
    ndarray of bool
    """
    d = int(d)
    if not 1 <= d <= _LIMIT:
        raise ArgumentError(f"the denominator must be in [1, 2**62], got {d}")
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    if n.size and int(n.min()) < 0:
        raise ArgumentError("bernoulli_exp needs non-negative numerators")
    whole, frac = np.divmod(n, d)
    out = np.ones(n.size, dtype=bool)
    # exp(-1) ** floor(gamma): all of floor(gamma) trials must succeed
    live = np.flatnonzero(whole > 0)
    left = whole[live]
    while live.size:
        ok = _bernoulli_exp1(gen, live.size)
        out[live[~ok]] = False
        left = left[ok] - 1
        live = live[ok]
        more = left > 0
        live, left = live[more], left[more]
    # exp(-(gamma mod 1)) by Algorithm 1
    live = np.flatnonzero(out & (frac > 0))
    num = frac[live]
    k = 1
    while live.size:
        a = _uniform_below(gen, d, live.size) < num
        if k > 1:
            a &= _uniform_below(gen, k, live.size) == 0
        stop = ~a
        out[live[stop]] = k % 2 == 1
        live, num = live[a], num[a]
        k += 1
    return out


def bernoulli_exp_scalar(gen: np.random.Generator, n: int, d: int) -> bool:
    """One ``Bernoulli(exp(-n / d))`` for Python integers ``n >= 0`` of any size, ``d <= 2**62``."""
    whole, frac = divmod(int(n), int(d))
    for _ in range(whole):  # ends at the first failure: a few trials on average
        if not _bernoulli_exp1(gen, 1)[0]:
            return False
    return bool(bernoulli_exp(gen, np.array([frac], dtype=np.int64), d)[0])


def _geometric_exp1(gen: np.random.Generator, size: int) -> np.ndarray:
    """Number of successes before the first failure of ``Bernoulli(exp(-1))`` trials."""
    v = np.zeros(size, dtype=np.int64)
    live = np.arange(size)
    while live.size:
        a = _bernoulli_exp1(gen, live.size)
        v[live[a]] += 1
        live = live[a]
    return v


def _dlap_batch(gen: np.random.Generator, t: int, s: int, size: int) -> np.ndarray:
    """One round of CKS Algorithm 2 on ``size`` candidates; rejected ones are absent."""
    u = _uniform_below(gen, t, size)
    keep = bernoulli_exp(gen, u, t)
    u = u[keep]
    v = _geometric_exp1(gen, u.size)
    x = u + t * v
    y = x // s
    b = _uniform_below(gen, 2, y.size) == 1
    ok = ~(b & (y == 0))
    y, b = y[ok], b[ok]
    out: np.ndarray = np.where(b, -y, y)
    return out


def discrete_laplace_cks(
    gen: np.random.Generator, scale: float | Fraction, size: int
) -> np.ndarray:
    """Exact discrete Laplace, ``P(y) ∝ exp(-|y| / scale)`` (CKS Algorithm 2), int64.

    ``scale = t / s`` in lowest terms; needs ``t < 2**62`` and ``t * 64 < 2**62``.
    """
    r = as_rational(scale, "discrete Laplace scale")
    t, s = r.numerator, r.denominator
    if t * 64 >= _LIMIT:
        raise PlanError(f"scale {r} is too large for the exact int64 sampler")
    size = int(size)
    out = np.empty(size, dtype=np.int64)
    have = 0
    while have < size:
        want = size - have
        got = _dlap_batch(gen, t, s, min(1 << 16, int(want * 1.8) + 16))
        take = min(want, got.size)
        out[have : have + take] = got[:take]
        have += take
    return out


def discrete_gaussian_cks(
    gen: np.random.Generator, sigma2: float | Fraction, size: int
) -> np.ndarray:
    """Exact discrete Gaussian ``N_Z(0, sigma2)`` (CKS Algorithm 3), int64.

    ``sigma2`` is the *variance parameter* ``sigma**2 = p / q`` (exact rational).
    Needs ``2 p q T**2 < 2**62`` with ``T = floor(sigma) + 1``.
    """
    s2 = as_rational(sigma2, "discrete Gaussian sigma**2")
    p, q = s2.numerator, s2.denominator
    T = math.isqrt(p // q) + 1  # floor(sigma) + 1
    d = 2 * p * q * T * T
    if d >= _LIMIT or p * 64 >= _LIMIT:
        raise PlanError(f"sigma**2 = {s2} is too large for the exact int64 sampler")
    size = int(size)
    out = np.empty(size, dtype=np.int64)
    have = 0
    while have < size:
        want = size - have
        y = _dlap_batch(gen, T, 1, min(1 << 16, int(want * 3.5) + 16))
        a = np.abs(y) * (q * T) - p  # |Y| q T - p; |Y| < 2**40 with overwhelming probability
        big = np.abs(a) > 3_000_000_000  # a**2 would not fit in int64
        n = np.zeros(y.size, dtype=np.int64)
        n[~big] = a[~big] * a[~big]
        keep = np.zeros(y.size, dtype=bool)
        keep[~big] = bernoulli_exp(gen, n[~big], d)
        for i in np.flatnonzero(big):  # exact, with Python integers (astronomically rare)
            keep[i] = bernoulli_exp_scalar(gen, int(a[i]) ** 2, d)
        got = y[keep]
        take = min(want, got.size)
        out[have : have + take] = got[:take]
        have += take
    return out
