"""``KeyedRNG``: the noise stream of one measurement, from a secret key and an identity."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from dpdask.errors import ArgumentTypeError, PlanError
from dpdask.linalg import LinearQuery
from dpdask.noise import _samplers
from dpdask.noise._keys import IdentityLike, SecretKey, StreamKey, as_secret_key, encode_identity

__all__ = ["KeyedRNG"]


class KeyedRNG:
    """The noise of one measurement: a Philox stream keyed by (secret key, identity).

    The 128-bit Philox key is a keyed BLAKE2b digest of the canonical encoding of
    ``identity`` (see :func:`dpdask.noise.encode_identity`) under the secret key.
    A fresh ``KeyedRNG`` with the same key and identity reproduces the same
    numbers bit for bit, in any process; successive calls on one instance
    continue the stream.

    Parameters
    ----------
    key : SecretKey, bytes or StreamKey
        The 32-byte secret (see :func:`dpdask.noise.new_key`), or the
        :class:`~dpdask.noise.StreamKey` the secret made for ``identity``
        (:meth:`SecretKey.stream_key`), which gives the same stream.
    identity : str, int, bytes, tuple, mapping or MeasurementId
        What is being measured, e.g. ``MeasurementId(release, level, chunk, name)``.

    Raises
    ------
    dpdask.errors.NoiseKeyError
        If ``key`` is a stream key derived for another identity (a ``ValueError``).

    Attributes
    ----------
    test_only : bool
        True when the key came from :meth:`for_testing`; production entry points
        refuse such streams.

    Examples
    --------
    >>> rng = KeyedRNG.for_testing(7, identity=("r", "county", 0, "A"))
    >>> a = rng.discrete_gaussian(3.0, 4)  # exact
    >>> b = KeyedRNG.for_testing(7, identity=("r", "county", 0, "A")).discrete_gaussian(3.0, 4)
    >>> bool((a == b).all())
    True
    """

    __slots__ = ("_gen", "identity", "test_only")

    def __init__(self, key: SecretKey | bytes | StreamKey, identity: IdentityLike):
        encode_identity(identity)  # validate before deriving
        if isinstance(key, StreamKey):
            philox = key.philox_key(identity)
            test_only = key.test_only
        else:
            secret = as_secret_key(key)
            philox = secret.derive(identity)
            test_only = secret.test_only
        self.identity = identity
        self.test_only = test_only
        self._gen = np.random.Generator(np.random.Philox(key=philox))

    @classmethod
    def for_testing(cls, seed: int, identity: IdentityLike = ()) -> KeyedRNG:
        """A stream from a fixed seed, flagged ``test_only`` (refused by production code)."""
        return cls(SecretKey.for_testing(seed), identity)

    def __repr__(self) -> str:
        flag = ", test_only=True" if self.test_only else ""
        return f"KeyedRNG(identity={self.identity!r}{flag})"

    def __reduce__(self) -> NoReturn:
        raise ArgumentTypeError(
            "a KeyedRNG is not picklable: send the key and identity and rebuild it, "
            "so that the stream always starts at its beginning"
        )

    # -- samplers ------------------------------------------------------
    def laplace(
        self, scale: float, shape: int | Sequence[int], *, unsafe_float: bool = False
    ) -> np.ndarray:
        """Laplace noise of scale ``b`` (float64); needs ``unsafe_float=True``."""
        return _samplers.laplace(self._gen, scale, shape, unsafe_float=unsafe_float)

    def gaussian(
        self, sigma: float, shape: int | Sequence[int], *, unsafe_float: bool = False
    ) -> np.ndarray:
        """Gaussian noise ``N(0, sigma**2)`` (float64); needs ``unsafe_float=True``."""
        return _samplers.gaussian(self._gen, sigma, shape, unsafe_float=unsafe_float)

    def discrete_laplace(self, scale: float | Fraction, shape: int | Sequence[int]) -> np.ndarray:
        """Exact discrete Laplace noise, ``P(y) ∝ exp(-|y| / scale)`` (int64)."""
        return _samplers.discrete_laplace(self._gen, scale, shape)

    def discrete_gaussian(self, sigma: float | Fraction, shape: int | Sequence[int]) -> np.ndarray:
        """Exact discrete Gaussian noise, ``P(y) ∝ exp(-y**2 / (2 sigma**2))`` (int64)."""
        return _samplers.discrete_gaussian(self._gen, sigma, shape)

    def reference_cks(self, mechanism: str, scale: float | Fraction, size: int) -> np.ndarray:
        """Draws of CKS's Bernoulli-factory samplers (the reference the tables are checked
        against, and benchmarked with): ``mechanism`` is ``"discrete_laplace"`` (``scale``)
        or ``"discrete_gaussian"`` (``scale`` is ``sigma**2``). Exact, and slower than
        :meth:`discrete_laplace` / :meth:`discrete_gaussian`."""
        from dpdask.noise._exact import discrete_gaussian_cks, discrete_laplace_cks

        if mechanism == "discrete_laplace":
            return discrete_laplace_cks(self._gen, scale, size)
        if mechanism == "discrete_gaussian":
            return discrete_gaussian_cks(self._gen, scale, size)
        raise PlanError(f"no CKS reference sampler for {mechanism!r}")

    def correlated_gaussian(
        self,
        factor: LinearQuery | npt.ArrayLike,
        shape: int | Sequence[int],
        *,
        unsafe_float: bool = False,
    ) -> np.ndarray:
        """``N(0, F F^T)`` noise for an ``m x k`` factor ``F``; result shape ``(*shape, m)``;
        needs ``unsafe_float=True``."""
        return _samplers.correlated_gaussian(self._gen, factor, shape, unsafe_float=unsafe_float)

    def sample(
        self,
        mechanism: str,
        scale: float | Fraction,
        shape: int | Sequence[int],
        *,
        unsafe_float: bool = False,
    ) -> np.ndarray:
        """Dispatch by mechanism name (``discrete_laplace``, ``discrete_gaussian``; the
        floating-point ``laplace`` and ``gaussian`` only with ``unsafe_float=True``)."""
        if mechanism not in MECHANISMS:
            raise PlanError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")
        sampler: Callable[..., np.ndarray] = getattr(self, mechanism)
        if mechanism.startswith("discrete"):
            return sampler(scale, shape)
        return sampler(scale, shape, unsafe_float=unsafe_float)


MECHANISMS = ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian")
