"""Secret keys, measurement identities and the keyed derivation of noise streams.

Every measurement's noise is a function of a 32-byte secret key and the
measurement's identity. The identity is encoded canonically (type-tagged and
length-prefixed, so no two different identities share an encoding), hashed with
keyed BLAKE2b, and the 128-bit digest becomes the key of a numpy ``Philox``
counter-based generator. The same key and identity therefore give the same
stream on any worker, in any order, after any retry; different identities give
streams whose keys are pseudo-random functions of the identity, hence independent
for practical purposes.

The key never appears in a ``repr``, a log line or an output; a non-secret
:meth:`SecretKey.fingerprint` identifies it in reports and binds a run to its key
in the ledger.

Keys stay on the client. Dask tasks never receive the :class:`SecretKey`: the
client makes, for each task, the :class:`StreamKey` of exactly the one noise
stream that task draws (:meth:`SecretKey.stream_key`). A stream key holds that
stream's 128-bit Philox key and the identity it was derived for; it cannot derive
the stream of any other identity, so a worker that sees it learns nothing about
the other chunks' noise.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, NoiseKeyError

__all__ = [
    "KEY_BYTES",
    "IdentityLike",
    "MeasurementId",
    "SecretKey",
    "StreamKey",
    "as_secret_key",
    "encode_identity",
    "new_key",
]

KEY_BYTES = 32

#: What may identify a noise stream (:func:`encode_identity`): ``str``, ``int``,
#: ``bytes``, ``None``, a :class:`MeasurementId`, and tuples, lists and string-keyed
#: mappings of these (floats and booleans are refused at run time).
IdentityLike: TypeAlias = (
    "MeasurementId | str | int | np.integer[Any] | bytes "
    "| Sequence[IdentityLike] | Mapping[str, IdentityLike] | None"
)
_PERSON_STREAM = b"dpdask-noise-v1"
_PERSON_TEST = b"dpdask-testseed"
_PERSON_PRINT = b"dpdask-keyprint"
_PERSON_IDENT = b"dpdask-streamid"
FINGERPRINT_BYTES = 16


class SecretKey:
    """A 32-byte secret that, with a measurement identity, determines noise.

    Create one with :func:`new_key` (from the operating system's CSPRNG) or load
    it with :meth:`KeyFile.load`. :meth:`for_testing` derives a key from a seed and
    flags it ``test_only``; production entry points (:func:`dpdask.measure.measure`
    without ``test_mode=True``) refuse such keys.

    Parameters
    ----------
    raw : bytes
        Exactly 32 bytes.

    Raises
    ------
    TypeError
        If ``raw`` is not bytes.
    dpdask.errors.NoiseKeyError
        If ``raw`` is not 32 bytes long (a ``ValueError``).
    """

    __slots__ = ("_raw", "test_only")
    _raw: bytes
    test_only: bool

    def __init__(
        self, raw: bytes | bytearray | memoryview | SecretKey, *, _test_only: bool = False
    ):
        if isinstance(raw, SecretKey):
            _test_only = raw.test_only
            raw = raw._raw
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise ArgumentTypeError(f"a secret key is {KEY_BYTES} bytes, got {type(raw).__name__}")
        raw = bytes(raw)
        if len(raw) != KEY_BYTES:
            raise NoiseKeyError(f"a secret key is {KEY_BYTES} bytes, got {len(raw)}")
        self._raw = raw
        self.test_only = bool(_test_only)

    @classmethod
    def for_testing(cls, seed: int) -> SecretKey:
        """A key derived from ``seed``, flagged test-only (never for a real release)."""
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise ArgumentTypeError("a test seed is an integer")
        digest = hashlib.blake2b(
            str(int(seed)).encode(), digest_size=KEY_BYTES, person=_PERSON_TEST
        ).digest()
        return cls(digest, _test_only=True)

    def fingerprint(self) -> str:
        """A non-secret identifier of the key, safe to log and to record in the ledger.

        A keyed BLAKE2b digest (16 bytes, 32 hexadecimal characters) of the empty
        message under the key: it names the key without revealing anything about it.
        """
        return hashlib.blake2b(
            b"", key=self._raw, digest_size=FINGERPRINT_BYTES, person=_PERSON_PRINT
        ).hexdigest()

    def derive(self, identity: IdentityLike) -> int:
        """The 128-bit Philox key of ``identity``: keyed BLAKE2b of its canonical encoding."""
        digest = hashlib.blake2b(
            encode_identity(identity), key=self._raw, digest_size=16, person=_PERSON_STREAM
        ).digest()
        return int.from_bytes(digest, "little")

    def stream_key(self, identity: IdentityLike) -> StreamKey:
        """The key of the one noise stream of ``identity``, to send to a task.

        Parameters
        ----------
        identity : str, int, bytes, tuple, mapping or MeasurementId
            The stream's identity, exactly as it will be passed to
            :class:`~dpdask.noise.KeyedRNG`.

        Returns
        -------
        StreamKey
            Holds :meth:`derive` of ``identity`` (so the stream is bit-identical to
            ``KeyedRNG(self, identity)``), the identity and :meth:`fingerprint`;
            never the secret key itself.

        Examples
        --------
        >>> key = SecretKey.for_testing(1)
        >>> sk = key.stream_key(("r", "county", 0, "A"))
        >>> sk.fingerprint() == key.fingerprint()
        True
        """
        encoding = encode_identity(identity)
        return StreamKey._make(self.derive(identity), encoding, self.fingerprint(), self.test_only)

    def __bytes__(self) -> bytes:
        return self._raw

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SecretKey):
            return NotImplemented
        return self.test_only == other.test_only and hmac.compare_digest(self._raw, other._raw)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        kind = "test-only key" if self.test_only else "secret"
        return f"SecretKey(<{kind} {self.fingerprint()}>)"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Callable[[bytes, bool], SecretKey], tuple[bytes, bool]]:
        # picklable so that measurement tasks can run on Dask workers
        return (_restore_key, (self._raw, self.test_only))


def _restore_key(raw: bytes, test_only: bool) -> SecretKey:
    return SecretKey(raw, _test_only=test_only)


class StreamKey:
    """The secret of exactly one noise stream: what a Dask task receives.

    Made on the client by :meth:`SecretKey.stream_key`; never constructed
    directly. It holds the stream's 128-bit Philox key (``secret.derive(identity)``),
    the canonical encoding of the identity it was derived for, the fingerprint of
    the secret key it came from (non-secret) and whether that key is test-only.
    :class:`~dpdask.noise.KeyedRNG` accepts it only together with that same
    identity; nothing else can be derived from it. It pickles (tasks carry it) and
    its ``repr`` never shows the Philox key.

    Attributes
    ----------
    test_only : bool
        True when the secret key was a test-only key.

    Examples
    --------
    >>> from dpdask.noise import KeyedRNG
    >>> key = SecretKey.for_testing(3)
    >>> sk = key.stream_key("chunk-0")
    >>> a = KeyedRNG(sk, "chunk-0").discrete_gaussian(1.0, 3)
    >>> bool((a == KeyedRNG(key, "chunk-0").discrete_gaussian(1.0, 3)).all())
    True
    >>> KeyedRNG(sk, "chunk-1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpdask.errors.NoiseKeyError: this stream key was derived for another identity; ...
    """

    __slots__ = ("_fingerprint", "_identity", "_philox", "test_only")
    _philox: int
    _identity: bytes
    _fingerprint: str
    test_only: bool

    def __init__(self, *args: object, **kwargs: object):
        raise ArgumentTypeError(
            "make a StreamKey on the client with SecretKey.stream_key(identity)"
        )

    @classmethod
    def _make(cls, philox: int, identity: bytes, fingerprint: str, test_only: bool) -> StreamKey:
        if isinstance(philox, bool) or not isinstance(philox, int) or not 0 <= philox < 2**128:
            raise NoiseKeyError("a stream key is a 128-bit integer")
        if not isinstance(identity, bytes) or not isinstance(fingerprint, str):
            raise ArgumentTypeError("a stream key needs the identity's encoding and a fingerprint")
        self = object.__new__(cls)
        self._philox = philox
        self._identity = identity
        self._fingerprint = fingerprint
        self.test_only = bool(test_only)
        return self

    def fingerprint(self) -> str:
        """The fingerprint of the secret key this stream key was derived from."""
        return self._fingerprint

    def is_for(self, identity: IdentityLike) -> bool:
        """Whether this stream key was derived for ``identity``."""
        return hmac.compare_digest(encode_identity(identity), self._identity)

    def philox_key(self, identity: IdentityLike) -> int:
        """The stream's 128-bit Philox key, given the identity it was derived for.

        Raises
        ------
        dpdask.errors.NoiseKeyError
            If ``identity`` is not the one this stream key was derived for (a ``ValueError``).
        """
        if not self.is_for(identity):
            raise NoiseKeyError(
                "this stream key was derived for another identity; it can only draw its own stream"
            )
        return self._philox

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamKey):
            return NotImplemented
        return (
            self.test_only == other.test_only
            and self._fingerprint == other._fingerprint
            and self._identity == other._identity
            and hmac.compare_digest(
                self._philox.to_bytes(16, "little"), other._philox.to_bytes(16, "little")
            )
        )

    def __hash__(self) -> int:
        return hash((self._fingerprint, self._identity))

    def __repr__(self) -> str:
        kind = "test-only key" if self.test_only else "secret"
        ident = hashlib.blake2b(self._identity, digest_size=4, person=_PERSON_IDENT).hexdigest()
        return f"StreamKey(<stream {ident} of {kind} {self._fingerprint}>)"

    __str__ = __repr__

    def __dask_tokenize__(self) -> tuple[str, str, bytes, bool]:
        # deterministic and free of the Philox key
        return ("dpdask.StreamKey", self._fingerprint, self._identity, self.test_only)

    def __reduce__(
        self,
    ) -> tuple[Callable[[int, bytes, str, bool], StreamKey], tuple[int, bytes, str, bool]]:
        return (_restore_stream, (self._philox, self._identity, self._fingerprint, self.test_only))


def _restore_stream(philox: int, identity: bytes, fingerprint: str, test_only: bool) -> StreamKey:
    return StreamKey._make(philox, identity, fingerprint, test_only)


def new_key() -> SecretKey:
    """A fresh secret key: 32 bytes from the operating system (:mod:`secrets`).

    Examples
    --------
    >>> key = new_key()
    >>> len(bytes(key))
    32
    >>> key.test_only
    False
    """
    return SecretKey(secrets.token_bytes(KEY_BYTES))


def as_secret_key(key: SecretKey | bytes) -> SecretKey:
    """Accept a :class:`SecretKey` or 32 raw bytes."""
    return key if isinstance(key, SecretKey) else SecretKey(key)


@dataclass(frozen=True)
class MeasurementId:
    """The identity of one measurement of one geography chunk.

    Parameters
    ----------
    release : str
        The release id.
    level : str
        The geography level (e.g. ``"county"``).
    chunk : int
        The index of the geography chunk within the level.
    measurement : str
        The name of the measurement (the strategy part) within the level.
    """

    release: str
    level: str
    chunk: int
    measurement: str

    def __post_init__(self) -> None:
        for name in ("release", "level", "measurement"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ArgumentError(
                    f"MeasurementId.{name} must be a non-empty string, got {value!r}"
                )
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int | np.integer):
            raise ArgumentError(f"MeasurementId.chunk must be an integer, got {self.chunk!r}")
        if self.chunk < 0:
            raise ArgumentError(f"MeasurementId.chunk must be >= 0, got {self.chunk}")
        object.__setattr__(self, "chunk", int(self.chunk))

    def as_dict(self) -> dict[str, str | int]:
        return {
            "release": self.release,
            "level": self.level,
            "chunk": self.chunk,
            "measurement": self.measurement,
        }


def encode_identity(identity: IdentityLike) -> bytes:
    """The canonical byte encoding of an identity.

    Accepted: ``str``, ``int``, ``bytes``, ``None``, tuples and lists of these,
    mappings with string keys (encoded in sorted key order) and
    :class:`MeasurementId`. Every value is tagged with its type and prefixed with
    its length, so the encoding is injective. Floats and booleans are refused:
    they have several spellings of "the same" value.

    Raises
    ------
    TypeError
        For any other type.
    """
    out = bytearray()
    _encode(identity, out)
    return bytes(out)


def _put(out: bytearray, tag: bytes, payload: bytes) -> None:
    out += tag + len(payload).to_bytes(8, "big") + payload


def _encode(value: object, out: bytearray) -> None:
    if isinstance(value, MeasurementId):
        value = value.as_dict()
    if value is None:
        _put(out, b"n", b"")
    elif isinstance(value, bool | np.bool_):
        raise ArgumentTypeError("booleans are not allowed in a measurement identity")
    elif isinstance(value, int | np.integer):
        v = int(value)
        _put(out, b"i", v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True))
    elif isinstance(value, str):
        _put(out, b"s", value.encode("utf-8"))
    elif isinstance(value, bytes):
        _put(out, b"b", value)
    elif isinstance(value, tuple | list):
        out += b"t" + len(value).to_bytes(8, "big")
        for item in value:
            _encode(item, out)
    elif isinstance(value, Mapping):
        keys = list(value)
        if not all(isinstance(k, str) for k in keys):
            raise ArgumentTypeError("identity mappings need string keys")
        out += b"m" + len(keys).to_bytes(8, "big")
        for k in sorted(keys):
            _encode(k, out)
            _encode(value[k], out)
    else:
        raise ArgumentTypeError(
            f"cannot use a {type(value).__name__} in a measurement identity "
            "(use str, int, bytes, None, tuples or mappings)"
        )
