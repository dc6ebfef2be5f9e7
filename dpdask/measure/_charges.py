"""Measurement identities, stream keys and the charge of one level's measurement.

A charge's identity is ``(release, run_id, level, measurement)``, without the
chunk: all chunks of a level are charged once (parallel composition).
:func:`charge_level` records it, before any data is read; :func:`level_charge`
makes it (checked against the plan's calibration) without recording it.

Keys stay on the client. :func:`stream_key` makes, from the release's
:class:`~dpdask.noise.SecretKey`, the :class:`~dpdask.noise.StreamKey` of exactly
one measurement's noise stream, ``stream_identity(identity, run_id)``; a task
receives only that. Every charge carries the fingerprint of the key whose noise it
pays for; :func:`check_receipt` refuses a receipt charged for another key (or,
outside test mode, for no key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from dpdask.errors import ArgumentError, ArgumentTypeError, LedgerConflictError, NoiseKeyError
from dpdask.linalg import LinearQuery
from dpdask.measure._checks import MeasurePlan, cached_sensitivity, check_plan
from dpdask.noise import MeasurementId, SecretKey, StreamKey, as_secret_key
from dpdask.privacy import MECHANISM_NORM, Charge, Ledger, check_calibration, check_name

__all__ = [
    "MeasurementIdLike",
    "as_identity",
    "charge_level",
    "check_receipt",
    "level_charge",
    "stream_identity",
    "stream_key",
]


#: A measurement's identity as :func:`measure` accepts it: a
#: :class:`~dpdask.noise.MeasurementId`, a mapping with exactly its four keys, or the
#: 4-tuple ``(release, level, chunk, measurement)``.
MeasurementIdLike: TypeAlias = MeasurementId | Mapping[str, Any] | tuple[str, str, int, str]


def as_identity(identity: object) -> MeasurementId:
    """``identity`` as a :class:`~dpdask.noise.MeasurementId` (:data:`MeasurementIdLike`)."""
    if isinstance(identity, MeasurementId):
        return identity
    if isinstance(identity, Mapping):
        keys = {"release", "level", "chunk", "measurement"}
        if set(identity) != keys:
            raise ArgumentError(f"a measurement identity has exactly the keys {sorted(keys)}")
        return MeasurementId(**identity)
    if isinstance(identity, tuple) and len(identity) == 4:
        return MeasurementId(*identity)
    raise ArgumentTypeError(
        "identity must be a MeasurementId(release, level, chunk, measurement), "
        f"a mapping or a 4-tuple, got {identity!r}"
    )


def level_charge(
    plan: MeasurePlan,
    release: str,
    run_id: str,
    level: str,
    measurement: str,
    key_fingerprint: str | None = None,
) -> tuple[Charge, LinearQuery]:
    """The charge of one level's measurement (and the strategy), checked, not recorded.

    ``key_fingerprint`` is the :meth:`~dpdask.noise.SecretKey.fingerprint` of the key
    whose noise the charge pays for; it is put in the charge as is.
    """
    if key_fingerprint is not None and (
        not isinstance(key_fingerprint, str) or not key_fingerprint
    ):
        raise NoiseKeyError(f"key_fingerprint must be a non-empty string, got {key_fingerprint!r}")
    A, mech, scale, privacy, _ = check_plan(plan)
    sens = cached_sensitivity(A, MECHANISM_NORM[mech])
    check_calibration(mech, sens, scale, privacy)
    charge = Charge(
        release=check_name(release, "release"),
        run_id=check_name(run_id, "run_id"),
        level=check_name(level, "level"),
        measurement=check_name(measurement, "measurement"),
        mechanism=mech,
        sensitivity=sens,
        noise_scale=scale,
        privacy=privacy,
        key_fingerprint=key_fingerprint,
    )
    return charge, A


def charge_level(
    plan: MeasurePlan,
    ledger: Ledger,
    release: str,
    run_id: str,
    level: str,
    measurement: str,
    *,
    key: SecretKey | bytes | None = None,
) -> Charge:
    """Charge one level's measurement to the ledger, once for all its chunks.

    Call before reading any data; then :func:`measure` each chunk (passing the
    ledger or the returned charge). Retrying with the same run id charges nothing.

    Parameters
    ----------
    plan : MeasurePlan
        The level's plan.
    ledger : Ledger
        Where the charge is recorded.
    release, run_id, level, measurement : str
        The charge's identity.
    key : SecretKey or bytes
        The release's secret key (required): the charge records its
        :meth:`~dpdask.noise.SecretKey.fingerprint`, and :func:`measure` refuses the
        receipt for any other key.

    Returns
    -------
    Charge
        The recorded charge, a receipt :func:`measure` accepts as ``ledger``.

    Raises
    ------
    dpdask.privacy.BudgetExceededError
        If the charge does not fit; nothing is written.
    dpdask.errors.PlanError
        If the plan's noise is too small for its privacy (a ``ValueError``).
    TypeError
        If ``key`` is missing.
    """
    if not isinstance(ledger, Ledger):
        raise ArgumentTypeError(
            f"ledger must be a dpdask.privacy.Ledger, got {type(ledger).__name__}"
        )
    if key is None:
        raise ArgumentTypeError(
            "charge_level needs key=: the charge records the fingerprint of the key "
            "whose noise it pays for"
        )
    if isinstance(key, StreamKey):
        raise ArgumentTypeError("charge_level takes the release's SecretKey, not a StreamKey")
    fingerprint = as_secret_key(key).fingerprint()
    charge, _ = level_charge(plan, release, run_id, level, measurement, fingerprint)
    ledger.charge(charge)
    return charge


def check_receipt(receipt: Charge, expected: Charge, test_mode: bool = False) -> None:
    if receipt.key != expected.key or not receipt.same_as(expected):
        raise LedgerConflictError(
            f"the charge passed as ledger ({receipt.key}, {receipt.privacy!r}) does not match "
            f"this measurement ({expected.key}, {expected.privacy!r})"
        )
    _check_fingerprint(receipt.key_fingerprint, expected, test_mode)


def _check_fingerprint(charged: str | None, expected: Charge, test_mode: bool) -> None:
    """Refuse to draw noise with a key other than the one charged (fail closed)."""
    if charged is None:
        if test_mode:
            return
        raise NoiseKeyError(
            f"the charge for run {expected.run_id!r} records no key fingerprint; refusing to "
            "draw noise for a key the ledger does not bind to the run"
        )
    if charged != expected.key_fingerprint:  # fingerprints are not secret
        raise NoiseKeyError(f"this key is not the one charged for run {expected.run_id!r}")


# -- stream keys (made on the client, sent to tasks) ----------------------------------
def stream_identity(identity: MeasurementIdLike, run_id: str) -> dict[str, str | MeasurementId]:
    """The identity of the noise stream of a measurement in a run.

    ``{"run": run_id, "measurement": MeasurementId(...)}``: the stream
    :func:`measure` draws from, ``KeyedRNG(key, stream_identity(identity, run_id))``.
    """
    return {"run": check_name(run_id, "run_id"), "measurement": as_identity(identity)}


def stream_key(key: SecretKey | bytes, identity: MeasurementIdLike, run_id: str) -> StreamKey:
    """The :class:`~dpdask.noise.StreamKey` to send with one measurement's task.

    Made on the client from the release's secret key; :func:`measure` accepts it in
    place of the secret key for this ``identity`` and ``run_id`` only, and draws
    exactly the same noise.

    Parameters
    ----------
    key : SecretKey or bytes
        The release's secret key.
    identity : MeasurementId, mapping or 4-tuple
        ``(release, level, chunk, measurement)`` of the chunk.
    run_id : str
        The run.

    Returns
    -------
    StreamKey
        Holds only that stream's derived key and the master key's fingerprint.

    Examples
    --------
    >>> from dpdask.noise import SecretKey
    >>> sk = stream_key(SecretKey.for_testing(0), ("r", "county", 3, "strategy"), "run1")
    >>> sk.test_only
    True
    """
    if isinstance(key, StreamKey):
        raise ArgumentTypeError("a stream key cannot make other stream keys; pass the SecretKey")
    return as_secret_key(key).stream_key(stream_identity(identity, run_id))
