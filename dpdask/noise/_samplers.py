"""Noise samplers on a numpy ``Generator``: exact discrete, and unsafe floating point.

All samplers are vectorised and deterministic functions of the generator's
stream, the parameters and the requested shape.

Production samplers (exact)
---------------------------
:func:`discrete_laplace` (``P(y) ∝ exp(-|y| / t)``) and :func:`discrete_gaussian`
(``P(y) ∝ exp(-y**2 / (2 sigma**2))``, Canonne, Kamath and Steinke 2020, "CKS")
draw *exactly* the law of their exact rational parameter (a float is converted
exactly; above the direct-table range the parameter may be rounded up, never
down, see :func:`dpdask.noise._table.block_parameter`). They use inversion tables
decided by integer comparisons of uniform 64-bit words, with an exact resolution
of the rare undecided draws (:mod:`dpdask.noise._table`, where the proof is), so
their total variation distance from the exact law is zero, and a measurement
drawn with them has exactly the mechanism's guarantee: ``PureDP(D1 / t)`` for the
discrete Laplace, ``zCDP(D2**2 / (2 sigma**2))`` for the discrete Gaussian (CKS
Theorem 14), and what an (epsilon, delta) budget derives from those. PureDP,
zCDP and ApproxDP budgets all use these samplers; no delta is added for them.
CKS's own algorithms (Bernoulli factories on integers) are in
:mod:`dpdask.noise._exact` as the reference.

Unsafe floating-point samplers
------------------------------
:func:`laplace`, :func:`gaussian` and :func:`correlated_gaussian` are the
textbook floating-point mechanisms. Their outputs ``x + noise`` are not private
as floating-point numbers (Mironov 2012: the set of reachable doubles depends on
``x``, so some outputs are impossible under a neighbour). They run only with an
explicit ``unsafe_float=True`` (benchmarks and experiments) and no release path
calls them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import SupportsFloat

import numpy as np
import numpy.typing as npt

from dpdask.errors import ArgumentError, ArgumentTypeError, PlanError
from dpdask.linalg import LinearQuery, aslinearquery
from dpdask.noise import _exact, _table

__all__ = [
    "correlated_gaussian",
    "discrete_gaussian",
    "discrete_laplace",
    "gaussian",
    "laplace",
]

# Largest scale accepted by the discrete samplers.
MAX_DISCRETE_SCALE = _table.MAX_TABLE_SCALE


def as_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    """Validate a sample shape: a non-negative int or a sequence of them."""
    items = (shape,) if isinstance(shape, int | np.integer) else shape
    if isinstance(items, str | bytes) or not isinstance(items, Sequence | np.ndarray):
        raise ArgumentTypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in items):
        raise ArgumentTypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    out = tuple(int(s) for s in items)
    if any(s < 0 for s in out):
        raise ArgumentError(f"shape must have non-negative entries, got {shape!r}")
    return out


def check_scale(scale: SupportsFloat, name: str, upper: float = math.inf) -> float:
    """A positive, finite noise scale (below ``upper``) as a float, else ``ValueError``."""
    if isinstance(scale, bool):
        raise ArgumentTypeError(f"{name} must be a number, not a boolean")
    value = float(scale)
    if not (math.isfinite(value) and 0.0 < value <= upper):
        raise PlanError(f"{name} must be positive and finite (at most {upper:g}), got {scale!r}")
    return value


def laplace(
    gen: np.random.Generator,
    scale: float,
    shape: int | Sequence[int],
    *,
    unsafe_float: bool = False,
) -> np.ndarray:
    """Laplace noise with density ``exp(-|y| / scale) / (2 scale)`` (float64; unsafe)."""
    _check_unsafe(unsafe_float, "laplace")
    b = check_scale(scale, "Laplace scale")
    return gen.laplace(0.0, b, as_shape(shape))


def gaussian(
    gen: np.random.Generator,
    sigma: float,
    shape: int | Sequence[int],
    *,
    unsafe_float: bool = False,
) -> np.ndarray:
    """Gaussian noise ``N(0, sigma**2)`` (float64; unsafe)."""
    _check_unsafe(unsafe_float, "gaussian")
    s = check_scale(sigma, "Gaussian sigma")
    return s * gen.standard_normal(as_shape(shape))


def _check_unsafe(unsafe_float: bool, what: str) -> None:
    if unsafe_float is not True:
        raise PlanError(
            f"{what} is a floating-point sampler, not private as floating point (Mironov "
            "2012); pass unsafe_float=True to use it outside a release (benchmarks only)"
        )


# below this scale the exact CKS samplers draw (the values are almost all 0, and the
# table's interval arithmetic on exp(-1/scale) grows slow); both are exact
_SMALL_SCALE = Fraction(1, 32)


def _round_up(q: Fraction, bits: int) -> Fraction:
    """``q`` rounded up to a multiple of ``2**-bits`` (at least one): more noise, never
    less, with a numerator and denominator the int64 samplers take."""
    return Fraction(max(1, math.ceil(q * 2**bits)), 2**bits)


def discrete_laplace(
    gen: np.random.Generator, scale: float | Fraction, shape: int | Sequence[int]
) -> np.ndarray:
    """Exact discrete Laplace noise: ``P(y) ∝ exp(-|y| / scale)`` on the integers (int64).

    Adding it to an integer query of L1 sensitivity ``D`` is ``D / scale``-DP.
    ``scale`` is an exact rational (``Fraction``, int or float converted exactly).
    """
    shp = as_shape(shape)
    t = _exact.as_rational(scale, "discrete Laplace scale")
    if t < _SMALL_SCALE:  # nearly always 0: CKS's loop is fast, a table slow to build
        t = _round_up(t, 40)
        return _exact.discrete_laplace_cks(gen, t, math.prod(shp)).reshape(shp)
    return _table.discrete_laplace_table(gen, scale, math.prod(shp)).reshape(shp)


def discrete_gaussian(
    gen: np.random.Generator, sigma: float | Fraction, shape: int | Sequence[int]
) -> np.ndarray:
    """Exact discrete Gaussian noise ``N_Z(0, sigma**2)`` on the integers (int64).

    Adding it to an integer query of L2 sensitivity ``D`` is ``D**2 / (2 sigma**2)``-zCDP
    (CKS Theorem 14). Its variance is slightly below ``sigma**2``. ``sigma`` is an
    exact rational (``Fraction``, int or float converted exactly).
    """
    shp = as_shape(shape)
    q = _exact.as_rational(sigma, "discrete Gaussian sigma")
    if q < _SMALL_SCALE:
        q = _round_up(q, 10)
        return _exact.discrete_gaussian_cks(gen, q * q, math.prod(shp)).reshape(shp)
    return _table.discrete_gaussian_table(gen, sigma, math.prod(shp)).reshape(shp)


def correlated_gaussian(
    gen: np.random.Generator,
    factor: LinearQuery | npt.ArrayLike,
    shape: int | Sequence[int],
    *,
    unsafe_float: bool = False,
) -> np.ndarray:
    """Correlated Gaussian noise ``N(0, Sigma)`` with ``Sigma = F F^T``.

    Parameters
    ----------
    gen : numpy.random.Generator
        The stream.
    factor : LinearQuery or array_like
        An ``m x k`` factor ``F`` of the covariance (dense, sparse or implicit).
    shape : int or sequence of int
        The batch shape; the result has shape ``(*shape, m)``, e.g. ``(g,)`` for
        one noise vector per geography.
    unsafe_float : bool
        Must be ``True``: floating-point noise (module notes).

    Returns
    -------
    ndarray
        ``F z`` for independent ``z ~ N(0, I_k)``, float64.
    """
    _check_unsafe(unsafe_float, "correlated_gaussian")
    F = factor if isinstance(factor, LinearQuery) else aslinearquery(factor)
    shp = as_shape(shape)
    g = math.prod(shp)
    m, k = F.shape
    z = gen.standard_normal((g, k))
    return np.asarray(F.apply(z), dtype=np.float64).reshape((*shp, m))
