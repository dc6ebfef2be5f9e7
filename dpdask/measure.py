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

Integer noise and the lattice. No release path adds floating-point noise
(Mironov 2012: ``x + Lap(b)`` in doubles has outputs impossible under a
neighbour). A plan's ``laplace`` / ``gaussian`` mechanism is realised as the exact
``discrete_laplace`` / ``discrete_gaussian`` (:mod:`dpdask.noise._table`), and:

* integer data with a strategy of integer entries (decided from the operator's
  structure, :func:`has_integer_entries`) is measured exactly: ``A x`` is an
  integer vector and the integer noise of the plan's scale is added (int64 result);
* float data, or a strategy with non-integer entries, is measured *on a lattice*
  of step ``h = 2**-k`` (:func:`lattice`): the computed answers ``f(x)`` are
  rounded to integers ``round(f(x) / h)``, integer noise of scale ``s / h`` is
  added, and the result times ``h`` is published (float64 grid points, exact).

Sensitivity on the lattice. Let ``x, x'`` be neighbours (one cell differs by 1)
and ``A_j`` the column of that cell. If every computed answer is within ``h / 2``
of the exact one, row ``i``'s grid answer moves by at most ``|A_ij| / h + 2``
(the exact answer moves by ``|A_ij|``; each of the two roundings and each of the
two evaluation errors moves it by less than half a step). So the grid answers have
L1 sensitivity at most ``D1 / h + 2 m`` and L2 sensitivity at most
``D2 / h + 2 sqrt(m)`` (triangle inequality with the vector of the ``+2`` terms),
``m`` the number of rows; in the data's units ``D' = D + c h`` with ``c = 2 m``
(L1) or ``2 sqrt(m)`` (L2). ``k`` is the least with ``c h <= D / 1024`` (at most
0.1% more noise), unless that would put the noise scale ``s / h`` above ``2**29``,
where ``k`` is capped (and the inflation is larger, still accounted). The noise
scale becomes ``s' = s D' / D`` (rounded up), so ``D' / s' <= D / s``: the
measurement's guarantee is at most the plan's, and :func:`check_calibration`
confirms ``(D', s')`` against the plan's privacy for the discrete mechanism (for an
(epsilon, delta) budget, where the discrete Gaussian is accounted through zCDP
(CKS), ``s'`` is raised further until it fits). The ledger is charged the plan's
privacy, which therefore bounds the measurement's loss.

Floating-point evaluation. The ``+2`` per row needs each computed answer
``f(x) = A.apply(x)`` within ``h / 2`` of the exact ``A x`` (of the strategy's
stored doubles). :func:`dpdask.linalg.evaluation_error` gives a rigorous bound
``e`` with ``|f(x)_i - (A x)_i| <= e ||x||_1`` (componentwise rounding-error
analysis of the operator's own algorithm), and every geography's total is at most
the public bound ``max_total`` (default :data:`DEFAULT_MAX_TOTAL`, ``2**33``, more
people than live on Earth; :func:`measure` refuses data above it before anything
is charged). So ``h`` is never finer than ``2 e max_total``: ``k`` is the least of
the slack rule above, this rule, and the noise-scale cap. The sensitivity itself
is computed in floating point (sums of at most a few million terms, relative
error below ``2**-24``), so ``D`` is padded by that factor before use, on every
path. No floating-point assumption is left on the release path.

``integer_noise`` is kept for compatibility: ``None`` and ``True`` give the rule
above; ``False`` (floating-point noise) needs ``unsafe_float=True``, which restores
the old float mechanism for benchmarks and is never set by a release.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
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
    evaluation_error,
)
from dpdask.noise import KeyedRNG, MeasurementId, SecretKey, StreamKey
from dpdask.noise._keys import as_secret_key
from dpdask.noise._table import MAX_TABLE_SCALE
from dpdask.privacy import ApproxDP, Budget, Charge, Ledger, check_calibration
from dpdask.privacy._mechanisms import MECHANISM_NORM

__all__ = [
    "DEFAULT_MAX_TOTAL",
    "Lattice",
    "MeasurePlan",
    "charge_level",
    "has_integer_entries",
    "lattice",
    "measure",
    "measurement_noise",
    "noise_mechanism",
    "stream_identity",
    "stream_key",
]

_DISCRETE = {"laplace": "discrete_laplace", "gaussian": "discrete_gaussian"}
_MAX_EXACT = 2.0**53
_LATTICE_SLACK = 1024  # target: the lattice adds at most D / 1024 to the sensitivity
_SENSITIVITY_PAD = Fraction(1) + Fraction(1, 2**24)  # float column norms, relative error
DEFAULT_MAX_TOTAL = 2**33  # public bound on one geography's total (module notes)
_MAX_GRID_SCALE = 2**29  # largest noise scale on the grid


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


def noise_mechanism(
    plan: MeasurePlan,
    dtype: Any,
    integer_noise: bool | None = None,
    *,
    unsafe_float: bool = False,
) -> str:
    """The sampler :func:`measure` uses for data of ``dtype`` (module notes).

    Parameters
    ----------
    plan : MeasurePlan
        The plan.
    dtype : numpy dtype
        The data's dtype (metadata only; no data is read).
    integer_noise : bool or None
        ``None`` or ``True``: integer noise (exact, or on a lattice, :func:`lattice`);
        ``False``: the plan's floating-point mechanism, only with ``unsafe_float``.
    unsafe_float : bool
        Allow floating-point noise (benchmarks): then the old rule applies, integer
        noise where the data and strategy are integral, the plan's float mechanism
        otherwise.

    Raises
    ------
    TypeError
        If a discrete mechanism meets float data.
    ValueError
        If integer noise is demanded or planned but the strategy is not integral, or
        float noise is asked for without ``unsafe_float``.
    """
    if not unsafe_float:
        if integer_noise is False:
            raise ValueError(
                "floating-point noise is not private as floating point; it needs "
                "unsafe_float=True (benchmarks only)"
            )
        return lattice(plan, dtype).mechanism
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


@dataclass(frozen=True)
class Lattice:
    """How :func:`measure` realises a plan's noise for data of one dtype (module notes).

    Attributes
    ----------
    mechanism : str
        ``"discrete_laplace"`` or ``"discrete_gaussian"``.
    exact : bool
        Integer data and integer strategy: answers exact, no grid (``k = 0``).
    k : int
        The grid step is ``2**-k``.
    sensitivity : float
        The sensitivity the noise is calibrated to (``D'``, data units).
    noise_scale : float
        The noise scale in data units (``s' >= s D' / D``).
    grid_scale : Fraction
        ``noise_scale * 2**k``: the integer sampler's exact parameter.
    """

    mechanism: str
    exact: bool
    k: int
    sensitivity: float
    noise_scale: float
    grid_scale: Fraction


def _step(k: int) -> Fraction:
    """The grid step ``2**-k`` as an exact fraction (``k`` may be negative)."""
    return Fraction(1, 2**k) if k >= 0 else Fraction(2 ** (-k))


def _exact_integral_sensitivity(sens: float, p: int) -> float:
    """The least double at or above the exact norm of an integer column (``D``, ``p``)."""
    if p == 1 or sens > 2**24:
        return sens if p == 1 else _up(Fraction(sens) * _SENSITIVITY_PAD)
    square = round(sens * sens)
    root = math.sqrt(square)
    return root if Fraction(root) ** 2 >= square else math.nextafter(root, math.inf)


def _check_max_total(max_total: Any) -> int:
    if isinstance(max_total, bool) or not isinstance(max_total, int | np.integer):
        raise TypeError(f"max_total must be an integer, got {max_total!r}")
    if not 1 <= int(max_total) <= 2**52:
        raise ValueError(f"max_total must be between 1 and 2**52, got {max_total}")
    return int(max_total)


def _up(value: Fraction) -> float:
    """The least double at or above ``value``."""
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def _fits(mech: str, sens: float, scale: float, privacy: Budget) -> bool:
    try:
        check_calibration(mech, sens, scale, privacy)
    except ValueError:
        return False
    return True


def lattice(plan: MeasurePlan, dtype: Any, max_total: int = DEFAULT_MAX_TOTAL) -> Lattice:
    """The lattice measurement of ``plan`` for data of ``dtype`` (module notes).

    Decided from the plan, the dtype and the public bound ``max_total`` on one
    geography's total (no data is read).

    Raises
    ------
    TypeError, ValueError
        If a discrete plan meets float data or a non-integer strategy, no noise
        scale within the sampler's range fits the plan's privacy, or the
        strategy's floating-point evaluation cannot be bounded.
    """
    A, mech, scale, privacy, _ = _check_plan(plan)
    max_total = _check_max_total(max_total)
    integer_data = np.issubdtype(np.dtype(dtype), np.integer)
    integral = integer_data and has_integer_entries(A)
    if mech.startswith("discrete") and not integral:
        if not integer_data:
            raise TypeError(f"{mech} noise needs integer counts, got dtype {np.dtype(dtype)}")
        raise ValueError(f"{mech} noise needs a strategy with integer entries")
    disc = _DISCRETE.get(mech, mech)
    p = MECHANISM_NORM[mech]
    sens = _sensitivity(A, p)
    padded = Fraction(sens) * _SENSITIVITY_PAD
    if integral:  # integer entries: D (L1) or D**2 (L2) is an integer, exact in float
        k, sens_eff = 0, _exact_integral_sensitivity(sens, p)
    else:
        m = A.shape[0]
        c = 2.0 * m if p == 1 else 2.0 * math.sqrt(m)
        k = max(0, math.ceil(math.log2(c * _LATTICE_SLACK / sens)))
        k = min(k, math.floor(math.log2(_MAX_GRID_SCALE / scale)))
        err = evaluation_error(A) * max_total  # largest evaluation error of an answer
        if err > 0:
            k = min(k, math.floor(-math.log2(2.0 * err)))
        while _step(k) < 2 * Fraction(err):  # log2 rounding
            k -= 1  # pragma: no cover
        sens_eff = _up(padded + Fraction(math.ceil(c * 2**20), 2**20) * _step(k))
    s_eff = _up(Fraction(scale) * Fraction(sens_eff) / Fraction(sens))
    if not _fits(disc, sens_eff, s_eff, privacy):
        if not isinstance(privacy, ApproxDP):  # same ratio D'/s': cannot happen but rounding
            s_eff = math.nextafter(s_eff, math.inf)
        lo, hi = s_eff, s_eff
        while not _fits(disc, sens_eff, hi, privacy):
            lo, hi = hi, 2 * hi
            if hi > 2**60:
                raise ValueError(f"no {disc} noise scale fits the plan's privacy {privacy!r}")
        for _ in range(60):
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            lo, hi = (lo, mid) if _fits(disc, sens_eff, mid, privacy) else (mid, hi)
        s_eff = hi
    grid = Fraction(s_eff) / _step(k)
    if grid > MAX_TABLE_SCALE:
        raise ValueError(f"noise scale {s_eff:g} is too large for the lattice sampler")
    return Lattice(disc, integral, k, sens_eff, s_eff, grid)


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
    unsafe_float: bool = False,
    max_total: int = DEFAULT_MAX_TOTAL,
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
        key (or, outside test mode, for no key).
    dpdask.privacy.BudgetExceededError
        If the charge does not fit (before the data is read).
    """
    return _measure(
        plan, x, key, identity, ledger, run_id, dims, integer_noise, test_mode, unsafe_float,
        answers=True, max_total=max_total,
    )  # fmt: skip


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
    x: np.ndarray,
    key: SecretKey | bytes | StreamKey,
    identity: MeasurementId | Mapping[str, Any] | tuple,
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
        raise TypeError("test_mode must be a bool")
    if not isinstance(unsafe_float, bool):
        raise TypeError("unsafe_float must be a bool")
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
    spec: Lattice | None = None
    if unsafe_float:
        mech = noise_mechanism(plan, data.dtype, integer_noise, unsafe_float=True)
        discrete = mech.startswith("discrete")
        scale: Any = charge.noise_scale
    else:
        spec = lattice(plan, data.dtype, max_total) if integer_noise is not False else None
        if spec is None:
            noise_mechanism(plan, data.dtype, integer_noise)  # raises
            raise AssertionError("unreachable")  # pragma: no cover
        mech, discrete, scale = spec.mechanism, spec.exact, spec.grid_scale
        if not answers and not spec.exact:
            raise ValueError(
                "on the lattice (float data or a non-integer strategy) the measurement is the "
                "rounded answers plus noise; the noise alone is not a post-processing of it"
            )
    totals = np.abs(data.reshape(data.shape[0], -1)).sum(axis=1, dtype=np.float64)
    top = float(totals.max()) if totals.size else 0.0
    pad = 1.0 if np.issubdtype(data.dtype, np.integer) else 1.0 + 2.0**-24  # float sums
    if spec is not None and not spec.exact and top * pad > max_total:
        raise ValueError(
            f"a geography's total {top:.6g} is above the public bound max_total = "
            f"{max_total} the lattice was sized for; raise max_total"
        )
    if discrete and top * max(_sensitivity(A, 1), 1.0) >= _MAX_EXACT:
        raise ValueError("counts too large for exact integer answers (above 2**53)")
    if spec is not None and not spec.exact:
        if top * _sensitivity(A, 1) * 2.0**spec.k >= 2.0**52:
            raise ValueError("counts too large for the lattice (grid answers above 2**52)")
    # 5. charge, durably, before any noise
    if isinstance(ledger, Ledger):
        ledger.charge(charge)
    # 6. answers and noise
    rng = KeyedRNG(secret, stream)
    if not answers:
        noise = rng.sample(mech, scale, (data.shape[0], A.shape[0]), unsafe_float=unsafe_float)
        return noise[0] if single else noise
    exact = np.asarray(A.apply(data), dtype=np.float64)
    if spec is not None and not spec.exact:
        grid = np.rint(np.ldexp(exact, spec.k))
        if np.abs(grid).max(initial=0) >= 2.0**52:  # pragma: no cover - checked above
            raise ValueError("grid answers above 2**52")
        noisy = grid.astype(np.int64) + rng.sample(mech, scale, grid.shape)
        if np.abs(noisy).max(initial=0) >= 2**53:
            raise ValueError("noisy grid answers above 2**53")  # pragma: no cover
        out = np.ldexp(noisy.astype(np.float64), -spec.k)
        return out[0] if single else out
    if discrete:
        rounded = np.rint(exact)
        if not (np.array_equal(rounded, exact) and np.abs(rounded).max(initial=0) < _MAX_EXACT):
            raise ValueError("the answers are not exact integers; refusing integer noise")
        exact = rounded.astype(np.int64)
    noisy = exact + rng.sample(mech, scale, exact.shape, unsafe_float=unsafe_float)
    return noisy[0] if single else noisy
