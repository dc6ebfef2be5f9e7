"""The measure step's entry points: :func:`measure` and :func:`measurement_noise`.

Both run the same checks in the same order (see :mod:`dpdask.measure`): plan, key
and identity; calibration; the budget, read-only; the data; the durable charge;
then the answers and the noise, drawn from the keyed stream
``KeyedRNG(key, stream_identity(identity, run_id))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, DataError, NoiseKeyError, PlanError
from dpdask.measure._charges import (
    MeasurementIdLike,
    as_identity,
    check_receipt,
    level_charge,
    stream_identity,
)
from dpdask.measure._checks import MeasurePlan, cached_sensitivity, check_data
from dpdask.measure._lattice import DEFAULT_MAX_TOTAL, Lattice, lattice, noise_mechanism
from dpdask.measure._rows import answers as row_answers
from dpdask.measure._rows import row_totals
from dpdask.noise import KeyedRNG, SecretKey, StreamKey, as_secret_key
from dpdask.privacy import Charge, Ledger

__all__ = ["measure", "measurement_noise"]

_MAX_EXACT = 2.0**53


# -- the measure step ----------------------------------------------------------------
def measure(
    plan: MeasurePlan,
    x: np.ndarray | Any,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementIdLike,
    ledger: Ledger | Charge | None = None,
    run_id: str | None = None,
    *,
    dims: Sequence[str] | None = None,
    integer_noise: bool | None = None,
    test_mode: bool = False,
    unsafe_float: bool = False,
    max_total: int = DEFAULT_MAX_TOTAL,
) -> np.ndarray:
    """Noisy answers ``A x + noise`` for one chunk of geographies.

    Parameters
    ----------
    plan : MeasurePlan
        ``strategy`` (``A``), ``mechanism``, ``noise_scale``, ``privacy`` (the budget
        this measurement charges) and ``domain`` (or ``None``).
    x : numpy.ndarray or sparse array
        Counts of shape ``(g, *domain.shape)`` (or ``domain.shape`` for one
        geography); without a domain, ``(g, n)`` or ``(n,)``. A sparse chunk
        (:class:`sparse.COO` or a SciPy sparse array of shape ``(g, n)``, flat cells in
        domain order) gives the same measurement as its dense form
        (:mod:`dpdask.measure._rows`).
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
    unsafe_float : bool
        Allow floating-point noise (``integer_noise=False``, or the old rule where
        the answers are not integers). Benchmarks only; no release sets it.

    Returns
    -------
    numpy.ndarray
        Shape ``(g, m)`` (or ``(m,)`` for one geography): int64 for exact integer
        answers, float64 multiples of ``2**-k`` on the lattice (:func:`lattice`),
        float64 with unsafe float noise.

    Raises
    ------
    TypeError, ValueError
        For a bad plan, key, identity or data (before anything is charged); for a
        stream key of another measurement or run; for a receipt charged for another
        key (or, outside test mode, for no key). Malformed counts raise
        :class:`~dpdask.errors.DataError` (:class:`~dpdask.errors.DataTypeError` when
        not a numeric array), a plan that cannot be used :class:`~dpdask.errors.PlanError`,
        a wrong, test-only or missing key :class:`~dpdask.errors.NoiseKeyError`.
    dpdask.privacy.BudgetExceededError
        If the charge does not fit (before the data is read).
    """
    return _measure(
        plan, x, key, identity, ledger, run_id, dims, integer_noise, test_mode, unsafe_float,
        answers=True, max_total=max_total,
    )  # fmt: skip


def measurement_noise(
    plan: MeasurePlan,
    x: np.ndarray | Any,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementIdLike,
    ledger: Ledger | Charge | None = None,
    run_id: str | None = None,
    *,
    dims: Sequence[str] | None = None,
    integer_noise: bool | None = None,
    test_mode: bool = False,
    unsafe_float: bool = False,
    max_total: int = DEFAULT_MAX_TOTAL,
) -> np.ndarray:
    """The noise :func:`measure` adds to this chunk's answers, without computing them.

    Takes the same arguments, makes the same checks in the same order and charges
    the same way, and draws from the same keyed stream: for continuous noise,
    ``A x + measurement_noise(...)`` is bit for bit what :func:`measure` returns.
    For estimators that need only ``A^+ z`` (least squares with a strategy of full
    column rank: ``A^+ (A x + z) = x + A^+ z``), which saves the ``A x`` product.
    Only for exact integer measurements (:attr:`Lattice.exact`) or unsafe float
    noise: on a lattice the published answers are rounded, so ``A x + z`` is not
    the measurement, and this raises ``ValueError``.

    Returns
    -------
    numpy.ndarray
        Shape ``(g, m)`` (or ``(m,)`` for one geography).
    """
    return _measure(
        plan, x, key, identity, ledger, run_id, dims, integer_noise, test_mode, unsafe_float,
        answers=False, max_total=max_total,
    )  # fmt: skip


def _measure(
    plan: MeasurePlan,
    x: np.ndarray | Any,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementIdLike,
    ledger: Ledger | Charge | None,
    run_id: str | None,
    dims: Sequence[str] | None,
    integer_noise: bool | None,
    test_mode: bool,
    unsafe_float: bool,
    *,
    answers: bool,
    max_total: int = DEFAULT_MAX_TOTAL,
) -> np.ndarray:
    # 1. plan, key, identity (no data touched)
    if not isinstance(test_mode, bool):
        raise ArgumentTypeError("test_mode must be a bool")
    if not isinstance(unsafe_float, bool):
        raise ArgumentTypeError("unsafe_float must be a bool")
    secret = key if isinstance(key, StreamKey) else as_secret_key(key)
    if secret.test_only and not test_mode:
        raise NoiseKeyError("refusing a test-only key outside test mode")
    ident = as_identity(identity)
    if run_id is None:
        if not test_mode:
            raise ArgumentError("run_id is required: it identifies the charge and the noise")
        run_id = "test"
    stream = stream_identity(ident, run_id)
    if isinstance(secret, StreamKey) and not secret.is_for(stream):
        raise NoiseKeyError(
            f"the stream key was made for another measurement or run, not {ident} of run "
            f"{run_id!r}; it can only draw its own stream"
        )
    # 2. calibration against the plan's privacy
    charge, A = level_charge(
        plan, ident.release, run_id, ident.level, ident.measurement, secret.fingerprint()
    )
    # 3. budget, read-only, before reading the data
    if isinstance(ledger, Ledger):
        ledger.check(charge)  # refuses a run bound to another key
    elif isinstance(ledger, Charge):
        check_receipt(ledger, charge, test_mode)
    elif ledger is None:
        if not test_mode:
            raise ArgumentError("a ledger (or the level's Charge) is required outside test mode")
    else:
        raise ArgumentTypeError(f"ledger must be a Ledger or a Charge, got {type(ledger).__name__}")
    # 4. the data
    data, single = check_data(x, A, plan.domain, dims)
    spec: Lattice | None = None
    if unsafe_float:
        mech = noise_mechanism(plan, data.dtype, integer_noise, unsafe_float=True)
        discrete = mech.startswith("discrete")
        scale: float | Fraction = charge.noise_scale
    else:
        spec = lattice(plan, data.dtype, max_total) if integer_noise is not False else None
        if spec is None:
            noise_mechanism(plan, data.dtype, integer_noise)  # raises
            raise AssertionError("unreachable")  # pragma: no cover
        mech, discrete, scale = spec.mechanism, spec.exact, spec.grid_scale
        if not answers and not spec.exact:
            raise PlanError(
                "on the lattice (float data or a non-integer strategy) the measurement is the "
                "rounded answers plus noise; the noise alone is not a post-processing of it"
            )
    totals = row_totals(data)
    top = float(totals.max()) if totals.size else 0.0
    pad = 1.0 if np.issubdtype(data.dtype, np.integer) else 1.0 + 2.0**-24  # float sums
    if spec is not None and not spec.exact and top * pad > max_total:
        raise DataError(
            f"a geography's total {top:.6g} is above the public bound max_total = "
            f"{max_total} the lattice was sized for; raise max_total"
        )
    if discrete and top * max(cached_sensitivity(A, 1), 1.0) >= _MAX_EXACT:
        raise DataError("counts too large for exact integer answers (above 2**53)")
    if spec is not None and not spec.exact:
        if top * cached_sensitivity(A, 1) * 2.0**spec.k >= 2.0**52:
            raise DataError("counts too large for the lattice (grid answers above 2**52)")
    # 5. charge, durably, before any noise
    if isinstance(ledger, Ledger):
        ledger.charge(charge)
    # 6. answers and noise
    rng = KeyedRNG(secret, stream)
    if not answers:
        noise = rng.sample(mech, scale, (data.shape[0], A.shape[0]), unsafe_float=unsafe_float)
        return _unbatch(noise, single)
    exact = row_answers(A, data)
    if spec is not None and not spec.exact:
        # in place where it can be: a chunk's answers can be hundreds of MB, and each
        # temporary copy of them counts against the worker's memory limit
        grid = np.ldexp(exact, spec.k)
        del exact
        np.rint(grid, out=grid)
        if _max_abs(grid) >= 2.0**52:  # pragma: no cover - checked above
            raise DataError("grid answers above 2**52")
        noisy = grid.astype(np.int64)
        del grid
        noisy += rng.sample(mech, scale, noisy.shape)
        if _max_abs(noisy) >= 2**53:
            raise DataError("noisy grid answers above 2**53")  # pragma: no cover
        out = noisy.astype(np.float64)
        del noisy
        np.ldexp(out, -spec.k, out=out)
        return _unbatch(out, single)
    if discrete:
        rounded = np.rint(exact)
        if not (np.array_equal(rounded, exact) and np.abs(rounded).max(initial=0) < _MAX_EXACT):
            raise PlanError("the answers are not exact integers; refusing integer noise")
        exact = rounded.astype(np.int64)
    noisy = exact + rng.sample(mech, scale, exact.shape, unsafe_float=unsafe_float)
    return _unbatch(noisy, single)


def _max_abs(values: np.ndarray) -> float:
    """``max |values|`` (0 when empty) without an array of absolute values."""
    if values.size == 0:
        return 0.0
    return float(max(abs(float(values.max())), abs(float(values.min()))))


def _unbatch(values: np.ndarray, single: bool) -> np.ndarray:
    """The one geography's row if the chunk was one geography, else all rows."""
    out: np.ndarray = values[0] if single else values
    return out
