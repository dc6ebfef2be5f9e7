"""Vectorised simulation of many people's randomizers (for tests, benchmarks and studies).

:func:`randomize` draws one response per person, exactly from ``counts / denominator``
(integer inverse-CDF sampling over all columns at once); :func:`simulate_counts` draws the
response vector ``y`` of a data vector directly (one multinomial per type). Real
deployments run :mod:`dpdask.ldp.client` on each device instead.

Randomness comes from a keyed Philox stream (:mod:`dpdask.noise`): a
:class:`~dpdask.noise.SecretKey` or :class:`~dpdask.noise.StreamKey` and an identity, so a
simulation is reproducible from its key; tests may pass a seeded
:class:`numpy.random.Generator` instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentTypeError, DataError, DataTypeError
from dpdask.ldp.strategy import LocalStrategy
from dpdask.noise import SecretKey, StreamKey

__all__ = ["generator", "randomize", "simulate_counts"]


def generator(key: Any, identity: Any = ("dpdask.ldp", "simulate")) -> np.random.Generator:
    """A Philox generator from a secret or stream key and an identity (or a Generator as is).

    Raises
    ------
    ArgumentTypeError
        If ``key`` is none of these.
    """
    if isinstance(key, np.random.Generator):
        return key
    if isinstance(key, StreamKey):
        return np.random.Generator(np.random.Philox(key=key.philox_key(identity)))
    if isinstance(key, SecretKey | bytes):
        secret = key if isinstance(key, SecretKey) else SecretKey(key)
        return np.random.Generator(np.random.Philox(key=secret.derive(identity)))
    raise ArgumentTypeError(
        f"key must be a SecretKey, StreamKey or numpy Generator, got {type(key)}"
    )


def _types(types: Any, n: int) -> np.ndarray:
    t = np.asarray(types)
    if t.ndim != 1:
        raise DataError("types must be a 1-D array of type indices")
    if t.size and not np.issubdtype(t.dtype, np.integer):
        raise DataTypeError(f"types must be integers, got {t.dtype}")
    t = t.astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= n):
        raise DataError(f"types must be in 0..{n - 1}")
    return t


def randomize(
    strategy: LocalStrategy,
    types: Any,
    key: Any,
    identity: Any = ("dpdask.ldp", "simulate"),
) -> NDArray[np.int64]:
    """One response per person: ``P(response = o | type u) = counts[o, u] / denominator``.

    Parameters
    ----------
    strategy : LocalStrategy
    types : array of int, shape (N,)
        Each person's type (``0..n-1``).
    key : SecretKey, StreamKey or numpy.random.Generator
        The randomness (see :func:`generator`).
    identity : optional
        The stream's identity (use a different one per simulated batch).

    Returns
    -------
    ndarray of int64, shape (N,)
        Output indices ``0..m-1``.

    Raises
    ------
    ValueError, TypeError
        If a type is out of range or not an integer.
    """
    m, n = strategy.shape
    T = strategy.denominator
    t = _types(types, n)
    rng = generator(key, identity)
    draw = rng.integers(0, T, size=t.size, dtype=np.int64)
    cum = np.cumsum(strategy.counts, axis=0)  # (m, n), last row == T
    if n * T < 2**62:  # one searchsorted over all columns laid end to end
        flat = (cum.T + (np.arange(n, dtype=np.int64) * T)[:, None]).ravel()
        idx = np.searchsorted(flat, t * T + draw, side="right")
        responses: NDArray[np.int64] = idx - t * m
        return responses
    out = np.empty(t.size, dtype=np.int64)  # pragma: no cover - huge domains
    for u in np.unique(t):
        sel = t == u
        out[sel] = np.searchsorted(cum[:, u], draw[sel], side="right")
    return out


def simulate_counts(
    strategy: LocalStrategy,
    x: Any,
    key: Any,
    identity: Any = ("dpdask.ldp", "counts"),
) -> np.ndarray:
    """The response vector ``y`` (length ``m``) of a data vector ``x`` (people per type).

    ``y = sum_u Multinomial(x_u, Q[:, u])``; ``x`` may be ``(n,)`` or ``(g, n)`` (one
    response vector per geography).
    """
    m, n = strategy.shape
    X = np.asarray(x)
    single = X.ndim == 1
    X = np.atleast_2d(X)
    if X.shape[1] != n or (X < 0).any() or not np.issubdtype(X.dtype, np.integer):
        raise DataError(f"x must be non-negative integer counts over {n} types")
    rng = generator(key, identity)
    P = np.array(strategy.Q, dtype=float)
    P /= P.sum(axis=0)
    Y = np.zeros((X.shape[0], m), dtype=np.int64)
    for u in range(n):
        if X[:, u].any():
            Y += rng.multinomial(X[:, u], P[:, u])
    return Y[0] if single else Y
