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
"""

from dpdask.noise._keys import (
    KeyFile,
    MeasurementId,
    SecretKey,
    StreamKey,
    encode_identity,
    new_key,
)
from dpdask.noise._rng import MECHANISMS, KeyedRNG

__all__ = [
    "MECHANISMS",
    "KeyFile",
    "KeyedRNG",
    "MeasurementId",
    "SecretKey",
    "StreamKey",
    "encode_identity",
    "new_key",
]
