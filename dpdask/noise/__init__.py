"""Keyed, reproducible noise: secret keys, measurement identities and samplers.

A measurement's noise is determined by a secret key (:func:`new_key`) and the
measurement's identity through a counter-based generator (:class:`KeyedRNG`),
so recomputing or retrying a task draws the same numbers. Tasks receive only
the :class:`StreamKey` of the stream they draw (:meth:`SecretKey.stream_key`),
never the secret key. Samplers: Laplace and
Gaussian on floats, discrete Laplace and discrete Gaussian on integers
(Canonne, Kamath and Steinke 2020; see :mod:`dpdask.noise._samplers` for what
"exact" means here), and correlated Gaussian noise from a covariance factor.
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
