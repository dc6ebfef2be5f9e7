"""Exact discrete samplers: goodness of fit against the exact pmf, with power.

Oracle: the pmf ``P(y) ∝ exp(-y**2 / (2 sigma**2))`` (or ``exp(-|y| / t)``) computed
directly in double precision over the whole reachable support (independent of the
samplers' interval arithmetic), binned into cells of roughly equal probability.
Each test draws ``N`` values, accepts at alpha = 1e-6 (chi-square) and must reject
the same draws against the pmf at 0.9x and 1.1x the scale.

Draw counts: 10**7 for the table samplers (the production path, about half a
second each); 2 * 10**6 for CKS's Bernoulli-factory samplers (the reference, a few
million per second), which still gives power against 0.9x and 1.1x.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpdask.noise import KeyedRNG, _exact, _table

ALPHA = 1e-6
N_TABLE = 10_000_000
N_CKS = 2_000_000


def _gen(name: str) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=abs(hash(("exact-samplers", name))) % 2**64))


def _pmf(family: str, scale: float, lo: int, hi: int) -> np.ndarray:
    y = np.arange(lo, hi + 1, dtype=float)
    if family == "gauss":
        w = np.exp(-(y**2) / (2.0 * scale * scale))
    else:
        w = np.exp(-np.abs(y) / scale)
    return w / w.sum()


def _bins(p: np.ndarray, n: int, cells: int = 400) -> np.ndarray:
    """Bin edges (indices into the support) with expected counts of at least ~n/cells."""
    cdf = np.cumsum(p)
    cuts = np.searchsorted(cdf, np.linspace(0, 1, cells + 1)[1:-1])
    return np.unique(cuts)


def _chi2_p(sample: np.ndarray, family: str, scale: float, lo: int, hi: int, edges) -> float:
    p = _pmf(family, scale, lo, hi)
    idx = np.clip(sample - lo, 0, hi - lo)
    observed = np.bincount(np.searchsorted(edges, idx, side="left"), minlength=edges.size + 1)
    cell_p = np.add.reduceat(p, np.concatenate([[0], edges + 1]))
    expected = cell_p * sample.size
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return float(stats.chi2.sf(stat, keep.sum() - 1))


def _check_fit(sample: np.ndarray, family: str, scale: float) -> None:
    width = 45 * scale if family == "gauss" else 60 * scale
    lo, hi = -math.ceil(width) - 5, math.ceil(width) + 5
    assert np.abs(sample).max() < hi
    edges = _bins(_pmf(family, scale, lo, hi), sample.size)
    assert _chi2_p(sample, family, scale, lo, hi, edges) > ALPHA
    for wrong in (0.9, 1.1):
        assert _chi2_p(sample, family, wrong * scale, lo, hi, edges) < ALPHA, wrong


@pytest.mark.parametrize("sigma", [0.5, 3.0, 100.0, 1e4])
def test_table_discrete_gaussian_fits_exact_pmf(sigma):
    assert (sigma > _table.GAUSS_DIRECT) == (sigma == 1e4)  # one case on the block path
    y = _table.discrete_gaussian_table(_gen(f"g{sigma}"), sigma, N_TABLE)
    _check_fit(y, "gauss", sigma)


@pytest.mark.parametrize("scale", [0.7, 10.0, 1000.0])
def test_table_discrete_laplace_fits_exact_pmf(scale):
    y = _table.discrete_laplace_table(_gen(f"l{scale}"), scale, N_TABLE)
    _check_fit(y, "laplace", scale)


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), 9, Fraction(10_000, 3)])
def test_cks_discrete_gaussian_fits_exact_pmf(sigma2):
    y = _exact.discrete_gaussian_cks(_gen(f"cg{sigma2}"), sigma2, N_CKS)
    _check_fit(y, "gauss", math.sqrt(sigma2))


@pytest.mark.parametrize("scale", [Fraction(3, 2), 10, 1000])
def test_cks_discrete_laplace_fits_exact_pmf(scale):
    y = _exact.discrete_laplace_cks(_gen(f"cl{scale}"), scale, N_CKS)
    _check_fit(y, "laplace", float(scale))


@pytest.mark.parametrize("n, d", [(0, 1), (1, 3), (2, 3), (1, 1), (7, 2), (13, 5)])
def test_bernoulli_exp_frequency(n, d):
    size = 1_000_000
    hits = int(_exact.bernoulli_exp(_gen(f"b{n}/{d}"), np.full(size, n), d).sum())
    p = math.exp(-n / d)
    assert stats.binomtest(hits, size, p).pvalue > ALPHA
    for wrong in (0.9 * p, min(1.0, 1.1 * p)):
        if 0 < p < 1:
            assert stats.binomtest(hits, size, wrong).pvalue < ALPHA


def test_bernoulli_exp_scalar_handles_huge_numerators():
    gen = _gen("scalar")
    assert not any(_exact.bernoulli_exp_scalar(gen, 10**30, 7) for _ in range(50))
    d = 10**18
    hits = sum(_exact.bernoulli_exp_scalar(gen, d + 1, d) for _ in range(4000))
    assert stats.binomtest(hits, 4000, math.exp(-1 - 1e-18)).pvalue > ALPHA


def test_table_entries_are_exact_floors():
    """T[k] = floor(G(k) 2**63) against the closed form of the discrete Laplace CDF.

    For scale t, q = exp(-1/t): P(|Y| <= k) = 1 - 2 q**(k+1) / (1 + q), computed at
    80 digits independently of the table's interval arithmetic."""
    t = Fraction(3, 2)
    tab = _table.MagnitudeTable("laplace", t, folded=False)
    ctx = Context(prec=80)
    q = ctx.exp(Decimal(-1) / Decimal("1.5"))
    for k in range(tab.table.size):
        g = 1 - 2 * ctx.power(q, k + 1) / (1 + q)
        assert int(tab.table[k]) == int(ctx.multiply(g, Decimal(2**63)))
    assert int(tab.table[-1]) == 2**63 - 1


@pytest.mark.parametrize("family, param", [("gauss", Fraction(9)), ("laplace", Fraction(2))])
def test_exact_resolution_of_undecided_draws(monkeypatch, family, param):
    """With an 8-bit prefix most draws are undecided by the table and resolved by
    extending U word by word; the magnitudes must still have exactly the right law."""
    tab = _table.MagnitudeTable(family, param, folded=False, bits=8)
    calls = []
    resolve = tab._resolve
    monkeypatch.setattr(tab, "_resolve", lambda *a: calls.append(1) or resolve(*a))
    gen = _gen(f"resolve-{family}")
    mag, neg = tab.draw(gen, 200_000)
    assert len(calls) > 5_000
    y = np.where(neg & (mag > 0), -mag, mag)
    keep = ~(neg & (mag == 0)) | True
    scale = math.sqrt(param) if family == "gauss" else float(param)
    _check_fit(y[keep], family, scale)


def test_large_scales_round_up_never_down():
    s, c = _table.block_parameter("gauss", 2.0**21 * 3.7)
    assert c > 1 and s >= Fraction(2.0**21 * 3.7) and s - Fraction(2.0**21 * 3.7) < s * 2**-28
    assert (s * s).numerator < 2**60
    s, c = _table.block_parameter("gauss", 100.0)
    assert (s, c) == (Fraction(100), 1)
    with pytest.raises(ValueError):
        _table.block_parameter("gauss", 2.0**31)


def test_keyed_streams_reproduce_and_accept_rationals():
    a = KeyedRNG.for_testing(1, "x").discrete_gaussian(Fraction(7, 3), 1000)
    b = KeyedRNG.for_testing(1, "x").discrete_gaussian(Fraction(7, 3), 1000)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.int64
    big = KeyedRNG.for_testing(1, "y").discrete_gaussian(2.0**29, 100_000)
    assert 0.98 < big.std() / 2.0**29 < 1.02


@pytest.mark.parametrize("scale", [1 / 33, 1e-4, 1e-9, 1e-300])
def test_tiny_scales_draw_almost_always_zero(scale) -> None:
    """Below 1/32 the CKS samplers draw (a table of exp(-1/scale) would take minutes);
    the scale is rounded up, never down, so the noise is at least as large."""
    rng = KeyedRNG.for_testing(3, ("tiny",))
    lap = rng.discrete_laplace(scale, 100_000)
    gauss = rng.discrete_gaussian(scale, 100_000)
    # P(Y != 0) <= 2 exp(-1/scale') for the Laplace at the rounded scale (<= 1/32 + 2^-40)
    assert np.count_nonzero(lap) <= 5 and np.count_nonzero(gauss) <= 5
