"""Privacy budgets with exact arithmetic: pure DP, approximate DP and zCDP.

A budget is an immutable value. Its parameters are :class:`fractions.Fraction`,
so sums and splits are exact: ``sum(b.split(w)) == b`` for any positive weights.
Floats are accepted at construction and converted through their shortest
decimal representation (``0.1`` becomes ``1/10``, not the binary double
nearest to it); floats come out only where noise is calibrated.

Composition (``+``) is sequential composition:

* ``PureDP + PureDP -> PureDP`` (epsilons add),
* ``zCDP + zCDP -> zCDP`` (rhos add; Bun and Steinke 2016, Lemma 2.3),
* ``PureDP + zCDP -> zCDP`` (epsilon-DP implies ``epsilon**2 / 2``-zCDP, Prop. 1.4),
* ``ApproxDP + ApproxDP -> ApproxDP`` and ``PureDP + ApproxDP -> ApproxDP``
  (basic composition: epsilons and deltas add).

``zCDP + ApproxDP`` has no exact form and raises :class:`TypeError`. Parallel
composition over disjoint geographies of one level is :func:`parallel` (the
largest budget); the ledger applies it by charging a level once, not once per
chunk (see :class:`dpdask.privacy.Ledger`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import numpy as np

from dpdask.errors import BudgetTypeError, PlanError
from dpdask.privacy._convert import (
    _check_sensitivity,
    gaussian_delta,
    gaussian_max_privacy_cost,
    gaussian_sigma_for_cost,
    zcdp_epsilon,
)

__all__ = ["ApproxDP", "Budget", "PureDP", "as_fraction", "parallel", "zCDP"]

ExactNumber = int | Fraction | float | str | Decimal
B = TypeVar("B", bound="Budget")


def as_fraction(value: object, name: str = "value") -> Fraction:
    """Convert a number to an exact :class:`~fractions.Fraction`.

    Integers, fractions, decimals and decimal strings convert exactly; floats
    convert through their shortest ``repr`` (so ``0.1 -> 1/10``). Booleans,
    NaN and infinities raise.

    Raises
    ------
    TypeError
        For booleans and non-numbers.
    ValueError
        For NaN, infinities and unparsable strings.
    """
    if isinstance(value, bool | np.bool_):
        raise BudgetTypeError(f"{name} must be a number, not a boolean")
    if isinstance(value, Fraction | int | np.integer):
        return Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        if not math.isfinite(value):
            raise PlanError(f"{name} must be finite, got {value!r}")
        return Fraction(repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PlanError(f"{name} must be finite, got {value!r}")
        return Fraction(value)
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError) as exc:
            raise PlanError(f"{name}: cannot parse {value!r} as an exact number") from exc
    raise BudgetTypeError(f"{name} must be a number, got {type(value).__name__}")


def _float_up(q: Fraction) -> float:
    """The smallest float that is ``>= q``."""
    f = float(q)
    if Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def _float_down(q: Fraction) -> float:
    """The largest float that is ``<= q``."""
    f = float(q)
    if Fraction(f) > q:
        f = math.nextafter(f, -math.inf)
    return f


class Budget:
    """Base class of the privacy budgets (immutable, exact, composable)."""

    _fields: ClassVar[tuple[str, ...]] = ()

    # -- generic arithmetic on the fields ---------------------------------
    def _values(self) -> tuple[Fraction, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def _new(self: B, values: Iterable[Fraction]) -> B:
        return type(self)(*values)

    def _coerce(self, other: Budget) -> Budget:
        """``other`` expressed in this budget's definition, or ``TypeError``."""
        if type(other) is type(self):
            return other
        raise BudgetTypeError(
            f"cannot express {other!r} as {type(self).__name__} exactly; "
            "convert explicitly (e.g. zCDP.to_approx(delta))"
        )

    def __add__(self, other: object) -> Budget:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        if not isinstance(other, Budget):
            return NotImplemented
        try:
            o = self._coerce(other)
        except TypeError:
            s = other._coerce(self)  # the wider definition absorbs the narrower one
            return other._new(a + b for a, b in zip(s._values(), other._values(), strict=True))
        return self._new(a + b for a, b in zip(self._values(), o._values(), strict=True))

    def __radd__(self, other: object) -> Budget:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # so that sum(parts) works
        return NotImplemented

    def __sub__(self: B, other: Budget) -> B:
        """The budget left after spending ``other``; raises if ``other`` does not fit."""
        if not isinstance(other, Budget):
            return NotImplemented
        o = self._coerce(other)
        diff = [a - b for a, b in zip(self._values(), o._values(), strict=True)]
        if any(d < 0 for d in diff):
            raise PlanError(f"{other!r} exceeds {self!r}")
        return self._new(diff)

    def __mul__(self: B, k: object) -> B:
        if isinstance(k, Budget):
            return NotImplemented
        f = as_fraction(k, "multiplier")
        if f < 0:
            raise PlanError("a budget can only be scaled by a non-negative number")
        return self._new(v * f for v in self._values())

    __rmul__ = __mul__

    def __truediv__(self: B, k: object) -> B:
        f = as_fraction(k, "divisor")
        if f <= 0:
            raise PlanError("a budget can only be divided by a positive number")
        return self._new(v / f for v in self._values())

    def __le__(self, other: object) -> bool:
        """``a <= b``: spending ``a`` fits within ``b``."""
        if not isinstance(other, Budget):
            return NotImplemented
        mine = other._coerce(self)
        return all(a <= b for a, b in zip(mine._values(), other._values(), strict=True))

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return other.__le__(self)

    def split(self: B, weights: Sequence[ExactNumber] | int) -> list[B]:
        """Split into parts proportional to ``weights`` that sum exactly to this budget.

        Parameters
        ----------
        weights : sequence of numbers, or int
            Non-negative weights (at least one positive), or a count ``n`` for an
            even split into ``n`` parts.

        Returns
        -------
        list of budgets of this type; ``sum(parts) == self`` exactly.

        Examples
        --------
        >>> parts = zCDP("2.556").split([1, 2, 3])
        >>> sum(parts) == zCDP("2.556")
        True
        """
        if isinstance(weights, int | np.integer) and not isinstance(weights, bool):
            if weights < 1:
                raise PlanError("split into at least one part")
            w = [Fraction(1)] * int(weights)
        else:  # a sequence (a bool is not one: iterating it raises TypeError)
            w = [as_fraction(x, "weight") for x in cast("Sequence[ExactNumber]", weights)]
        if not w or any(x < 0 for x in w) or sum(w) == 0:
            raise PlanError("weights must be non-negative with a positive sum")
        total = sum(w)
        return [self._new(v * x / total for v in self._values()) for x in w]

    @property
    def is_zero(self) -> bool:
        """True when the budget allows no privacy loss."""
        return all(v == 0 for v in self._values())

    def zero(self: B) -> B:
        """The empty budget of this type."""
        return self._new(Fraction(0) for _ in self._fields)

    # -- serialisation -----------------------------------------------------
    def to_dict(self) -> dict[str, str]:
        """A JSON-safe exact representation (fractions as strings)."""
        out = {"type": type(self).__name__}
        out.update({f: str(v) for f, v in zip(self._fields, self._values(), strict=True)})
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Budget:
        """Inverse of :meth:`to_dict`."""
        kinds = {c.__name__: c for c in (PureDP, ApproxDP, zCDP)}
        kind = d.get("type")
        if kind not in kinds:
            raise PlanError(f"unknown budget type {kind!r}")
        cls = kinds[kind]
        return cls(*(d[f] for f in cls._fields))

    def __repr__(self) -> str:
        pairs = zip(self._fields, self._values(), strict=True)
        args = ", ".join(f"{f}={_show(v)}" for f, v in pairs)
        return f"{type(self).__name__}({args})"


def parallel(budgets: Iterable[Budget]) -> Budget:
    """Parallel composition: mechanisms on disjoint parts of the data (e.g. the
    geographies of one level) together cost the largest of their budgets.

    The budgets are expressed in the widest definition among them (pure DP is
    converted to zCDP or (epsilon, 0)-DP as needed) and the maximum is taken
    parameter by parameter.

    Examples
    --------
    >>> parallel([zCDP("0.5"), zCDP("0.25"), PureDP(1)])
    zCDP(rho=0.5)
    """
    items = list(budgets)
    if not items:
        raise PlanError("parallel composition of no budgets")
    for b in items:
        if not isinstance(b, Budget):
            raise BudgetTypeError(f"expected budgets, got {b!r}")
    wide = next((b for b in items if not isinstance(b, PureDP)), items[0])
    coerced = [wide._coerce(b) for b in items]
    return wide._new(max(vs) for vs in zip(*(c._values() for c in coerced), strict=True))


def _show(v: Fraction) -> str:
    if v.denominator == 1:
        return str(v.numerator)
    f = float(v)
    return repr(f) if Fraction(repr(f)) == v else f"Fraction('{v}')"


def _nonneg(value: object, name: str) -> Fraction:
    f = as_fraction(value, name)
    if f < 0:
        raise PlanError(f"{name} must be non-negative, got {value!r}")
    return f


@dataclass(frozen=True, eq=True, repr=False)
class PureDP(Budget):
    """Pure epsilon-differential privacy.

    Parameters
    ----------
    epsilon : int, Fraction, float, str or Decimal
        ``epsilon >= 0``, stored exactly.

    Examples
    --------
    >>> PureDP(1).laplace_scale(2.0)
    2.0
    >>> PureDP("0.5") + PureDP("0.25")
    PureDP(epsilon=0.75)
    """

    epsilon: Fraction
    _fields: ClassVar[tuple[str, ...]] = ("epsilon",)

    if TYPE_CHECKING:  # the dataclass's __init__ takes any exact number (__post_init__)

        def __init__(self, epsilon: ExactNumber) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _nonneg(self.epsilon, "epsilon"))

    def laplace_scale(self, l1_sensitivity: float) -> float:
        """Scale ``b = Delta_1 / epsilon`` of Laplace (or discrete Laplace) noise.

        Rounded up to the next float, so the mechanism never spends more than
        ``epsilon``.
        """
        d1 = _check_sensitivity(l1_sensitivity, "L1")
        if self.epsilon == 0:
            raise PlanError("cannot calibrate noise to a zero epsilon")
        return _float_up(Fraction(d1) / self.epsilon)

    def to_zcdp(self) -> zCDP:
        """``epsilon``-DP implies ``epsilon**2 / 2``-zCDP (Bun and Steinke 2016, Prop. 1.4)."""
        return zCDP(self.epsilon**2 / 2)

    def to_approx(self) -> ApproxDP:
        """The same guarantee as ``(epsilon, 0)``-DP."""
        return ApproxDP(self.epsilon, Fraction(0))


@dataclass(frozen=True, eq=True, repr=False)
class ApproxDP(Budget):
    """Approximate (epsilon, delta)-differential privacy.

    Composition is basic composition (both parameters add), which is exact
    arithmetic but not the tightest bound; use :class:`zCDP` for many
    Gaussian measurements and convert at the end.

    Parameters
    ----------
    epsilon, delta : int, Fraction, float, str or Decimal
        ``epsilon >= 0`` and ``0 <= delta < 1``.
    """

    epsilon: Fraction
    delta: Fraction
    _fields: ClassVar[tuple[str, ...]] = ("epsilon", "delta")

    if TYPE_CHECKING:  # the dataclass's __init__ takes any exact number (__post_init__)

        def __init__(self, epsilon: ExactNumber, delta: ExactNumber) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _nonneg(self.epsilon, "epsilon"))
        object.__setattr__(self, "delta", _nonneg(self.delta, "delta"))
        if self.delta >= 1:
            raise PlanError(f"delta must be below 1, got {self.delta}")

    def _coerce(self, other: Budget) -> Budget:
        if isinstance(other, PureDP):
            return other.to_approx()
        return super()._coerce(other)

    def max_privacy_cost(self) -> float:
        """The largest Gaussian privacy cost ``c`` this budget admits (Corollary 3.2 of 000).

        For correlated noise ``N(0, Sigma)`` on a basis ``B`` the cost is
        ``max_j sqrt(b_j^T Sigma^{-1} b_j)``; for i.i.d. noise it is ``Delta_2 / sigma``.
        """
        if self.delta == 0:
            raise PlanError("a Gaussian mechanism needs delta > 0")
        return gaussian_max_privacy_cost(_float_down(self.epsilon), _float_down(self.delta))

    def gaussian_sigma(self, l2_sensitivity: float) -> float:
        """The smallest sigma of the exact (analytic) Gaussian mechanism.

        Balle and Wang (2018), Theorem 8: ``N(0, sigma**2)`` noise on a query of L2
        sensitivity ``Delta_2`` is (epsilon, delta)-DP iff
        ``Phi(D/(2 s) - eps s/D) - exp(eps) Phi(-D/(2 s) - eps s/D) <= delta``.

        Examples
        --------
        >>> round(ApproxDP(1, 1e-5).gaussian_sigma(1.0), 4)
        3.7306
        """
        return gaussian_sigma_for_cost(l2_sensitivity, self.max_privacy_cost())

    def admits_gaussian(self, privacy_cost: float) -> bool:
        """Whether a Gaussian mechanism of this privacy cost fits in the budget."""
        if self.delta == 0:
            return privacy_cost == 0
        return gaussian_delta(privacy_cost, _float_down(self.epsilon)) <= _float_down(self.delta)


@dataclass(frozen=True, eq=True, repr=False)
class zCDP(Budget):
    """Zero-concentrated differential privacy (Bun and Steinke 2016).

    Parameters
    ----------
    rho : int, Fraction, float, str or Decimal
        ``rho >= 0``, stored exactly.

    Examples
    --------
    >>> round(zCDP(2.556).epsilon(1e-10), 3)
    17.143
    >>> PureDP(1) + zCDP("0.5")
    zCDP(rho=1)
    """

    rho: Fraction
    _fields: ClassVar[tuple[str, ...]] = ("rho",)

    if TYPE_CHECKING:  # the dataclass's __init__ takes any exact number (__post_init__)

        def __init__(self, rho: ExactNumber) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _nonneg(self.rho, "rho"))

    def _coerce(self, other: Budget) -> Budget:
        if isinstance(other, PureDP):
            return other.to_zcdp()
        return super()._coerce(other)

    def gaussian_sigma(self, l2_sensitivity: float) -> float:
        """``sigma = Delta_2 / sqrt(2 rho)``, rounded up (also for the discrete Gaussian).

        Checked exactly: the returned sigma satisfies ``Delta_2**2 / (2 sigma**2) <= rho``
        in rational arithmetic.
        """
        d2 = _check_sensitivity(l2_sensitivity, "L2")
        if self.rho == 0:
            raise PlanError("cannot calibrate noise to a zero rho")
        sigma = d2 / math.sqrt(2 * float(self.rho))
        while sigma > 0 and Fraction(d2) ** 2 / (2 * Fraction(sigma) ** 2) > self.rho:
            sigma = math.nextafter(sigma, math.inf)
        return sigma

    def max_privacy_cost(self) -> float:
        """``sqrt(2 rho)``, the Gaussian privacy cost this budget admits (rounded down)."""
        c = math.sqrt(2 * float(self.rho))
        while Fraction(c) ** 2 > 2 * self.rho:
            c = math.nextafter(c, 0.0)
        return c

    def epsilon(self, delta: float) -> float:
        """The tight epsilon at ``delta`` (Canonne, Kamath and Steinke 2020, Corollary 13)."""
        return zcdp_epsilon(_float_up(self.rho), delta)

    def to_approx(self, delta: ExactNumber) -> ApproxDP:
        """The (epsilon, delta)-DP guarantee implied at ``delta`` (epsilon rounded up)."""
        d = as_fraction(delta, "delta")
        return ApproxDP(Fraction(self.epsilon(_float_down(d))), d)
