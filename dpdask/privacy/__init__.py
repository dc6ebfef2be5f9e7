"""Privacy budgets, conversions and the persistent budget ledger.

Budgets (:class:`PureDP`, :class:`ApproxDP`, :class:`zCDP`) are exact values
(:class:`fractions.Fraction` parameters) that compose with ``+`` and split
exactly; calibration methods turn them into noise scales. Conversions follow
Bun and Steinke (2016), Canonne, Kamath and Steinke (2020) and Balle and Wang
(2018). :class:`Ledger` is the persistent, append-only record of charges.
"""

from dpdask.privacy._budget import ApproxDP, Budget, PureDP, as_fraction, parallel, zCDP
from dpdask.privacy._convert import (
    gaussian_delta,
    gaussian_max_privacy_cost,
    zcdp_delta,
    zcdp_epsilon,
)
from dpdask.privacy._ledger import BudgetExceededError, Charge, Ledger, LedgerConflictError
from dpdask.privacy._mechanisms import check_calibration, mechanism_guarantee

__all__ = [
    "ApproxDP",
    "Budget",
    "BudgetExceededError",
    "Charge",
    "Ledger",
    "LedgerConflictError",
    "PureDP",
    "as_fraction",
    "check_calibration",
    "gaussian_delta",
    "gaussian_max_privacy_cost",
    "mechanism_guarantee",
    "parallel",
    "zCDP",
    "zcdp_delta",
    "zcdp_epsilon",
]
