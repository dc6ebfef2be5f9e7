"""Residual answers from records or marginal tables, never from a full data vector.

The residual strategy (:mod:`dpdask.strategy.residual`) reads, for each residual
``A``, the ``A``-marginal ``m_A`` of the data: a group-by count over the records'
codes of the attributes in ``A`` (``prod_{i in A} n_i`` cells, however wide the
table). From it come what a plan measures: ``H_A m_A`` (:func:`residual_rows`, the
rows of :class:`~dpdask.strategy.residual.ResidualPlan`'s strategy before their
weight) and the centred residual ``P_A m_A`` (:func:`residual_answer`). These are
the true answers; noise is the measure step's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.errors import ArgumentTypeError, DataError, DomainError, PlanError
from dpdask.measure._lattice import DEFAULT_MAX_TOTAL, Lattice
from dpdask.noise import MAX_TABLE_SCALE
from dpdask.strategy.residual import helmert, helmert_integer, helmert_scales

__all__ = [
    "marginal_counts",
    "measure_records",
    "reduce_table",
    "residual_answer",
    "residual_block",
    "residual_charge",
    "residual_evaluation_error",
    "residual_lattice",
    "residual_rows",
    "strategy_rows",
]


def _codes(records: Any, columns: Sequence[Any] | None) -> np.ndarray:
    if hasattr(records, "to_numpy") and hasattr(records, "columns"):  # a DataFrame
        cols = list(records.columns) if columns is None else list(columns)
        return np.asarray(records[cols].to_numpy())
    arr = np.asarray(records)
    if arr.ndim != 2:
        raise DataError(f"records must be a 2-D array of codes, got shape {arr.shape}")
    return arr if columns is None else arr[:, list(columns)]


def marginal_counts(
    records: Any,
    sizes: Sequence[int],
    attrs: Iterable[int],
    *,
    columns: Sequence[Any] | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The ``attrs``-marginal of records: integer counts of shape ``(n_i for i in attrs)``.

    Parameters
    ----------
    records : ndarray of shape (persons, d) or DataFrame
        Integer codes, one column per attribute of the domain (``0 .. n_i - 1``).
    sizes : sequence of int
        Attribute sizes ``n_i``.
    attrs : iterable of int
        The attributes kept (sorted; none gives the total).
    columns : sequence, optional
        The columns of ``records`` holding the ``d`` attributes, in domain order.
    weights : ndarray, optional
        A non-negative integer count per record (default 1).

    Raises
    ------
    ValueError
        If a code is outside its attribute's range or not an integer.

    Examples
    --------
    >>> marginal_counts(np.array([[0, 1], [1, 1], [0, 1]]), (2, 2), [1]).tolist()
    [0, 3]
    """
    sizes = tuple(int(n) for n in sizes)
    A = sorted({int(i) for i in attrs})
    codes = _codes(records, columns)
    if codes.shape[1] != len(sizes):
        raise DataError(f"records have {codes.shape[1]} columns, the domain {len(sizes)}")
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise DataError("record codes must be integers")
    shape = tuple(sizes[i] for i in A)
    sub = codes[:, A].astype(np.int64)
    if sub.size and (sub.min() < 0 or np.any(sub.max(axis=0) >= np.asarray(shape))):
        raise DataError(f"record codes outside the attribute ranges {shape}")
    flat = np.ravel_multi_index(tuple(sub.T), shape) if A else np.zeros(len(sub), np.int64)
    size = int(np.prod(shape)) if A else 1
    if weights is None:
        out = np.bincount(flat, minlength=size)
    else:
        w = np.asarray(weights)
        if w.shape != (len(sub),) or not np.issubdtype(w.dtype, np.integer) or np.any(w < 0):
            raise DataError("weights must be one non-negative integer per record")
        out = np.bincount(flat, weights=w, minlength=size).astype(np.int64)
    return out.reshape(shape)


def reduce_table(table: Any, table_attrs: Sequence[int], attrs: Iterable[int]) -> np.ndarray:
    """The ``attrs``-marginal of a marginal table over ``table_attrs`` (dense or ``sparse.COO``).

    ``attrs`` must be a subset of ``table_attrs``; the result is dense (a residual's
    marginal has ``prod_{i in A} n_i`` cells).
    """
    keep = sorted({int(i) for i in attrs})
    pos = {int(a): k for k, a in enumerate(table_attrs)}
    missing = [a for a in keep if a not in pos]
    if missing:
        raise DomainError(f"attributes {missing} are not axes of the table {tuple(table_attrs)}")
    drop = tuple(k for a, k in pos.items() if a not in keep)
    out = table.sum(axis=drop) if drop else table
    if hasattr(out, "todense"):
        out = out.todense()
    out = np.asarray(out)
    # the kept axes are now in table order; put them in sorted attribute order
    order = [a for a in table_attrs if int(a) in keep]
    return np.transpose(out, [order.index(a) for a in keep])


def residual_answer(marginal: np.ndarray) -> np.ndarray:
    """``P_A m_A``: the ``A``-marginal centred along every axis (the residual, exactly)."""
    out = np.asarray(marginal, dtype=float)
    for k in range(out.ndim):
        out = out - out.mean(axis=k, keepdims=True)
    return out


def residual_rows(marginal: np.ndarray) -> np.ndarray:
    """``H_A m_A``: the residual in the orthonormal Helmert basis, flat in C order."""
    out = np.asarray(marginal, dtype=float)
    for k in range(out.ndim):
        H = helmert(out.shape[k])
        out = np.moveaxis(np.tensordot(H, out, axes=([1], [k])), 0, k)
    return out.reshape(-1)


# -- measuring a residual plan from records (no strategy operator, no data vector) ------
def strategy_rows(plan: Any) -> int:
    """Rows of a residual plan's strategy: ``sum_A prod_{i in A} (n_i - 1)``."""
    W = plan.marginals
    return sum(math.prod(W.sizes[i] - 1 for i in A) for A in W.residual_sets())


def _gamma(n: int) -> float:
    u = 2.0**-53
    return n * u / (1.0 - n * u)


def residual_charge(
    plan: Any, release: str, run_id: str, level: str, measurement: str, key_fingerprint: str | None
) -> Any:
    """The charge of one level's residual measurement, checked, not recorded.

    As :func:`dpdask.measure.level_charge`, but the L2 sensitivity is the plan's closed
    form (every cell's column has norm ``sqrt(sum_A u_A prod_{i in A} (1 - 1/n_i))``),
    not a column-norm pass over a strategy operator with ``prod n_i`` columns.
    """
    from dpdask.privacy import Charge, check_calibration, check_name
    from dpdask.strategy.residual import ResidualPlan

    if not isinstance(plan, ResidualPlan):
        raise ArgumentTypeError(
            f"a residual measurement needs a ResidualPlan, got {type(plan).__name__}"
        )
    sens = float(plan.sensitivity)
    check_calibration(plan.mechanism, sens, float(plan.noise_scale), plan.privacy)
    return Charge(
        release=check_name(release, "release"),
        run_id=check_name(run_id, "run_id"),
        level=check_name(level, "level"),
        measurement=check_name(measurement, "measurement"),
        mechanism=plan.mechanism,
        sensitivity=sens,
        noise_scale=float(plan.noise_scale),
        privacy=plan.privacy,
        key_fingerprint=key_fingerprint,
    )


def residual_evaluation_error(plan: Any) -> float:
    """A bound ``e``: every computed row of :func:`residual_rows` times ``sqrt(u_A)``
    is within ``e ||x||_1`` of the exact product with the plan's stored doubles.

    The marginal ``m_A`` is an exact integer count; each Helmert factor is a dot product
    of length ``n_i`` (error at most ``gamma_{n_i} |H_i| |y|``, any summation order, FMA
    or not), then one rounding for ``sqrt(u_A)``. A Helmert row has absolute sum at most
    2, so ``(x)|H_i| |m_A| <= 2^{|A|} ||x||_1``, and the composed error is at most
    ``sqrt(u_A) ((1 + u) prod_i (1 + gamma_{n_i}) - 1) 2^{|A|} ||x||_1``; the bound is
    doubled for the rounding of ``sqrt(u_A)`` itself.
    """
    W = plan.marginals
    worst = 0.0
    for j, A in enumerate(W.residual_sets()):
        grow = 1.0 + 2.0**-53
        for i in A:
            grow *= 1.0 + _gamma(W.sizes[i])
        worst = max(worst, math.sqrt(plan.precision[j]) * (grow - 1.0) * 2.0 ** len(A))
    return 2.0 * worst


def residual_lattice(plan: Any, max_total: int = DEFAULT_MAX_TOTAL) -> Lattice:
    """The lattice of a residual plan's measurement from records (as :func:`lattice`).

    The rule of :mod:`dpdask.measure._lattice` with the plan's closed-form sensitivity,
    its row count and :func:`residual_evaluation_error` in place of the operator's.
    """
    from dpdask.measure._lattice import _check_max_total, _fits
    from dpdask.noise import grid_rule, grid_step, round_up

    max_total = _check_max_total(max_total)
    if plan.mechanism != "gaussian":
        raise PlanError(f"a residual plan adds Gaussian noise, not {plan.mechanism!r}")
    sens, scale = float(plan.sensitivity), float(plan.noise_scale)
    err = residual_evaluation_error(plan) * max_total
    k, sens_eff = grid_rule(strategy_rows(plan), 2, sens, scale, err)
    s_eff = round_up(Fraction(scale) * Fraction(sens_eff) / Fraction(sens))
    while not _fits("discrete_gaussian", sens_eff, s_eff, plan.privacy):
        s_eff = round_up(Fraction(s_eff) * Fraction(1025, 1024))
        if s_eff > 2.0**60:
            raise PlanError(f"no discrete Gaussian scale fits {plan.privacy!r}")
    grid = Fraction(s_eff) / grid_step(k)
    if grid > MAX_TABLE_SCALE:
        raise PlanError(f"noise scale {s_eff:g} is too large for the lattice sampler")
    return Lattice("discrete_gaussian", False, k, sens_eff, s_eff, grid)


def residual_block(plan: Any, units: np.ndarray, codes: np.ndarray, n_units: int) -> np.ndarray:
    """``sqrt(u_A) H_A m_A`` of every residual, per unit: shape ``(n_units, rows)``.

    ``units`` gives each record's unit (``0 .. n_units - 1``), ``codes`` its attribute
    codes; one group-by count per residual, never a data vector. Each ``H_i`` is applied
    as its integer rows (:func:`~dpdask.strategy.residual.helmert_integer`, exact in
    int64, O(n_i) per line) and then one product with the outer product of the row
    scales and ``sqrt(u_A)``: at most ``3 |A| + 3`` roundings of a value bounded by
    ``|H_A| m_A``, inside :func:`residual_evaluation_error`. Where the integers could
    overflow, the Helmert matrices are applied as floats instead.
    """
    W = plan.marginals
    sizes = (int(n_units), *W.sizes)
    units = np.asarray(units, np.int64)
    table = np.column_stack([units, np.asarray(codes, np.int64)])
    top = int(np.bincount(units, minlength=int(n_units)).max(initial=0)) if units.size else 0
    out = np.empty((int(n_units), strategy_rows(plan)))
    at = 0
    for j, A in enumerate(W.residual_sets()):
        counts = marginal_counts(table, sizes, [0, *(i + 1 for i in A)])
        root = math.sqrt(plan.precision[j])
        if top * math.prod(2 * max(W.sizes[i] - 1, 1) for i in A) < 2**62:
            m = counts.astype(np.int64)
            scale = np.full((), root)
            for k, i in enumerate(A):
                m = helmert_integer(m, k + 1)
                scale = np.multiply.outer(scale, helmert_scales(W.sizes[i]))
            rows = m.reshape(int(n_units), -1).astype(float)
            rows *= scale.reshape(-1)
        else:  # pragma: no cover - above 2**62 / 198**3 records in a unit
            f = counts.astype(float)
            for k, i in enumerate(A):
                f = np.moveaxis(np.tensordot(helmert(W.sizes[i]), f, axes=([1], [k + 1])), 0, k + 1)
            rows = root * f.reshape(int(n_units), -1)
        out[:, at : at + rows.shape[1]] = rows
        at += rows.shape[1]
    return out


def measure_records(
    plan: Any,
    units: np.ndarray,
    codes: np.ndarray,
    n_units: int,
    key: Any,
    identity: Any,
    receipt: Any,
    run_id: str,
    *,
    test_mode: bool = False,
    max_total: int = DEFAULT_MAX_TOTAL,
) -> np.ndarray:
    """Noisy rows of a residual plan for one chunk of units, from its records.

    The checks of :func:`dpdask.measure.measure` in its order (key and stream, the
    charge against ``receipt``, the data, the public bound on a unit's total), then
    ``sqrt(u_A) H_A m_A`` (:func:`residual_block`) on the lattice
    (:func:`residual_lattice`) plus discrete Gaussian noise from the chunk's stream.

    Parameters
    ----------
    plan : ResidualPlan
    units, codes : ndarray
        Each record's unit in the chunk and its attribute codes ``(records, d)``.
    n_units : int
        Units in the chunk (units without a record get rows of zeros plus noise).
    key : SecretKey or StreamKey
        The release's key or this chunk's stream key.
    identity : MeasurementId or 4-tuple
    receipt : Charge
        The level's recorded charge (:func:`residual_charge`, bound to the key).
    run_id : str
    test_mode : bool
        Allow a test-only key.

    Returns
    -------
    ndarray of shape (n_units, rows)
        Float64 multiples of the grid step.
    """
    from dpdask.errors import DataError, NoiseKeyError
    from dpdask.measure._charges import as_identity, check_receipt, stream_identity
    from dpdask.noise import KeyedRNG, StreamKey, as_secret_key

    secret = key if isinstance(key, StreamKey) else as_secret_key(key)
    if secret.test_only and not test_mode:
        raise NoiseKeyError("refusing a test-only key outside test mode")
    ident = as_identity(identity)
    stream = stream_identity(ident, run_id)
    if isinstance(secret, StreamKey) and not secret.is_for(stream):
        raise NoiseKeyError("the stream key was made for another measurement or run")
    charge = residual_charge(
        plan, ident.release, run_id, ident.level, ident.measurement, secret.fingerprint()
    )
    check_receipt(receipt, charge, test_mode)
    spec = residual_lattice(plan, max_total)
    units = np.asarray(units)
    codes = np.asarray(codes)
    if units.ndim != 1 or codes.ndim != 2 or codes.shape != (units.size, plan.marginals.d):
        raise DataError(f"records: {units.shape} units for codes of shape {codes.shape}")
    if units.size and (units.min() < 0 or units.max() >= n_units):
        raise DataError("records: a unit index outside the chunk")
    top = int(np.bincount(units, minlength=n_units).max(initial=0)) if units.size else 0
    if top > max_total:
        raise DataError(f"a unit holds {top} records, above the public bound {max_total}")
    grid = np.ldexp(residual_block(plan, units, codes, n_units), spec.k)
    np.rint(grid, out=grid)
    if np.abs(grid).max(initial=0.0) >= 2.0**52:
        raise DataError("counts too large for the lattice (grid answers above 2**52)")
    noisy = grid.astype(np.int64)
    del grid
    noisy += KeyedRNG(secret, stream).sample(spec.mechanism, spec.grid_scale, noisy.shape)
    out: np.ndarray = noisy.astype(np.float64)
    np.ldexp(out, -spec.k, out=out)
    return out
