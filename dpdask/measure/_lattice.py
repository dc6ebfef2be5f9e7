"""How the measure step realises a plan's noise: integer noise, exactly or on a lattice.

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
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpdask.errors import ArgumentTypeError, DataError, DataTypeError, DPDaskError, PlanError
from dpdask.linalg import evaluation_error
from dpdask.measure._checks import (
    MeasurePlan,
    cached_sensitivity,
    check_plan,
    has_integer_entries,
)
from dpdask.noise import (
    DEFAULT_MAX_TOTAL,
    MAX_TABLE_SCALE,
    SENSITIVITY_PAD,
    draw_variance,
    grid_rule,
    grid_step,
    round_up,
)
from dpdask.privacy import MECHANISM_NORM, ApproxDP, Budget, check_calibration

__all__ = ["DEFAULT_MAX_TOTAL", "Lattice", "lattice", "noise_mechanism"]

_DISCRETE = {"laplace": "discrete_laplace", "gaussian": "discrete_gaussian"}


def noise_mechanism(
    plan: MeasurePlan,
    dtype: npt.DTypeLike,
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
    dpdask.errors.DataTypeError
        If a discrete mechanism meets float data (a ``TypeError``).
    dpdask.errors.PlanError, dpdask.errors.DataError
        If integer noise is demanded or planned but the strategy is not integral (or
        the data not integer), or float noise is asked for without ``unsafe_float``
        (``ValueError`` both).
    """
    if not unsafe_float:
        if integer_noise is False:
            raise PlanError(
                "floating-point noise is not private as floating point; it needs "
                "unsafe_float=True (benchmarks only)"
            )
        return lattice(plan, dtype).mechanism
    A, mech, scale, privacy, _ = check_plan(plan)
    integer_data = np.issubdtype(np.dtype(dtype), np.integer)
    if mech.startswith("discrete"):
        if integer_noise is False:
            raise PlanError(f"the plan's mechanism {mech!r} is integer noise")
        if not integer_data:
            raise DataTypeError(f"{mech} noise needs integer counts, got dtype {np.dtype(dtype)}")
        if not has_integer_entries(A):
            raise PlanError(f"{mech} noise needs a strategy with integer entries")
        return mech
    if integer_noise is False:
        return mech
    candidate = _DISCRETE[mech]
    reason = None
    error: type[DPDaskError] = PlanError
    if not integer_data:
        reason, error = f"the data has dtype {np.dtype(dtype)}", DataError
    elif not has_integer_entries(A):
        reason = "the strategy has non-integer entries"
    else:
        try:
            sens = cached_sensitivity(A, MECHANISM_NORM[mech])
            check_calibration(candidate, sens, scale, privacy)
        except ValueError as exc:
            reason = str(exc)
    if reason is None:
        return candidate
    if integer_noise:
        raise error(f"cannot use integer noise: {reason}")
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

    @property
    def variance(self) -> float:
        """The variance of one measurement's noise in data units: the grid step squared
        times the integer sampler's variance at ``grid_scale``
        (:func:`dpdask.noise.draw_variance`), what published variances are made of."""
        return float(grid_step(self.k)) ** 2 * draw_variance(self.mechanism, self.grid_scale)


def _exact_integral_sensitivity(sens: float, p: int) -> float:
    """The least double at or above the exact norm of an integer column (``D``, ``p``)."""
    if p == 1 or sens > 2**24:
        return sens if p == 1 else round_up(Fraction(sens) * SENSITIVITY_PAD)
    square = round(sens * sens)
    root = math.sqrt(square)
    return root if Fraction(root) ** 2 >= square else math.nextafter(root, math.inf)


def _check_max_total(max_total: object) -> int:
    if isinstance(max_total, bool) or not isinstance(max_total, int | np.integer):
        raise ArgumentTypeError(f"max_total must be an integer, got {max_total!r}")
    if not 1 <= int(max_total) <= 2**52:
        raise PlanError(f"max_total must be between 1 and 2**52, got {max_total}")
    return int(max_total)


def _fits(mech: str, sens: float, scale: float, privacy: Budget) -> bool:
    try:
        check_calibration(mech, sens, scale, privacy)
    except ValueError:
        return False
    return True


def lattice(plan: MeasurePlan, dtype: npt.DTypeLike, max_total: int = DEFAULT_MAX_TOTAL) -> Lattice:
    """The lattice measurement of ``plan`` for data of ``dtype`` (module notes).

    Decided from the plan, the dtype and the public bound ``max_total`` on one
    geography's total (no data is read).

    Raises
    ------
    TypeError, ValueError
        If a discrete plan meets float data (:class:`~dpdask.errors.DataTypeError`) or
        a non-integer strategy, or no noise scale within the sampler's range fits the
        plan's privacy (:class:`~dpdask.errors.PlanError`), or the strategy's
        floating-point evaluation cannot be bounded.
    """
    A, mech, scale, privacy, _ = check_plan(plan)
    max_total = _check_max_total(max_total)
    integer_data = np.issubdtype(np.dtype(dtype), np.integer)
    integral = integer_data and has_integer_entries(A)
    if mech.startswith("discrete") and not integral:
        if not integer_data:
            raise DataTypeError(f"{mech} noise needs integer counts, got dtype {np.dtype(dtype)}")
        raise PlanError(f"{mech} noise needs a strategy with integer entries")
    disc = _DISCRETE.get(mech, mech)
    p = MECHANISM_NORM[mech]
    sens = cached_sensitivity(A, p)
    if integral:  # integer entries: D (L1) or D**2 (L2) is an integer, exact in float
        k, sens_eff = 0, _exact_integral_sensitivity(sens, p)
    else:  # the largest evaluation error of an answer: e * max_total
        k, sens_eff = grid_rule(A.shape[0], p, sens, scale, evaluation_error(A) * max_total)
    s_eff = round_up(Fraction(scale) * Fraction(sens_eff) / Fraction(sens))
    if not _fits(disc, sens_eff, s_eff, privacy):
        if not isinstance(privacy, ApproxDP):  # same ratio D'/s': cannot happen but rounding
            s_eff = math.nextafter(s_eff, math.inf)
        lo, hi = s_eff, s_eff
        while not _fits(disc, sens_eff, hi, privacy):
            lo, hi = hi, 2 * hi
            if hi > 2**60:
                raise PlanError(f"no {disc} noise scale fits the plan's privacy {privacy!r}")
        for _ in range(60):
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            lo, hi = (lo, mid) if _fits(disc, sens_eff, mid, privacy) else (mid, hi)
        s_eff = hi
    grid = Fraction(s_eff) / grid_step(k)
    if grid > MAX_TABLE_SCALE:
        raise PlanError(f"noise scale {s_eff:g} is too large for the lattice sampler")
    return Lattice(disc, integral, k, sens_eff, s_eff, grid)
