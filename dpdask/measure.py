"""The measure step: noisy answers to a plan's strategy on one geography chunk.

This is the only place dpdask reads sensitive data. For one chunk of
geographies ``x`` (shape ``(g, *domain.shape)``) it computes ``A x`` per
geography with the plan's implicit strategy ``A``, records the privacy charge in
the ledger, and adds noise of the plan's scale drawn from the keyed stream of the
measurement's identity.

Order of operations (each step raises before the next one runs):

1. the plan, key and identity are checked; a test-only key is refused unless
   ``test_mode=True``;
2. the noise calibration is checked against the plan's privacy
   (:func:`dpdask.privacy.check_calibration`);
3. the ledger is asked, read-only, whether the charge fits: an over-budget
   measurement is refused here, *before the data is read*;
4. the data is checked: dtype, shape against the domain, attribute names,
   NaN/inf, negative counts, integers where the mechanism needs them;
5. the charge is committed to the ledger and synced to disk;
6. ``A x`` is computed and the noise drawn and added.

A crash between 5 and 6 leaves the charge recorded; the retry with the same run
id finds it (no new charge) and draws the same noise, because the noise is a
function of the key and of ``(run id, identity)`` only: it is the stream
``KeyedRNG(key, {"run": run_id, "measurement": identity})``. A new run id is a new
charge and draws fresh noise (reusing noise on changed data would leak the change).

Keys stay on the client. ``key`` may be the release's :class:`~dpdask.noise.SecretKey`
or, on a worker, the :class:`~dpdask.noise.StreamKey` of exactly this measurement's
stream (:func:`stream_key`, made on the client): the noise is the same, and the
worker never holds the secret. Every charge carries the fingerprint of the key
(:meth:`~dpdask.noise.SecretKey.fingerprint`); a receipt charged for another key,
or (outside test mode) for no key, is refused before any data is read.

Parallel composition. A charge's identity is ``(release, run_id, level,
measurement)``, without the chunk: all chunks of a level are charged once. The
release dataflow calls :func:`charge_level` once per level and measurement
(before reading any data), then :func:`measure` for each chunk; ``measure``
finds the charge already recorded and adds nothing. On workers without access to
the ledger file, pass the :class:`~dpdask.privacy.Charge` that
:func:`charge_level` returned as ``ledger``; ``measure`` then checks that it
matches the plan and identity.

Integer noise rule. When ``integer_noise`` is ``None`` (the default), integer
data measured with a strategy whose entries are all integers (checked from the
operator's structure, not the data) gets integer noise of the same scale:
``laplace`` becomes ``discrete_laplace`` (the same ``D1 / b``-DP guarantee), and
``gaussian`` becomes ``discrete_gaussian`` when the plan's budget admits the
discrete Gaussian too (always for zCDP, which gives the same rho; for
(epsilon, delta) budgets when the CKS zCDP conversion fits). Otherwise the
plan's mechanism is used as is. ``integer_noise=False`` keeps float noise;
``integer_noise=True`` demands integer noise and raises if the rule cannot give
it. Plans whose mechanism is already discrete need integer data and an integer
strategy (a non-integer ``A x`` under integer noise would not be private).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from dpdask.domain import Domain
from dpdask.linalg import (
    Dense,
    Diagonal,
    Identity,
    Kron,
    LinearQuery,
    Ones,
    Prefix,
    Product,
    RangeQueries,
    Scaled,
    Sparse,
    Sum,
    Transpose,
    VStack,
)
from dpdask.noise import KeyedRNG, MeasurementId, SecretKey, StreamKey
from dpdask.noise._keys import as_secret_key
from dpdask.privacy import Budget, Charge, Ledger, check_calibration
from dpdask.privacy._mechanisms import MECHANISM_NORM

__all__ = [
    "MeasurePlan",
    "charge_level",
    "has_integer_entries",
    "measure",
    "measurement_noise",
    "noise_mechanism",
    "stream_identity",
    "stream_key",
]

_DISCRETE = {"laplace": "discrete_laplace", "gaussian": "discrete_gaussian"}
_MAX_EXACT = 2.0**53


class MeasurePlan(Protocol):
    """What :func:`measure` needs from a plan (``dpdask.Plan`` satisfies it)."""

    strategy: LinearQuery
    mechanism: str
    noise_scale: float
    privacy: Budget
    domain: Domain | None


# -- integer strategies -----------------------------------------------------
def _integral(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=float)
    return bool(np.isfinite(values).all() and (values == np.floor(values)).all())


def has_integer_entries(op: LinearQuery) -> bool:
    """Whether every entry of ``op`` is an integer, decided from its structure.

    Primitive counting operators (identity, ones, prefix, ranges) are integral;
    diagonal, dense and sparse operators are checked entry by entry; products,
    sums, unions (with their weights), Kronecker products, scalings and
    transposes are integral when all their parts are. Operators of unknown type
    count as non-integral (so they get float noise), unless they define a
    ``has_integer_entries()`` method.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Kron, Ones, Prefix
    >>> has_integer_entries(Kron([Prefix(3), Ones(2)]))
    True
    >>> has_integer_entries(0.5 * Identity(3))
    False
    """
    own = getattr(op, "has_integer_entries", None)
    if callable(own):
        return bool(own())
    if isinstance(op, Identity | Ones | Prefix | RangeQueries):
        return True
    if isinstance(op, Diagonal):
        return _integral(op.d)
    if isinstance(op, Dense):
        return _integral(op.matrix)
    if isinstance(op, Sparse):
        return _integral(op.matrix.data)
    if isinstance(op, Scaled):
        return _integral(np.array([op.c])) and has_integer_entries(op.A)
    if isinstance(op, Transpose):
        return has_integer_entries(op.base)
    if isinstance(op, Product):
        return has_integer_entries(op.A) and has_integer_entries(op.B)
    if isinstance(op, Sum):
        return all(has_integer_entries(t) for t in op.terms)
    if isinstance(op, Kron):
        return all(has_integer_entries(f) for f in op.factors)
    if isinstance(op, VStack):
        return _integral(op.weights) and all(has_integer_entries(p) for p in op.parts)
    return False


_SENSITIVITY: weakref.WeakKeyDictionary[LinearQuery, dict[int, float]] = weakref.WeakKeyDictionary()


def _sensitivity(op: LinearQuery, p: int) -> float:
    try:
        cache = _SENSITIVITY.setdefault(op, {})
    except TypeError:  # not weak-referenceable
        return float(op.sensitivity(p))
    if p not in cache:
        cache[p] = float(op.sensitivity(p))
    return cache[p]


# -- plan checks ---------------------------------------------------------------
def _check_plan(plan: Any) -> tuple[LinearQuery, str, float, Budget, Domain | None]:
    for attr in ("strategy", "mechanism", "noise_scale", "privacy", "domain"):
        if not hasattr(plan, attr):
            raise TypeError(f"the plan has no {attr!r} attribute")
    A, mech, scale, privacy, domain = (
        plan.strategy,
        plan.mechanism,
        plan.noise_scale,
        plan.privacy,
        plan.domain,
    )
    if not isinstance(A, LinearQuery):
        raise TypeError(f"plan.strategy must be a LinearQuery, got {type(A).__name__}")
    if mech not in MECHANISM_NORM:
        raise ValueError(f"plan.mechanism {mech!r} is not one of {sorted(MECHANISM_NORM)}")
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.integer | np.floating):
        raise TypeError(f"plan.noise_scale must be a number, got {scale!r}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"plan.noise_scale must be positive and finite, got {scale!r}")
    if not isinstance(privacy, Budget):
        raise TypeError(f"plan.privacy must be a PureDP, ApproxDP or zCDP, got {privacy!r}")
    if domain is not None:
        if not isinstance(domain, Domain):
            raise TypeError(f"plan.domain must be a Domain or None, got {type(domain).__name__}")
        if domain.size != A.shape[1]:
            raise ValueError(
                f"plan.domain has {domain.size} cells but the strategy has {A.shape[1]} columns"
            )
    return A, mech, scale, privacy, domain


def _as_identity(identity: Any) -> MeasurementId:
    if isinstance(identity, MeasurementId):
        return identity
    if isinstance(identity, Mapping):
        keys = {"release", "level", "chunk", "measurement"}
        if set(identity) != keys:
            raise ValueError(f"a measurement identity has exactly the keys {sorted(keys)}")
        return MeasurementId(**identity)
    if isinstance(identity, tuple) and len(identity) == 4:
        return MeasurementId(*identity)
    raise TypeError(
        "identity must be a MeasurementId(release, level, chunk, measurement), "
        f"a mapping or a 4-tuple, got {identity!r}"
    )


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _level_charge(
    plan: Any,
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
        raise ValueError(f"key_fingerprint must be a non-empty string, got {key_fingerprint!r}")
    A, mech, scale, privacy, _ = _check_plan(plan)
    sens = _sensitivity(A, MECHANISM_NORM[mech])
    check_calibration(mech, sens, scale, privacy)
    charge = Charge(
        release=_check_name(release, "release"),
        run_id=_check_name(run_id, "run_id"),
        level=_check_name(level, "level"),
        measurement=_check_name(measurement, "measurement"),
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
    ValueError
        If the plan's noise is too small for its privacy.
    TypeError
        If ``key`` is missing.
    """
    if not isinstance(ledger, Ledger):
        raise TypeError(f"ledger must be a dpdask.privacy.Ledger, got {type(ledger).__name__}")
    if key is None:
        raise TypeError(
            "charge_level needs key=: the charge records the fingerprint of the key "
            "whose noise it pays for"
        )
    if isinstance(key, StreamKey):
        raise TypeError("charge_level takes the release's SecretKey, not a StreamKey")
    fingerprint = as_secret_key(key).fingerprint()
    charge, _ = _level_charge(plan, release, run_id, level, measurement, fingerprint)
    ledger.charge(charge)
    return charge


# -- data checks -------------------------------------------------------------------
def _check_data(
    x: Any, A: LinearQuery, domain: Domain | None, dims: Sequence[str] | None
) -> tuple[np.ndarray, bool]:
    """The data as a ``(g, *cells)`` array in domain order, and whether it was one geography."""
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"x must be a numpy array of counts, got {type(x).__name__} "
            "(compute a dask chunk before measuring it)"
        )
    if x.dtype == np.bool_ or not (
        np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)
    ):
        raise TypeError(f"x must hold integer (or float) counts, got dtype {x.dtype}")
    cell_shape: tuple[int, ...] = domain.shape if domain is not None else (A.shape[1],)
    if dims is not None:
        if domain is None:
            raise ValueError("dims names the data's attributes, so the plan needs a domain")
        dims = list(dims)
        for name in dims:
            domain[name]  # raises ValueError naming an unknown attribute
        if sorted(dims) != sorted(domain.attrs) or len(set(dims)) != len(dims):
            raise ValueError(f"dims {dims} must name each attribute of {domain.attrs} exactly once")
        lead = x.ndim - len(dims)
        if lead not in (0, 1):
            raise ValueError(f"x has {x.ndim} axes but dims names {len(dims)} attributes")
        order = [dims.index(a) + lead for a in domain.attrs]
        x = np.transpose(x, list(range(lead)) + order)
    if x.shape == cell_shape:
        single = True
        x = x[None]
    elif x.ndim == len(cell_shape) + 1 and x.shape[1:] == cell_shape:
        single = False
    elif domain is None and x.ndim >= 2 and math.prod(x.shape[1:]) == A.shape[1]:
        single = False
    else:
        raise ValueError(
            f"x has shape {x.shape}; expected (geographies, *{cell_shape}) "
            f"or {cell_shape} for one geography"
        )
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ValueError("x contains NaN or infinite counts")
    if x.size and x.min() < 0:
        raise ValueError("x contains negative counts")
    return x, single


def noise_mechanism(plan: MeasurePlan, dtype: Any, integer_noise: bool | None = None) -> str:
    """The sampler :func:`measure` uses for data of ``dtype`` (the integer noise rule).

    Parameters
    ----------
    plan : MeasurePlan
        The plan.
    dtype : numpy dtype
        The data's dtype (metadata only; no data is read).
    integer_noise : bool or None
        ``None`` applies the default rule (see the module notes), ``True`` demands
        integer noise, ``False`` keeps the plan's float mechanism.

    Raises
    ------
    TypeError
        If a discrete mechanism meets float data.
    ValueError
        If integer noise is demanded or planned but the strategy is not integral.
    """
    A, mech, scale, privacy, _ = _check_plan(plan)
    integer_data = np.issubdtype(np.dtype(dtype), np.integer)
    if mech.startswith("discrete"):
        if integer_noise is False:
            raise ValueError(f"the plan's mechanism {mech!r} is integer noise")
        if not integer_data:
            raise TypeError(f"{mech} noise needs integer counts, got dtype {np.dtype(dtype)}")
        if not has_integer_entries(A):
            raise ValueError(f"{mech} noise needs a strategy with integer entries")
        return mech
    if integer_noise is False:
        return mech
    candidate = _DISCRETE[mech]
    reason = None
    if not integer_data:
        reason = f"the data has dtype {np.dtype(dtype)}"
    elif not has_integer_entries(A):
        reason = "the strategy has non-integer entries"
    else:
        try:
            check_calibration(candidate, _sensitivity(A, MECHANISM_NORM[mech]), scale, privacy)
        except ValueError as exc:
            reason = str(exc)
    if reason is None:
        return candidate
    if integer_noise:
        raise ValueError(f"cannot use integer noise: {reason}")
    return mech


def _check_receipt(receipt: Charge, expected: Charge, test_mode: bool = False) -> None:
    if receipt.key != expected.key or not receipt._same_as(expected):
        raise ValueError(
            f"the charge passed as ledger ({receipt.key}, {receipt.privacy!r}) does not match "
            f"this measurement ({expected.key}, {expected.privacy!r})"
        )
    _check_fingerprint(receipt.key_fingerprint, expected, test_mode)


def _check_fingerprint(charged: str | None, expected: Charge, test_mode: bool) -> None:
    """Refuse to draw noise with a key other than the one charged (fail closed)."""
    if charged is None:
        if test_mode:
            return
        raise ValueError(
            f"the charge for run {expected.run_id!r} records no key fingerprint; refusing to "
            "draw noise for a key the ledger does not bind to the run"
        )
    if charged != expected.key_fingerprint:  # fingerprints are not secret
        raise ValueError(f"this key is not the one charged for run {expected.run_id!r}")


# -- stream keys (made on the client, sent to tasks) ----------------------------------
def stream_identity(identity: MeasurementId | Mapping[str, Any] | tuple, run_id: str) -> dict:
    """The identity of the noise stream of a measurement in a run.

    ``{"run": run_id, "measurement": MeasurementId(...)}``: the stream
    :func:`measure` draws from, ``KeyedRNG(key, stream_identity(identity, run_id))``.
    """
    return {"run": _check_name(run_id, "run_id"), "measurement": _as_identity(identity)}


def stream_key(
    key: SecretKey | bytes, identity: MeasurementId | Mapping[str, Any] | tuple, run_id: str
) -> StreamKey:
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
        raise TypeError("a stream key cannot make other stream keys; pass the SecretKey")
    return as_secret_key(key).stream_key(stream_identity(identity, run_id))


# -- the measure step ----------------------------------------------------------------
def measure(
    plan: MeasurePlan,
    x: np.ndarray,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementId | Mapping[str, Any] | tuple,
    ledger: Ledger | Charge | None = None,
    run_id: str | None = None,
    *,
    dims: Sequence[str] | None = None,
    integer_noise: bool | None = None,
    test_mode: bool = False,
) -> np.ndarray:
    """Noisy answers ``A x + noise`` for one chunk of geographies.

    Parameters
    ----------
    plan : MeasurePlan
        ``strategy`` (``A``), ``mechanism``, ``noise_scale``, ``privacy`` (the budget
        this measurement charges) and ``domain`` (or ``None``).
    x : numpy.ndarray
        Counts of shape ``(g, *domain.shape)`` (or ``domain.shape`` for one
        geography); without a domain, ``(g, n)`` or ``(n,)``.
    key : SecretKey, bytes or StreamKey
        The release's secret key, or the :class:`~dpdask.noise.StreamKey` made from it
        for exactly this identity and run (:func:`stream_key`).
    identity : MeasurementId, mapping or 4-tuple
        ``(release, level, chunk, measurement)`` of this chunk.
    ledger : Ledger or Charge
        Where the charge is recorded (idempotently), or the receipt from
        :func:`charge_level`, which must carry this key's fingerprint. Required
        unless ``test_mode``.
    run_id : str
        The run; a retry of the same run draws the same noise and charges nothing.
        Required unless ``test_mode`` (where it defaults to ``"test"``).
    dims : sequence of str, optional
        Names of the attribute axes of ``x`` when they are not in domain order.
    integer_noise : bool or None
        The integer noise rule (module notes); ``None`` is the default rule.
    test_mode : bool
        Allow test-only keys (:meth:`SecretKey.for_testing`) and measuring
        without a ledger. Production code never sets it.

    Returns
    -------
    numpy.ndarray
        Shape ``(g, m)`` (or ``(m,)`` for one geography); int64 with integer noise,
        float64 otherwise.

    Raises
    ------
    TypeError, ValueError
        For a bad plan, key, identity or data (before anything is charged); for a
        stream key of another measurement or run; for a receipt charged for another
        key (or, outside test mode, for no key).
    dpdask.privacy.BudgetExceededError
        If the charge does not fit (before the data is read).
    """
    return _measure(
        plan, x, key, identity, ledger, run_id, dims, integer_noise, test_mode, answers=True
    )


def measurement_noise(
    plan: MeasurePlan,
    x: np.ndarray,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementId | Mapping[str, Any] | tuple,
    ledger: Ledger | Charge | None = None,
    run_id: str | None = None,
    *,
    dims: Sequence[str] | None = None,
    integer_noise: bool | None = None,
    test_mode: bool = False,
) -> np.ndarray:
    """The noise :func:`measure` adds to this chunk's answers, without computing them.

    Takes the same arguments, makes the same checks in the same order and charges
    the same way, and draws from the same keyed stream: for continuous noise,
    ``A x + measurement_noise(...)`` is bit for bit what :func:`measure` returns.
    For estimators that need only ``A^+ z`` (least squares with a strategy of full
    column rank: ``A^+ (A x + z) = x + A^+ z``), which saves the ``A x`` product.

    Returns
    -------
    numpy.ndarray
        Shape ``(g, m)`` (or ``(m,)`` for one geography).
    """
    return _measure(
        plan, x, key, identity, ledger, run_id, dims, integer_noise, test_mode, answers=False
    )


def _measure(
    plan: MeasurePlan,
    x: np.ndarray,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementId | Mapping[str, Any] | tuple,
    ledger: Ledger | Charge | None,
    run_id: str | None,
    dims: Sequence[str] | None,
    integer_noise: bool | None,
    test_mode: bool,
    *,
    answers: bool,
) -> np.ndarray:
    # 1. plan, key, identity (no data touched)
    if not isinstance(test_mode, bool):
        raise TypeError("test_mode must be a bool")
    secret = key if isinstance(key, StreamKey) else as_secret_key(key)
    if secret.test_only and not test_mode:
        raise ValueError("refusing a test-only key outside test mode")
    ident = _as_identity(identity)
    if run_id is None:
        if not test_mode:
            raise ValueError("run_id is required: it identifies the charge and the noise")
        run_id = "test"
    stream = stream_identity(ident, run_id)
    if isinstance(secret, StreamKey) and not secret.is_for(stream):
        raise ValueError(
            f"the stream key was made for another measurement or run, not {ident} of run "
            f"{run_id!r}; it can only draw its own stream"
        )
    # 2. calibration against the plan's privacy
    charge, A = _level_charge(
        plan, ident.release, run_id, ident.level, ident.measurement, secret.fingerprint()
    )
    # 3. budget, read-only, before reading the data
    if isinstance(ledger, Ledger):
        ledger.check(charge)  # refuses a run bound to another key
    elif isinstance(ledger, Charge):
        _check_receipt(ledger, charge, test_mode)
    elif ledger is None:
        if not test_mode:
            raise ValueError("a ledger (or the level's Charge) is required outside test mode")
    else:
        raise TypeError(f"ledger must be a Ledger or a Charge, got {type(ledger).__name__}")
    # 4. the data
    data, single = _check_data(x, A, plan.domain, dims)
    mech = noise_mechanism(plan, data.dtype, integer_noise)
    discrete = mech.startswith("discrete")
    if discrete:
        totals = data.reshape(data.shape[0], -1).sum(axis=1, dtype=np.float64)
        if totals.size and float(totals.max()) * max(_sensitivity(A, 1), 1.0) >= _MAX_EXACT:
            raise ValueError("counts too large for exact integer answers (above 2**53)")
    # 5. charge, durably, before any noise
    if isinstance(ledger, Ledger):
        ledger.charge(charge)
    # 6. answers and noise
    rng = KeyedRNG(secret, stream)
    if not answers:
        noise = rng.sample(mech, charge.noise_scale, (data.shape[0], A.shape[0]))
        return noise[0] if single else noise
    exact = np.asarray(A.apply(data), dtype=np.float64)
    if discrete:
        rounded = np.rint(exact)
        if not (np.array_equal(rounded, exact) and np.abs(rounded).max(initial=0) < _MAX_EXACT):
            raise ValueError("the answers are not exact integers; refusing integer noise")
        exact = rounded.astype(np.int64)
    noisy = exact + rng.sample(mech, charge.noise_scale, exact.shape)
    return noisy[0] if single else noisy
