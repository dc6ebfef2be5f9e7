"""Fast exact discrete Laplace and discrete Gaussian samplers: inversion tables.

These are the production samplers of dpdask. They are *exact*: the law of every
drawn value is exactly the discrete Laplace or discrete Gaussian law of the
requested rational parameter (total variation distance 0, in particular below
``2**-100``), assuming, as every sampler must, that the keyed Philox stream's
64-bit words are uniform. So a measurement drawn with them has exactly the
guarantee of the exact mechanism: ``PureDP(D1 / b)`` for the discrete Laplace,
``zCDP(D2**2 / (2 sigma**2))`` for the discrete Gaussian (CKS Theorem 14), and
whatever an (epsilon, delta) budget derives from those. All budget types
(PureDP, zCDP, ApproxDP) use these samplers; no delta is added for them.

The table
---------
Let ``v(0), v(1), ...`` be positive weights of a law on ``{0, 1, 2, ...}``,
``S = sum v``, and ``G(k) = (v(0) + ... + v(k)) / S`` its CDF. Inversion returns
the least ``k`` with ``U < G(k)`` for a uniform real ``U`` in ``[0, 1)``, which has
exactly the law ``v / S``. We draw the first ``B = 63`` bits of ``U`` as an integer
``u`` (the top bits of one 64-bit word; the lowest bit of the word is the sign), so
``U`` lies in ``[u, u + 1) / 2**B``, and keep the table ``T[k] = floor(G(k) 2**B)``
for ``k <= K``. Then, exactly:

* ``T[k] < u`` implies ``G(k) < (T[k] + 1) / 2**B <= U``: ``k`` is too small;
* ``T[k] > u`` implies ``G(k) >= T[k] / 2**B >= (u + 1) / 2**B > U``.

So if ``j`` is the first index with ``T[j] >= u`` (found from a guide table of
the first index of each of 4096 buckets of ``u``, then a few linear steps, or
``numpy.searchsorted`` in crowded buckets) and
``T[j] > u``, the answer is ``j``, decided with integer comparisons only. Otherwise
(``T[j] = u``, or ``u`` beyond the table) the draw is *resolved exactly*: further
64-bit words of ``U`` are drawn one at a time and compared with ``G(j), G(j+1),
...`` bounded at ever higher precision until each comparison is decided (it is,
with probability one, since ``G(k)`` is irrational). That happens with
probability below ``(K + 2) / 2**B`` per draw (about ``1e-15`` for the tables used
here) and costs a fraction of a second in pure Python, so it does not affect
throughput; tests force it with a small ``B``.

Exactness of ``T`` itself: the weights are computed in :mod:`decimal` with
directed rounding (``ROUND_FLOOR`` for lower bounds, ``ROUND_CEILING`` for upper
bounds; ``exp`` is correctly rounded and widened by one unit in the last place),
giving for each ``k`` an interval ``[G_lo(k), G_hi(k)]`` that contains ``G(k)``;
``T[k]`` is accepted only where ``floor(G_lo 2**B) = floor(G_hi 2**B)``, and the
table is recomputed at twice the precision otherwise. The infinite tail is
bounded analytically: with ``w(m + 1) = w(m) g_m`` and ``g_m`` non-increasing
(``g_m = exp(-(2m + 1) / (2 sigma**2))`` for the Gaussian, ``exp(-1/t)`` for the
Laplace), ``sum_{j > m} w(j) <= w(m + 1) / (1 - g_{m+1})``. The sums run until the tail
is below ``10**-(P - 10)`` of the mass at precision ``P`` (50 digits at first), and
the table stops at the first ``K`` with ``T[K] = 2**B - 1`` (so its tail is below
``2**-B``).

Large scales: blocks
--------------------
A direct table needs about ``9.3 sigma`` (Gaussian) or ``44 t`` (Laplace) entries.
Beyond ``sigma = 256`` (``t = 64``) the magnitude ``M = |Y|`` is drawn in blocks
of ``c = 2**j`` integers: ``M = c Q + R`` with ``Q`` from the table of the weights
``w(c Q)`` (a discrete Gaussian of parameter ``sigma / c``, a discrete Laplace of
scale ``t / c``), ``R`` uniform in ``{0, ..., c - 1}``, accepted with probability
``w(c Q + R) / w(c Q) = exp(-gamma)``, ``gamma = R (2 c Q + R) / (2 sigma**2)``
(Gaussian) or ``R / t`` (Laplace), by the exact :func:`~dpdask.noise._exact.bernoulli_exp`.
An accepted ``M`` has law ``∝ w(M)``; a uniform sign is attached and the pair
``(M = 0, negative)`` rejected, which leaves ``P(Y = y) ∝ w(|y|)`` on all of the
integers. Acceptance is above 0.99 (Gaussian) and 0.98 (Laplace) at these block
sizes, and the tables (below 3,000 entries) stay in the processor's cache, which
makes the block path faster than a direct table at large scales. The Bernoulli needs
``sigma**2`` (or ``t``) as a fraction with a numerator below ``2**60``: a float or
rational parameter that does not fit is rounded *up* to the nearest multiple of
``2**-j`` for the largest ``j`` that fits (never less noise than asked; the
relative change is below ``2**-28``). :func:`block_parameter` returns the
parameter actually sampled.
"""

from __future__ import annotations

import functools
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from typing import TypeAlias

import numpy as np

from dpdask.errors import ArgumentError, PlanError
from dpdask.noise._exact import as_rational, bernoulli_exp, bernoulli_exp_scalar

__all__ = [
    "GAUSS_DIRECT",
    "LAPLACE_DIRECT",
    "MAX_TABLE_SCALE",
    "MagnitudeTable",
    "block_parameter",
    "discrete_gaussian_table",
    "discrete_laplace_table",
    "magnitude_table",
]

GAUSS_DIRECT = 256  # largest sigma with a direct table
LAPLACE_DIRECT = 64  # largest scale with a direct table
MAX_TABLE_SCALE = 2.0**30  # largest parameter accepted (the block Bernoulli's integers)
_BLOCK = 1 << 16
_GUIDE_BITS = 12  # buckets of the guide table
_GUIDE_STEPS = 3  # linear steps in a bucket before falling back to binary search

# the cumulative bounds N_lo, N_hi and the total's bounds S_lo, S_hi (MagnitudeTable._chains)
_Chains: TypeAlias = tuple[list[Decimal], list[Decimal], Decimal, Decimal]


def _contexts(prec: int) -> tuple[Context, Context]:
    """Contexts rounding down and up at ``prec`` digits (interval arithmetic)."""
    return Context(prec=prec, rounding=ROUND_FLOOR), Context(prec=prec, rounding=ROUND_CEILING)


class MagnitudeTable:
    """Exact inversion table of ``v(m) ∝ w(m)`` on ``{0, 1, ...}`` (see the module notes).

    Parameters
    ----------
    family : {"gauss", "laplace"}
        ``w(m) = exp(-m**2 / (2 param))`` (``param = sigma**2``) or
        ``w(m) = exp(-m / param)`` (``param = t``).
    param : Fraction
        ``sigma**2`` or the Laplace scale ``t``, exact.
    folded : bool
        ``v = w`` when true; ``v(0) = w(0)``, ``v(m) = 2 w(m)`` otherwise (the law of
        ``|Y|`` for a symmetric ``Y``).
    bits : int
        Prefix bits ``B`` of ``U`` searched in the table (63 in production; tests use
        fewer to exercise the exact resolution).
    """

    def __init__(self, family: str, param: Fraction, folded: bool, bits: int = 63):
        if family not in ("gauss", "laplace"):
            raise ArgumentError(f"unknown family {family!r}")
        if not 1 <= bits <= 63:
            raise ArgumentError("bits must be in [1, 63]")
        self.family, self.param, self.folded, self.bits = family, Fraction(param), folded, bits
        prec = 50
        while True:
            table = self._build(prec)
            if table is not None:
                break
            prec *= 2
        self.table = table
        # guide table: _guide[j] is the first index with T >= j 2**shift, so the answer
        # for a prefix u in bucket j = u >> shift lies in [_guide[j], _guide[j + 1]]
        self._shift = np.uint64(max(0, bits - _GUIDE_BITS))
        starts = np.arange(2 ** min(bits, _GUIDE_BITS) + 1, dtype=np.uint64) << self._shift
        starts[-1] = np.uint64(2**64 - 1) if bits == 64 else np.uint64(2**bits)
        self._guide = np.searchsorted(table, starts, side="left").astype(np.int64)
        self._precise: dict[int, _Chains] = {}

    # -- interval arithmetic -------------------------------------------------
    def _factors(self, prec: int) -> tuple[tuple[Decimal, Decimal], tuple[Decimal, Decimal]]:
        """Bounds on ``g_0`` and on the ratio ``g_{m+1} / g_m`` (1 for the Laplace)."""
        lo, hi = _contexts(prec)
        x = 1 / (2 * self.param) if self.family == "gauss" else 1 / self.param
        num, den = Decimal(x.numerator), Decimal(x.denominator)
        x_lo, x_hi = lo.divide(num, den), hi.divide(num, den)
        # exp is correctly rounded: one unit in the last place each way bounds it
        g_hi = hi.next_plus(hi.exp(-x_lo))
        g_lo = lo.next_minus(lo.exp(-x_hi))
        if self.family == "gauss":  # g_m = a b**m with a = exp(-x), b = a**2
            return (g_lo, g_hi), (lo.multiply(g_lo, g_lo), hi.multiply(g_hi, g_hi))
        return (g_lo, g_hi), (Decimal(1), Decimal(1))

    def _chains(self, prec: int, tail_digits: float, min_len: int = 0) -> _Chains:
        """Cumulative weight bounds ``N_lo[k] <= v(0) + ... + v(k) <= N_hi[k]`` up to the
        first ``K >= min_len`` whose tail is below ``10**-tail_digits`` of the mass, and
        bounds ``S_lo <= S <= S_hi`` on the total."""
        lo, hi = _contexts(prec)
        (g_lo, g_hi), (r_lo, r_hi) = self._factors(prec)
        two = Decimal(1) if self.folded else Decimal(2)
        w_lo = w_hi = Decimal(1)
        n_lo, n_hi = [Decimal(1)], [Decimal(1)]
        eps = Decimal(10) ** Decimal(-tail_digits)
        m = 0
        while True:
            # w(m + 1) = w(m) g_m ; g_{m+1} = g_m r
            w_lo, w_hi = lo.multiply(w_lo, g_lo), hi.multiply(w_hi, g_hi)
            g_lo, g_hi = lo.multiply(g_lo, r_lo), hi.multiply(g_hi, r_hi)
            v_lo, v_hi = lo.multiply(two, w_lo), hi.multiply(two, w_hi)  # v(m + 1)
            # tail after m: sum_{j > m} v(j) <= v(m + 1) / (1 - g_{m+1})
            if g_hi < 1 and m + 1 > min_len:
                tail_hi = hi.divide(v_hi, lo.subtract(Decimal(1), g_hi))
                if tail_hi < lo.multiply(n_lo[-1], eps):
                    s_lo = lo.add(n_lo[-1], v_lo)
                    s_hi = hi.add(n_hi[-1], tail_hi)
                    return n_lo, n_hi, s_lo, s_hi
            n_lo.append(lo.add(n_lo[-1], v_lo))
            n_hi.append(hi.add(n_hi[-1], v_hi))
            m += 1
            if m > 1 << 26:  # pragma: no cover - parameters are bounded far below
                raise PlanError("distribution too wide for a table")

    def _build(self, prec: int) -> np.ndarray | None:
        n_lo, n_hi, s_lo, s_hi = self._chains(prec, prec - 10)
        lo, hi = _contexts(prec)
        scale = Decimal(2**self.bits)
        top = 2**self.bits - 1
        out = np.empty(len(n_lo), dtype=np.uint64)
        for k, (a, b) in enumerate(zip(n_lo, n_hi, strict=True)):
            t_lo = int(lo.multiply(lo.divide(a, s_hi), scale).to_integral_value(ROUND_FLOOR))
            t_hi = int(hi.multiply(hi.divide(b, s_lo), scale).to_integral_value(ROUND_FLOOR))
            if t_lo != t_hi:
                return None  # undecided at this precision
            out[k] = t_lo
            if t_lo == top:  # every later entry is `top` too: the resolution handles them
                return out[: k + 1].copy()
        return out

    def _cdf_bounds(self, k: int, bits: int) -> tuple[Fraction, Fraction]:
        """``G_lo <= G(k) <= G_hi`` with ``G_hi - G_lo`` well below ``2**-bits``."""
        prec = int(bits * math.log10(2)) + 30
        prec = 1 << max(6, (prec - 1).bit_length())  # cache by powers of two
        got = self._precise.get(prec)
        if got is None or len(got[0]) <= k:
            got = self._chains(prec, prec - 10, min_len=k + 1)
            self._precise[prec] = got
        n_lo, n_hi, s_lo, s_hi = got
        return Fraction(n_lo[k]) / Fraction(s_hi), Fraction(n_hi[k]) / Fraction(s_lo)

    def _resolve(self, gen: np.random.Generator, u: int, k: int) -> int:
        """The least ``k' >= k`` with ``U < G(k')`` for ``U`` in ``[u, u + 1) / 2**B``, exactly."""
        T, B = self.table, self.bits
        v, extra = 0, 0  # U = (u + (v + V') / 2**extra) / 2**B, V' uniform in [0, 1)
        while True:
            if k < T.size and int(T[k]) > u:
                return k
            while True:
                width = B + extra
                lo_u = Fraction((u << extra) + v, 1 << width)
                hi_u = lo_u + Fraction(1, 1 << width)
                g_lo, g_hi = self._cdf_bounds(k, width + 16)
                if hi_u <= g_lo:
                    return k
                if lo_u >= g_hi:
                    k += 1
                    break
                word = int(gen.integers(0, 2**64, dtype=np.uint64))
                v, extra = (v << 64) | word, extra + 64

    def invert(self, gen: np.random.Generator, u: np.ndarray) -> np.ndarray:
        """Magnitudes for the ``B``-bit prefixes ``u`` (uint64), int64."""
        T = self.table
        b = (u >> self._shift).astype(np.int64)
        idx, hi = self._guide[b], self._guide[b + 1]
        for _ in range(_GUIDE_STEPS):  # buckets hold at most a few entries, mostly
            step = (idx < hi) & (T[np.minimum(idx, T.size - 1)] < u)
            idx += step
        rest = np.flatnonzero((idx < hi) & (T[np.minimum(idx, T.size - 1)] < u))
        if rest.size:  # crowded buckets (the far tails): binary search
            idx[rest] = np.searchsorted(T, u[rest], side="left")
        clipped = np.minimum(idx, T.size - 1)
        amb = np.flatnonzero((idx == T.size) | (T[clipped] == u))
        out = idx.astype(np.int64)
        for i in amb:  # exact resolution, in stream order (probability ~ K / 2**B each)
            out[i] = self._resolve(gen, int(u[i]), int(idx[i]))
        return out

    def draw(self, gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` magnitudes of law ``v / S`` and ``n`` independent uniform signs (bool)."""
        words = gen.integers(0, 2**64, size=n, dtype=np.uint64)
        neg = (words & np.uint64(1)).astype(bool)
        words >>= np.uint64(64 - self.bits)
        return self.invert(gen, words), neg


@functools.lru_cache(maxsize=64)
def magnitude_table(family: str, param: Fraction, folded: bool, bits: int = 63) -> MagnitudeTable:
    """The cached :class:`MagnitudeTable` of these parameters (built once per process)."""
    return MagnitudeTable(family, param, folded, bits)


def _fit(value: Fraction, square: bool) -> Fraction:
    """``value`` or the least multiple of ``2**-j`` above it whose (squared) numerator
    fits the block Bernoulli (below ``2**60``), for the largest such ``j``."""
    num = (value * value if square else value).numerator
    if num < 1 << 60:
        return value
    for j in range(64, -1, -1):
        r = Fraction(math.ceil(value * 2**j), 2**j)
        if (r * r if square else r).numerator < 1 << 60:
            return r
    raise PlanError(f"parameter {value} is too large")  # pragma: no cover


def block_parameter(family: str, scale: float | Fraction) -> tuple[Fraction, int]:
    """The exact parameter sampled for ``scale`` (``sigma`` or ``t``) and the block size ``c``.

    ``c = 1`` (a direct table, the parameter unchanged) up to ``GAUSS_DIRECT`` /
    ``LAPLACE_DIRECT``; beyond, ``c = 2**j`` and the parameter possibly rounded up
    (module notes).
    """
    s = as_rational(scale, "noise scale")
    if s > MAX_TABLE_SCALE:
        raise PlanError(f"noise scale {float(s):g} exceeds {MAX_TABLE_SCALE:g}")
    limit = GAUSS_DIRECT if family == "gauss" else LAPLACE_DIRECT
    if s <= limit:
        return s, 1
    c = 1 << math.ceil(math.log2(s / limit))
    while s / c > limit:  # guard against rounding in log2
        c <<= 1
    return _fit(s, family == "gauss"), c


def _signed(mag: np.ndarray, neg: np.ndarray) -> np.ndarray:
    np.negative(mag, out=mag, where=neg)
    return mag


def _block_draw(gen: np.random.Generator, family: str, s: Fraction, c: int, n: int) -> np.ndarray:
    """About ``n`` accepted values (possibly fewer) of the block sampler."""
    if family == "gauss":
        tab = magnitude_table("gauss", s * s / (c * c), True)
    else:
        tab = magnitude_table("laplace", s / c, True)
    q, neg = tab.draw(gen, n)
    r = gen.integers(0, c, size=n, dtype=np.int64)
    if family == "gauss":  # gamma = R (2 c Q + R) / (2 sigma**2) = R (2 c Q + R) qd / (2 p)
        s2 = s * s
        den = 2 * s2.numerator
        big = q > math.floor(64 * s / c)  # |Y| > 64 sigma: probability below exp(-2000)
        qs = np.where(big, 0, q)
        num = r * (2 * c * qs + r) * s2.denominator  # below 2**59 (module notes)
        keep = bernoulli_exp(gen, num, den)
        for i in np.flatnonzero(big):  # pragma: no cover - exact, with Python integers
            ri, qi = int(r[i]), int(q[i])
            keep[i] = bernoulli_exp_scalar(gen, ri * (2 * c * qi + ri) * s2.denominator, den)
    else:  # gamma = R / t = R b / a
        keep = bernoulli_exp(gen, r * s.denominator, s.numerator)
    mag = c * q + r
    keep &= ~((mag == 0) & neg)
    return _signed(mag[keep], neg[keep])


def _sample(gen: np.random.Generator, family: str, scale: float | Fraction, n: int) -> np.ndarray:
    s, c = block_parameter(family, scale)
    out = np.empty(n, dtype=np.int64)
    if c == 1:
        param = s * s if family == "gauss" else s
        tab = magnitude_table(family, param, False)
        for start in range(0, n, _BLOCK):
            stop = min(n, start + _BLOCK)
            mag, neg = tab.draw(gen, stop - start)
            out[start:stop] = _signed(mag, neg)
        return out
    have = 0
    while have < n:
        want = n - have
        got = _block_draw(gen, family, s, c, min(_BLOCK, int(want * 1.01) + 16))
        take = min(want, got.size)
        out[have : have + take] = got[:take]
        have += take
    return out


def discrete_gaussian_table(
    gen: np.random.Generator, sigma: float | Fraction, n: int
) -> np.ndarray:
    """``n`` exact draws of ``N_Z(0, sigma**2)``, ``P(y) ∝ exp(-y**2 / (2 sigma**2))`` (int64).

    ``sigma`` is an exact rational (a float is converted exactly); above
    ``GAUSS_DIRECT`` it may be rounded up (:func:`block_parameter`).
    """
    return _sample(gen, "gauss", sigma, int(n))


def discrete_laplace_table(gen: np.random.Generator, scale: float | Fraction, n: int) -> np.ndarray:
    """``n`` exact draws of the discrete Laplace law ``P(y) ∝ exp(-|y| / scale)`` (int64)."""
    return _sample(gen, "laplace", scale, int(n))
