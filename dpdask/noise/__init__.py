"""Keyed, reproducible noise: secret keys, measurement identities and samplers.

A measurement's noise is determined by a secret key (:func:`new_key`) and the
measurement's identity through a counter-based generator (:class:`KeyedRNG`),
so recomputing or retrying a task draws the same numbers. Tasks receive only
the :class:`StreamKey` of the stream they draw (:meth:`SecretKey.stream_key`),
never the secret key. Samplers: exact discrete Laplace and discrete Gaussian
on the integers (Canonne, Kamath and Steinke 2020; fast exact inversion tables,
:mod:`dpdask.noise._table`, with CKS's Bernoulli factories as the reference,
:mod:`dpdask.noise._exact`); floating-point Laplace, Gaussian and correlated
Gaussian noise only with ``unsafe_float=True`` (see :mod:`dpdask.noise._samplers`).
:func:`discrete_laplace_cks` and :func:`discrete_gaussian_cks` are CKS's samplers
themselves (the reference the tables are checked and benchmarked against).
"""

from dpdask.noise._exact import discrete_gaussian_cks, discrete_laplace_cks
from dpdask.noise._grid import (
    DEFAULT_MAX_TOTAL,
    LATTICE_SLACK,
    MAX_GRID_SCALE,
    SENSITIVITY_PAD,
    grid_rule,
    grid_step,
    round_up,
)
from dpdask.noise._keyfile import KeyFile
from dpdask.noise._keys import (
    KEY_BYTES,
    IdentityLike,
    MeasurementId,
    SecretKey,
    StreamKey,
    as_secret_key,
    encode_identity,
    new_key,
)
from dpdask.noise._rng import MECHANISMS, KeyedRNG
from dpdask.noise._table import MAX_TABLE_SCALE
from dpdask.noise._variance import draw_variance

__all__ = [
    "DEFAULT_MAX_TOTAL",
    "KEY_BYTES",
    "LATTICE_SLACK",
    "MAX_GRID_SCALE",
    "MAX_TABLE_SCALE",
    "MECHANISMS",
    "SENSITIVITY_PAD",
    "IdentityLike",
    "KeyFile",
    "KeyedRNG",
    "MeasurementId",
    "SecretKey",
    "StreamKey",
    "as_secret_key",
    "discrete_gaussian_cks",
    "discrete_laplace_cks",
    "draw_variance",
    "encode_identity",
    "grid_rule",
    "grid_step",
    "new_key",
    "round_up",
]
